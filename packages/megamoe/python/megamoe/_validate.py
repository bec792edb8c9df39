"""Host-side checks of MegaMoE's arguments. Pure functions over tensor metadata (work on CPU, meta and
fake tensors too): every error names the argument and is raised before anything is launched, so a
rejected call leaves the layer as it was."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BACKENDS = ("staged", "fused", "auto")


@dataclass(frozen=True)
class LayerConfig:
    num_experts: int
    hidden: int
    intermediate: int
    topk: int
    max_tokens: int
    device: torch.device


def check_layer_args(*, max_tokens_per_rank, topk, activation_clamp, backend, timeout_s) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if isinstance(max_tokens_per_rank, bool) or not isinstance(max_tokens_per_rank, int) or max_tokens_per_rank < 1:
        raise ValueError(f"max_tokens_per_rank: {max_tokens_per_rank!r} must be an int >= 1")
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= 32:
        raise ValueError(f"topk: {topk!r} must be an int in [1, 32]")
    try:
        c = float(activation_clamp)
    except (TypeError, ValueError):
        raise TypeError(f"activation_clamp: expected a float, got {type(activation_clamp).__name__}") from None
    if math.isnan(c) or c < 0:
        raise ValueError(f"activation_clamp: {activation_clamp!r} must be >= 0 (inf for no clamp)")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s: {timeout_s!r} must be a number > 0")


def _contiguous(t: torch.Tensor) -> bool:
    return t.numel() == 0 or t.is_contiguous()


def check_forward(cfg: LayerConfig, x, topk_idx, topk_w) -> int:
    """Checks dtype, shape, device and contiguity of one forward call's inputs; returns T."""
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_w", topk_w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: expected dtype torch.bfloat16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] != cfg.hidden:
        raise ValueError(f"x: expected shape [T, {cfg.hidden}] (T tokens, hidden {cfg.hidden}), got {list(x.shape)}")
    T = x.shape[0]
    if T > cfg.max_tokens:
        raise ValueError(f"x: {T} tokens > max_tokens_per_rank {cfg.max_tokens} of the layer")
    if topk_idx.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_idx: expected dtype torch.int32 or torch.int64, got {topk_idx.dtype}")
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T:
        raise ValueError(f"topk_idx: expected shape [T={T}, topk={cfg.topk}], got {list(topk_idx.shape)}")
    if topk_idx.shape[1] != cfg.topk:
        raise ValueError(f"topk_idx: {topk_idx.shape[1]} experts per token != the layer's topk {cfg.topk}")
    if topk_w.dtype != torch.float32:
        raise TypeError(f"topk_w: expected dtype torch.float32, got {topk_w.dtype}")
    if tuple(topk_w.shape) != tuple(topk_idx.shape):
        raise ValueError(f"topk_w: expected shape {list(topk_idx.shape)} (as topk_idx), got {list(topk_w.shape)}")
    for name, t in (("x", x), ("topk_idx", topk_idx), ("topk_w", topk_w)):
        if t.device != cfg.device:
            raise ValueError(f"{name}: on {t.device}, but the layer lives on {cfg.device}")
        if not _contiguous(t):
            raise ValueError(f"{name}: must be contiguous (shape {list(t.shape)}, strides {list(t.stride())}); "
                             "call .contiguous()")
    return T


def check_ids(topk_idx: torch.Tensor, num_experts: int) -> None:
    """Ids outside [-1, num_experts) -> ValueError naming the first one. One device -> host sync."""
    if topk_idx.numel() == 0:
        return
    mm = torch.stack(torch.aminmax(topk_idx)).tolist()  # the one synchronisation
    if -1 <= mm[0] and mm[1] < num_experts:
        return
    bad = ((topk_idx < -1) | (topk_idx >= num_experts)).flatten().nonzero()
    i = int(bad[0])
    K = topk_idx.shape[1]
    v = int(topk_idx.flatten()[i])
    raise ValueError(f"topk_idx: expert id {v} at [{i // K}, {i % K}] is outside [-1, {num_experts}) "
                     f"({bad.numel()} bad entries; -1 = no expert)")
