"""megamoe: the fused expert-parallel MoE layer for Hopper.

    layer = megamoe.MegaMoE(weights, max_tokens_per_rank=T_max, topk=K)   # weights: ExpertWeights / MoEWeights
    y = layer(x_bf16, topk_idx, topk_w)                                    # torch.ops.megamoe.moe_forward
"""
from .weights import ExpertWeights, local_experts  # noqa: F401
from .layer import MegaMoE  # noqa: F401
from .checkpoint import CheckpointError, load_experts  # noqa: F401

__all__ = ["MegaMoE", "ExpertWeights", "local_experts", "load_experts", "CheckpointError"]
