"""What a Hopper user would run instead of megamoe (torch ops only), and fast synthetic weights.

torch-fp8: x quantised to FP8 per token (one FP32 scale per row), the (token, k) pairs sorted by
expert on the GPU (argsort), rows gathered into one buffer grouped by expert, W1 through
`torch._scaled_grouped_mm` (FP8 x FP8, rowwise scales; FP8 weights [E, 2I, H] with one scale per
row), SwiGLU x top-k weight in torch, re-quantised to FP8 per row, W2 through
`torch._scaled_grouped_mm`, then scatter-added back in FP32 (index_add_) and cast to BF16.
torch-bf16: the same with BF16 weights and activations through `torch._grouped_mm`.

Single rank: static shapes only (worst-case buffer rows, group sizes computed on the device), no
host sync, so a call can be captured in a CUDA graph. Groups are padded to GROUP_ALIGN_ROWS rows
(older PyTorch asserted 16-byte aligned group starts in the grouped GEMMs; the padding costs the
baseline < 16 rows per touched expert, under 4 % of the rows at 8192 tokens x top-6 over 256 experts).
Multi-rank (torch_moe_distributed): NCCL all_to_all_single with host-known splits (one host sync
per call): eager only.

make_fp4_experts builds realistic fp4_gemm TransformedWeights directly on the device in seconds
(megamoe.reference.make_weights builds FP64 copies and is far too slow for the real presets).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .reference import _all_to_all  # the one row exchange over all_to_all_single
from fp4_gemm.numerics import (MAX_SHIFT, MIN_EXACT_SHIFT, MIN_SHIFT, MX_GROUP, TransformedWeights,
                               quantize_mxfp4, transform_weights)

__all__ = ["DenseExperts", "GROUP_ALIGN_ROWS", "group_layout", "make_dense_experts", "torch_moe",
           "torch_moe_distributed", "shift_distribution", "make_fp4_experts", "quantize_rowwise"]

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_AMAX = 1e-10
GROUP_ALIGN_ROWS = {"fp8": 16, "bf16": 8}  # 16 bytes of a row-major A's rows: 16 FP8 / 8 BF16 rows
FP8_WEIGHT_GAIN = 64.0  # FP8 weights hold N(0, 1) * 64 (|w| < 448 at 7 sigma); the row scale undoes it


# --- weights --------------------------------------------------------------------------------------

@dataclass
class DenseExperts:
    """Experts `experts` (global ids, contiguous) of a layer with `num_experts` experts, as a torch
    user would hold them: W1 [E_local, 2I, H] (gate rows, then up rows) and W2 [E_local, H, I], FP8
    with one FP32 scale per output row (kind "fp8") or BF16 without scales (kind "bf16")."""
    kind: str
    num_experts: int
    experts: range
    w1: torch.Tensor
    w2: torch.Tensor
    s1: torch.Tensor | None = None  # FP32 [E_local, 2I]
    s2: torch.Tensor | None = None  # FP32 [E_local, H]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w2.shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w1, self.w2, self.s1, self.s2) if t is not None)


def dense_weight_bytes(kind: str, experts: int, H: int, I: int) -> int:
    """Bytes make_dense_experts allocates (for memory checks before allocating)."""
    per = 3 * H * I * (1 if kind == "fp8" else 2)
    scales = (2 * I + H) * 4 if kind == "fp8" else 0
    return experts * (per + scales)


def make_dense_experts(kind: str, num_experts: int, experts: range, H: int, I: int, *, device="cuda",
                       seed: int = 0, chunk: int = 8) -> DenseExperts:
    """Gaussian experts N(0, 1/fan_in), built `chunk` experts at a time on `device`."""
    if kind not in GROUP_ALIGN_ROWS:
        raise ValueError(f"kind must be one of {sorted(GROUP_ALIGN_ROWS)}, got {kind!r}")
    E = len(experts)
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = FP8 if kind == "fp8" else torch.bfloat16
    w1 = torch.empty(E, 2 * I, H, dtype=dt, device=device)
    w2 = torch.empty(E, H, I, dtype=dt, device=device)
    for w, fan_in in ((w1, H), (w2, I)):
        for e0 in range(0, E, chunk):
            part = w[e0:e0 + chunk]
            if kind == "bf16":
                part.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
            else:
                tmp = torch.randn(part.shape, dtype=torch.bfloat16, device=device, generator=gen)
                part.copy_((tmp * FP8_WEIGHT_GAIN).clamp_(-FP8_MAX, FP8_MAX).to(FP8))
                del tmp
    s1 = s2 = None
    if kind == "fp8":
        s1 = torch.full((E, 2 * I), 1.0 / (FP8_WEIGHT_GAIN * math.sqrt(H)), device=device)
        s2 = torch.full((E, H), 1.0 / (FP8_WEIGHT_GAIN * math.sqrt(I)), device=device)
    return DenseExperts(kind, num_experts, experts, w1, w2, s1, s2)


def shift_distribution(K: int, *, rows: int = 256, device="cpu", seed: int = 0):
    """(probabilities over shifts MIN_SHIFT..MAX_SHIFT, FP32 row scales) of Gaussian N(0, 1/K)
    weights [rows, K] through the real MXFP4 quantiser and transform (fp4_gemm.numerics)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(rows, K, generator=gen, device=device) / math.sqrt(K)
    tw = transform_weights(*quantize_mxfp4(w))
    counts = torch.bincount(tw.shift.flatten().long() - MIN_SHIFT, minlength=MAX_SHIFT - MIN_SHIFT + 1)
    return counts.double() / counts.sum(), tw.row_scale


