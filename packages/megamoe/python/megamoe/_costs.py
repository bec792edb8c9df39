"""The benchmark's cost model (DESIGN.md section 6): presets, FLOPs, HBM and NVLink bytes per rank,
the floor with its binding term, and the seeded routing / token draws. Pure functions of the shapes
and the routing; the GPU benchmarks (bench/*.py) and megamoe-bench import them from here or bench."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import X_GRAN

@dataclass(frozen=True)
class Shape:
    H: int
    I: int
    E: int
    K: int


PRESETS = {
    "tiny": Shape(H=512, I=256, E=16, K=4),  # seconds on CPU
    "flash": Shape(H=4096, I=2048, E=256, K=6),
    "pro": Shape(H=7168, I=3072, E=384, K=6),
}

# H200 ceilings measured for DESIGN.md section 6 (not by this program): pass --peaks to use
# numbers measured in the same run.
DEFAULT_PEAKS = {"fp8_tflops": 1350.0, "hbm_tbs": 4.2, "nvlink_gbs": 380.0}

MX_GROUP = 32                        # weights per int8 shift
WEIGHT_BITS = 4 + 8 / MX_GROUP       # E2M1 code + its share of the shift byte (row scales ~0)
BF16_BYTES, FP32_BYTES = 2, 4
MATMULS = 3                          # gate, up (2I rows of W1 = two H x I matmuls) and down
BACKENDS = ("reference", "staged", "fused", "auto", "torch-fp8", "torch-bf16")
# The backends that run with fewer GPUs than ranks (symm_comm's time-sliced CUDA IPC placement).
SLICED_BACKENDS = ("staged", "fused", "auto")


# --- metrics --------------------------------------------------------------------------------------

def count_flops(pairs: int, H: int, I: int) -> int:
    """Multiply-adds x 2 of the expert MLPs over routed (token, expert) pairs."""
    return MATMULS * 2 * pairs * H * I


def hbm_bytes(touched_experts: int, tokens: int, H: int, I: int) -> float:
    """Bytes one rank must move through HBM at least: its touched experts' MXFP4 weights (each read
    once) plus the layer's BF16 input and output rows. The dispatch pool and L1/L2 intermediates are
    left out (they may stay on chip), so this is a lower bound."""
    return touched_experts * MATMULS * H * I * WEIGHT_BITS / 8 + tokens * H * 2 * BF16_BYTES


def nvlink_bytes(dispatched: int, combined: int, H: int) -> int:
    """Bytes over NVLink in one direction: dispatched pairs carry an FP8 row, its FP32 scales and the
    FP32 top-k weight; combined pairs carry a BF16 output row."""
    return dispatched * (H + H // X_GRAN * FP32_BYTES + FP32_BYTES) + combined * H * BF16_BYTES


def floor_time(flops: float, hbm: float, nvlink: float, peaks: dict) -> tuple[float, str]:
    """(seconds, binding term) = max(FLOPs / FP8 peak, HBM bytes / HBM bw, NVLink bytes / peer bw)."""
    terms = {"fp8": flops / (peaks["fp8_tflops"] * 1e12),
             "hbm": hbm / (peaks["hbm_tbs"] * 1e12),
             "nvlink": nvlink / (peaks["nvlink_gbs"] * 1e9)}
    bound = max(terms, key=terms.get)
    return terms[bound], bound


@dataclass
class RankCost:
    pairs: int      # pairs whose expert this rank owns (its GEMM work)
    flops: int
    hbm: float
    nvlink: int     # max of bytes sent and received (links are per direction)


def rank_costs(topk_idx: torch.Tensor, ranks: int, shape: Shape) -> list[RankCost]:
    """Per-rank work for global routing topk_idx [ranks * T, K] (rank r holds tokens [rT, (r+1)T)
    and experts [r E/R, (r+1) E/R))."""
    T = topk_idx.shape[0] // ranks
    valid = topk_idx >= 0
    src = (torch.arange(topk_idx.shape[0]) // T).unsqueeze(1).expand_as(topk_idx)[valid]
    expert = topk_idx[valid]
    dst = expert // (shape.E // ranks)
    costs = []
    for r in range(ranks):
        mine, local = dst == r, src == r
        pairs = int(mine.sum())
        sent = nvlink_bytes(int((local & ~mine).sum()), int((mine & ~local).sum()), shape.H)
        received = nvlink_bytes(int((mine & ~local).sum()), int((local & ~mine).sum()), shape.H)
        costs.append(RankCost(pairs, count_flops(pairs, shape.H, shape.I),
                              hbm_bytes(len(torch.unique(expert[mine])), T, shape.H, shape.I),
                              max(sent, received)))
    return costs


# --- inputs ---------------------------------------------------------------------------------------

def make_routing(tokens: int, shape: Shape, seed: int):
    """Global top-k over `tokens` tokens: K distinct uniform experts per token, softmax weights."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens, shape.E, generator=gen).topk(shape.K, dim=1).indices
    w = torch.randn(tokens, shape.K, generator=gen).softmax(dim=1)
    return idx, w


def _rank_tokens(tokens: int, H: int, seed: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)  # distinct stream per rank
    return torch.randn(tokens, H, generator=gen).bfloat16()


# --- backends and the decode target ---------------------------------------------------------------

TORCH_BASELINES = {"torch-fp8": "fp8", "torch-bf16": "bf16"}
TARGET_TOKENS = (1, 16)              # the decode target (1..16 tokens): time <= 1.3 x HBM floor + 25 us
TARGET_FACTOR, TARGET_SLACK_US = 1.3, 25.0