_LUT_SIZE = 4096


def _shift_lut(probs: torch.Tensor, device) -> torch.Tensor:
    """int8 [_LUT_SIZE]: shift by uniform bucket (inverse CDF), so lut[randint(size)] ~ probs."""
    cdf = torch.cumsum(probs.double().cpu(), 0)
    u = (torch.arange(_LUT_SIZE, dtype=torch.float64) + 0.5) / _LUT_SIZE
    idx = torch.searchsorted(cdf, u).clamp_max(len(probs) - 1)
    return (idx + MIN_SHIFT).to(torch.int8).to(device)


def _sample_transformed(G: int, N: int, K: int, lut: torch.Tensor, row_scales: torch.Tensor,
                        gen: torch.Generator, interleave: bool, chunk: int) -> TransformedWeights:
    device = lut.device
    codes = torch.empty(G, N, K // 2, dtype=torch.uint8, device=device)
    codes.random_(0, 256, generator=gen)  # uniform E2M1 nibbles
    shift = torch.empty(G, N, K // MX_GROUP, dtype=torch.int8, device=device)
    for g0 in range(0, G, chunk):
        part = shift[g0:g0 + chunk]
        r = torch.randint(0, _LUT_SIZE, part.shape, device=device, generator=gen)
        part.copy_(lut[r])
        del r
        # every row has its largest group at MAX_SHIFT, as the transform guarantees
        col = torch.randint(0, K // MX_GROUP, (*part.shape[:-1], 1), device=device, generator=gen)
        part.scatter_(-1, col, MAX_SHIFT)
    pick = torch.randint(0, row_scales.numel(), (G, N), device=device, generator=gen)
    row_scale = row_scales.to(device).float()[pick].contiguous()
    n_clamped = int((shift < MIN_EXACT_SHIFT).sum())
    return TransformedWeights(codes, shift, row_scale, n_clamped, interleave)


def make_fp4_experts(experts: int, H: int, I: int, *, device="cuda", seed: int = 0, chunk: int = 16):
    """(tw1 [experts, 2I, H] gate/up interleaved, tw2 [experts, H, I]): random E2M1 codes, per-32
    shifts drawn from what the real transform gives for Gaussian weights (shift_distribution, per
    fan-in), power-of-two row scales drawn from the same sample. Seconds for the pro preset."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for N, K, interleave in ((2 * I, H, True), (H, I, False)):
        probs, scales = shift_distribution(K, device=device, seed=seed + K)
        out.append(_sample_transformed(experts, N, K, _shift_lut(probs, device), scales, gen, interleave, chunk))
    return out[0], out[1]


def fp4_weight_bytes(experts: int, H: int, I: int) -> int:
    """Bytes make_fp4_experts allocates: codes + shifts + row scales."""
    return experts * (3 * H * I // 2 + 3 * H * I // MX_GROUP + (2 * I + H) * 4)


# --- the baseline layer ---------------------------------------------------------------------------

def quantize_rowwise(x: torch.Tensor):
    """BF16/FP32 [M, N] -> (E4M3 [M, N], FP32 [M]): one scale per row, amax / 448."""
    s = x.abs().amax(dim=-1, keepdim=True).float().clamp_min(MIN_AMAX) / FP8_MAX
    q = (x.float() / s).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return q, s.squeeze(-1)


def group_layout(expert: torch.Tensor, num_groups: int, align: int):
    """Static-shape grouping of pairs by expert, on the device, without a host sync.

    expert: int64 [P], local expert ids in [0, num_groups]; num_groups marks a dropped pair.
    Returns (order, dest, offs_end, rows): order int64 [P] sorts the pairs by expert (stable);
    sorted pair i goes to buffer row dest[i]; group g occupies rows [offs_end[g-1], offs_end[g])
    (int32 [num_groups], cumulative END offsets, each group padded to a multiple of `align` rows);
    dropped pairs land after offs_end[-1]; rows = the buffer's static row count, enough for any
    routing of P pairs."""
    P = expert.numel()
    order = torch.argsort(expert, stable=True)
    se = expert[order]
    counts = torch.zeros(num_groups + 1, dtype=torch.int64, device=expert.device)
    counts.scatter_add_(0, expert, torch.ones_like(expert))
    padded = (counts + (align - 1)) // align * align
    padded[num_groups] = counts[num_groups]  # dropped pairs are not padded
    start = torch.cumsum(counts, 0) - counts
    pstart = torch.cumsum(padded, 0) - padded
    dest = pstart[se] + (torch.arange(P, device=expert.device) - start[se])
    offs_end = torch.cumsum(padded[:num_groups], 0).to(torch.int32)
    rows = P + (align - 1) * min(P, num_groups)
    return order, dest, offs_end, rows


def _grouped(kind: str, a, sa, w, sw, offs):
    if kind == "fp8":
        return torch._scaled_grouped_mm(a, w.transpose(-2, -1), sa, sw, offs=offs, out_dtype=torch.bfloat16)
    return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)


def _expert_rows(W: DenseExperts, src, src_scale, src_idx, pair_w, expert) -> torch.Tensor:
    """Pairs (rows src[src_idx], FP32 top-k weight pair_w [N], local expert [N], len(W.experts) =
    dropped) through their experts -> BF16 [N, H] in pair order (dropped pairs: undefined rows)."""
    E, H, I = len(W.experts), W.hidden, W.intermediate
    align = GROUP_ALIGN_ROWS[W.kind]
    order, dest, offs, rows = group_layout(expert, E, align)
    N = expert.numel()
    pos = torch.empty_like(dest)
    pos[order] = dest  # buffer row of each pair, in pair order
    wa = torch.zeros(rows, dtype=torch.float32, device=src.device)
    wa[pos] = pair_w
    if W.kind == "fp8":
        a = torch.zeros(rows, H, dtype=torch.uint8, device=src.device)
        a[pos] = src.view(torch.uint8)[src_idx]
        sa = torch.zeros(rows, dtype=torch.float32, device=src.device)
        sa[pos] = src_scale[src_idx]
        h = _grouped("fp8", a.view(FP8), sa, W.w1, W.s1, offs)
    else:
        a = torch.zeros(rows, H, dtype=torch.bfloat16, device=src.device)
        a[pos] = src[src_idx]
        h = _grouped("bf16", a, None, W.w1, None, offs)
    act = torch.nn.functional.silu(h[:, :I].float()) * h[:, I:].float() * wa.unsqueeze(1)
    if W.kind == "fp8":
        aq, sact = quantize_rowwise(act)
        o = _grouped("fp8", aq, sact, W.w2, W.s2, offs)
    else:
        o = _grouped("bf16", act.bfloat16(), None, W.w2, None, offs)
    assert o.shape[0] == rows and N <= rows
    return o[pos]


def _local_ids(topk_idx: torch.Tensor, W: DenseExperts) -> torch.Tensor:
    flat = topk_idx.reshape(-1).long()
    E = len(W.experts)
    local = flat - W.experts.start
    return torch.where((flat >= 0) & (local < E) & (local >= 0), local, E)


def torch_moe(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, W: DenseExperts) -> torch.Tensor:
    """y BF16 [T, H] on one rank holding every expert; no host sync (CUDA-graph capturable)."""
    T, K = topk_idx.shape
    expert = _local_ids(topk_idx, W)
    tok = torch.arange(T * K, device=x.device) // K
    if W.kind == "fp8":
        xq, xs = quantize_rowwise(x)
        rows = _expert_rows(W, xq, xs, tok, topk_w.reshape(-1).float(), expert)
    else:
        rows = _expert_rows(W, x.bfloat16(), None, tok, topk_w.reshape(-1).float(), expert)
    rows = torch.where((expert < len(W.experts)).unsqueeze(1), rows.float(), 0.0)
    return torch.zeros(T, W.hidden, dtype=torch.float32, device=x.device).index_add_(0, tok, rows).bfloat16()


def torch_moe_distributed(x, topk_idx, topk_w, W: DenseExperts, group=None) -> torch.Tensor:
    """y BF16 [T, H] for this rank's tokens; rank r owns experts [r E/R, (r+1) E/R). Rows (FP8 +
    scale, or BF16), top-k weights and expert ids go to the owners over NCCL all_to_all_single,
    BF16 expert rows come back. Splits are read on the host: one sync per call (eager only)."""
    world = dist.get_world_size(group)
    per_rank = W.num_experts // world
    T, K = topk_idx.shape
    flat = topk_idx.reshape(-1).long()
    owner = torch.where(flat >= 0, flat // per_rank, world)
    order = torch.argsort(owner, stable=True)
    counts = torch.bincount(owner, minlength=world + 1)[:world]
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send, recv = counts.tolist(), recv_counts.tolist()
    n = sum(send)
    sel = order[:n]
    tok = sel // K
    in_w = _all_to_all(topk_w.reshape(-1).float()[sel], send, recv, group)
    in_e = _all_to_all(flat[sel], send, recv, group) - W.experts.start
    idx = torch.arange(sum(recv), device=x.device)
    if W.kind == "fp8":
        xq, xs = quantize_rowwise(x)
        in_q = _all_to_all(xq.view(torch.uint8)[tok], send, recv, group).view(FP8)
        in_s = _all_to_all(xs[tok], send, recv, group)
        out = _expert_rows(W, in_q, in_s, idx, in_w, in_e)
    else:
        in_x = _all_to_all(x.bfloat16()[tok], send, recv, group)
        out = _expert_rows(W, in_x, None, idx, in_w, in_e)
    back = _all_to_all(out.contiguous(), recv, send, group)
    return torch.zeros(T, W.hidden, dtype=torch.float32, device=x.device).index_add_(0, tok, back.float()).bfloat16()
