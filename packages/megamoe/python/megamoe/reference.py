"""Pure-PyTorch reference of the megamoe layer (DESIGN.md section 1), single-process and multi-rank.

Every rounding step of the quantised recipe is reproduced; the GEMMs are FP64 on the dequantised
values. Runs on CPU or GPU tensors.

Batch invariance (why the multi-rank form equals the single-process one bitwise): each output
element is computed the same way whichever other pairs share its expert batch.
- GEMMs: an FP8 code (a multiple of 2^-9, |v| <= 448) times an in-kernel weight (an E4M3 value,
  also a multiple of 2^-9, times a power-of-two row scale) is exact in FP64, and a sum of up to
  2^17 such products stays below 2^53 units, so each per-scale-group partial dot product is EXACT
  whatever order or blocking the BLAS uses. The groups are then scaled by the activation scale and added in
  group order with element-wise ops (this is also the kernel's promotion structure). The result is
  the FP64 dot product of the dequantised vectors up to FP64 rounding; only the association differs
  from a plain dot, which shows after rounding to BF16 with probability ~2^-37 per element.
- exp in SiLU: taken in FP64 and rounded to FP32 (a correctly rounded expf) because torch's CPU
  exp may take different code paths (SIMD body, scalar tail, MKL) for different elements.
"""
from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from fp4_gemm.numerics import (TransformedWeights, deinterleave_rows, dequantize_transformed,
                               quantize_fp8, quantize_mxfp4, transform_weights)

__all__ = ["MoEWeights", "MoEIntermediates", "make_weights", "moe_reference",
           "moe_reference_distributed", "run_local_ranks", "X_GRAN"]

from fp4_gemm.layout import constants as _fp4_constants

# Channels per FP32 scale of every FP8 activation (the input, DeepEP's convention, and the L2 input):
# the one constant fp4_gemm's kernels use (include/fp4_gemm/layout.cuh kScaleGroup).
SCALE_GROUP = _fp4_constants()["kScaleGroup"]
X_GRAN = SCALE_GROUP
FP8 = torch.float8_e4m3fn


# --- weights --------------------------------------------------------------------------------------

@dataclass
class MoEWeights:
    """Experts `experts` (global ids, a contiguous range) of a layer with `num_experts` experts.
    The *_deq values must be E4M3 numbers times power-of-two row scales (as make_weights builds
    them): the reference's batch invariance rests on it (module docstring)."""
    num_experts: int
    experts: range
    w1: TransformedWeights  # [E_local, 2I, H], gate/up rows interleaved (kernel layout)
    w2: TransformedWeights  # [E_local, H, I]
    w1_deq: torch.Tensor    # FP64 [E_local, 2I, H]: in-kernel values, gate rows then up rows
    w2_deq: torch.Tensor    # FP64 [E_local, H, I]

    @property
    def hidden(self) -> int:
        return self.w2_deq.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w2_deq.shape[2]

    @property
    def n_clamped(self) -> int:
        """Weight groups whose shift fell below the exact range of the transform (lossy)."""
        return self.w1.n_clamped + self.w2.n_clamped


def _expert_generator(seed: int, expert: int, device) -> torch.Generator:
    # One stream per (seed, expert): a rank generating only its own experts gets the same values.
    state = np.random.SeedSequence((seed, expert)).generate_state(1, np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state))


def make_weights(E: int, H: int, I: int, *, seed: int = 0, experts: range | None = None,
                 device="cpu", dtype: torch.dtype = torch.float32) -> MoEWeights:
    """Random experts quantised to MXFP4 and transformed for the kernel.

    Master weights are N(0, 1/fan_in) in `dtype` (so g, u and y are O(1) for unit-variance x).
    `experts` (default: all) selects the global ids to build; any subset equals the same slice of
    the full set bitwise, given the same device type (the random streams are per device type).
    """
    experts = range(E) if experts is None else experts
    if experts.step != 1 or not 0 <= experts.start < experts.stop <= E:
        raise ValueError(f"experts must be a non-empty contiguous sub-range of range({E}), got {experts}")
    # Built expert by expert so that peak memory is the FP64 result plus one expert's temporaries.
    w1_deq = torch.empty(len(experts), 2 * I, H, dtype=torch.float64, device=device)
    w2_deq = torch.empty(len(experts), H, I, dtype=torch.float64, device=device)
    tw1s, tw2s = [], []
    for i, e in enumerate(experts):
        gen = _expert_generator(seed, e, device)
        w1 = torch.randn(2 * I, H, generator=gen, device=device, dtype=dtype) / math.sqrt(H)
        w2 = torch.randn(H, I, generator=gen, device=device, dtype=dtype) / math.sqrt(I)
        tw1s.append(transform_weights(*quantize_mxfp4(w1), gate_up_interleave=True))
        tw2s.append(transform_weights(*quantize_mxfp4(w2)))
        w1_deq[i] = deinterleave_rows(dequantize_transformed(tw1s[-1]))
        w2_deq[i] = dequantize_transformed(tw2s[-1])
    return MoEWeights(E, experts, _stack(tw1s), _stack(tw2s), w1_deq, w2_deq)


def _stack(parts: list) -> TransformedWeights:
    """Per-expert TransformedWeights -> one with a leading expert dimension."""
    fields = (torch.stack([getattr(p, f) for p in parts]) for f in ("codes", "shift", "row_scale"))
    return TransformedWeights(*fields, sum(p.n_clamped for p in parts), parts[0].gate_up_interleave)


# --- one expert batch -----------------------------------------------------------------------------

@dataclass
class _PairOutputs:
    l1_q: torch.Tensor    # uint8 [P, I]: E4M3 codes of a = silu(gate) * up * topk_w
    l1_s: torch.Tensor    # FP32 [P, I / l2_gran]
    l2_out: torch.Tensor  # BF16 [P, H]


def _scaled_matmul(q: torch.Tensor, s: torch.Tensor, w: torch.Tensor, gran: int) -> torch.Tensor:
    """FP64 [P, N] = dequant(q, s) @ w.T, batch-invariant (module docstring): exact per-group dot
    products, then scaled and accumulated in group order."""
    qf = q.to(torch.float64)
    acc = torch.zeros(q.shape[0], w.shape[0], dtype=torch.float64, device=q.device)
    for g in range(q.shape[1] // gran):
        cols = slice(g * gran, (g + 1) * gran)
        acc = acc + s[:, g:g + 1].double() * (qf[:, cols] @ w[:, cols].T)
    return acc


def _to_bf16(x: torch.Tensor) -> torch.Tensor:
    """FP64 -> BF16 through FP32, as the kernel's FP32 accumulators are rounded."""
    return x.float().bfloat16()


def _silu(g: torch.Tensor) -> torch.Tensor:
    """FP32 silu(g) = g / (1 + exp(-g)), with a correctly rounded FP32 exp (module docstring)."""
    return g / (1 + torch.exp(-g.double()).float())


def _expert_rows(xq, xs, topk_w, expert, weights: MoEWeights, activation_clamp: float,
                 pow2_scales: bool, l2_gran: int) -> _PairOutputs:
    """Run pairs (FP8 rows xq [P, H], scales xs, FP32 topk_w [P], LOCAL expert index [P]) through
    their experts; each pair's result depends only on its own inputs."""
    P, H, I = xq.shape[0], weights.hidden, weights.intermediate
    out = _PairOutputs(torch.zeros(P, I, dtype=torch.uint8, device=xq.device),
                       torch.zeros(P, I // l2_gran, dtype=torch.float32, device=xq.device),
                       torch.zeros(P, H, dtype=torch.bfloat16, device=xq.device))
    for j in torch.unique(expert).tolist():  # one batch per expert, as the kernel groups them
        rows = (expert == j).nonzero().squeeze(1)
        gate_up = _to_bf16(_scaled_matmul(xq[rows], xs[rows], weights.w1_deq[j], X_GRAN)).float()
        gate = gate_up[:, :I].clamp(max=activation_clamp)
        up = gate_up[:, I:].clamp(-activation_clamp, activation_clamp)
        a = _silu(gate) * up * topk_w[rows].unsqueeze(1)
        aq, a_s = quantize_fp8(a, gran=l2_gran, pow2=pow2_scales)
        out.l1_q[rows] = aq.view(torch.uint8)
        out.l1_s[rows] = a_s
        out.l2_out[rows] = _to_bf16(_scaled_matmul(aq, a_s, weights.w2_deq[j], l2_gran))
    return out


def _combine(slots: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """BF16 [T, K, H] rows -> BF16 [T, H]: FP32 sum over k in slot order; missing slots add nothing."""
    acc = torch.zeros(slots.shape[0], slots.shape[2], dtype=torch.float32, device=slots.device)
    for k in range(slots.shape[1]):
        acc = torch.where(valid[:, k:k + 1], acc + slots[:, k].float(), acc)
    return acc.bfloat16()


def _check_inputs(x, topk_idx, topk_w, weights: MoEWeights, l2_gran: int) -> None:
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != weights.hidden:
        raise ValueError(f"x: expected BF16 [T, {weights.hidden}], got {x.dtype} {tuple(x.shape)}")
    if topk_idx.dtype not in (torch.int32, torch.int64) or topk_idx.dim() != 2 or topk_idx.shape[0] != x.shape[0]:
        raise ValueError(f"topk_idx: expected int [T={x.shape[0]}, K], got {topk_idx.dtype} {tuple(topk_idx.shape)}")
    if topk_w.dtype != torch.float32 or topk_w.shape != topk_idx.shape:
        raise ValueError(f"topk_w: expected FP32 {tuple(topk_idx.shape)}, got {topk_w.dtype} {tuple(topk_w.shape)}")
    if topk_idx.numel() and not (-1 <= int(topk_idx.min()) and int(topk_idx.max()) < weights.num_experts):
        raise ValueError(f"topk_idx: ids must be in [-1, {weights.num_experts})")
    if weights.intermediate % l2_gran:
        raise ValueError(f"l2_gran={l2_gran} does not divide I={weights.intermediate}")


# --- single process -------------------------------------------------------------------------------

@dataclass
class MoEIntermediates:
    """Per-stage values for kernel tests; missing slots (topk_idx == -1) hold zeros."""
    x_q: torch.Tensor     # E4M3 [T, H]
    x_s: torch.Tensor     # FP32 [T, H / 128]
    l1_q: torch.Tensor    # E4M3 [T, K, I]: L1 output = L2 input
    l1_s: torch.Tensor    # FP32 [T, K, I / l2_gran]
    l2_out: torch.Tensor  # BF16 [T, K, H]: expert output row per (t, k), before combine


def moe_reference(x, topk_idx, topk_w, weights: MoEWeights, *, activation_clamp: float = math.inf,
                  pow2_scales: bool = False, l2_gran: int = SCALE_GROUP, return_intermediates: bool = False):
    """y BF16 [T, H] of the quantised MoE layer (DESIGN.md section 1) for all experts in one process.

    pow2_scales rounds both the input and the L2-input FP8 scales up to powers of two.
    With return_intermediates, returns (y, MoEIntermediates).
    """
    _check_inputs(x, topk_idx, topk_w, weights, l2_gran)
    if weights.experts != range(weights.num_experts):
        raise ValueError(f"moe_reference needs all {weights.num_experts} experts, got {weights.experts}")
    T, K = topk_idx.shape
    H, I = weights.hidden, weights.intermediate
    xq, xs = quantize_fp8(x, gran=X_GRAN, pow2=pow2_scales)
    valid = topk_idx >= 0
    t, k = valid.nonzero(as_tuple=True)
    pairs = _expert_rows(xq[t], xs[t], topk_w[t, k], topk_idx[t, k], weights,
                         activation_clamp, pow2_scales, l2_gran)
    slots = torch.zeros(T, K, H, dtype=torch.bfloat16, device=x.device)
    slots[t, k] = pairs.l2_out
    y = _combine(slots, valid)
    if not return_intermediates:
        return y
    l1_q = torch.zeros(T, K, I, dtype=torch.uint8, device=x.device)
    l1_s = torch.zeros(T, K, I // l2_gran, dtype=torch.float32, device=x.device)
    l1_q[t, k], l1_s[t, k] = pairs.l1_q, pairs.l1_s
    return y, MoEIntermediates(xq, xs, l1_q.view(FP8), l1_s, slots)


# --- multi-rank (DP = EP over torch.distributed) --------------------------------------------------

def _all_to_all(t: torch.Tensor, send_splits: list, recv_splits: list, group) -> torch.Tensor:
    """Rows of t, split by destination rank, -> the rows the other ranks send here, source-major."""
    out = t.new_empty((sum(recv_splits), *t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), recv_splits, send_splits, group=group)
    return out


def moe_reference_distributed(x, topk_idx, topk_w, weights_local: MoEWeights, group=None, *,
                              activation_clamp: float = math.inf, pow2_scales: bool = False,
                              l2_gran: int = SCALE_GROUP) -> torch.Tensor:
    """y BF16 [T, H] for this rank's tokens; rank r owns experts [r E/R, (r+1) E/R).

    Exchanges what the kernel exchanges: FP8 rows, their scales and the top-k weight go to the
    expert's owner, BF16 expert rows come back, and the source rank combines in slot order.
    Bitwise equal to moe_reference on all ranks' tokens concatenated (module docstring).
    Collective: every rank of `group` must call it. Tensors on CPU for gloo, on the rank's GPU for NCCL.
    """
    _check_inputs(x, topk_idx, topk_w, weights_local, l2_gran)
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    E = weights_local.num_experts
    if E % world:
        raise ValueError(f"{E} experts do not split evenly over {world} ranks")
    per_rank = E // world
    if weights_local.experts != range(rank * per_rank, (rank + 1) * per_rank):
        raise ValueError(f"rank {rank} must hold experts {range(rank * per_rank, (rank + 1) * per_rank)}, "
                         f"got {weights_local.experts}")
    T, K = topk_idx.shape
    xq, xs = quantize_fp8(x, gran=X_GRAN, pow2=pow2_scales)
    valid = topk_idx >= 0
    t, k = valid.nonzero(as_tuple=True)
    expert = topk_idx[t, k].long()
    order = torch.argsort(expert // per_rank, stable=True)  # send buffer grouped by owner rank
    t, k, expert = t[order], k[order], expert[order]
    send_counts = torch.bincount(expert // per_rank, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()

    # Dispatch. FP8 travels as bytes: collectives do not take float8 tensors.
    in_q = _all_to_all(xq[t].view(torch.uint8), send, recv, group).view(FP8)
    in_s = _all_to_all(xs[t], send, recv, group)
    in_w = _all_to_all(topk_w[t, k], send, recv, group)
    in_e = _all_to_all(expert, send, recv, group) - weights_local.experts.start
    rows = _expert_rows(in_q, in_s, in_w, in_e, weights_local, activation_clamp, pow2_scales,
                        l2_gran).l2_out

    # Combine: rows return along the reverse splits, in the order this rank sent the pairs.
    back = _all_to_all(rows.view(torch.uint8), recv, send, group).view(torch.bfloat16)
    slots = torch.zeros(T, K, weights_local.hidden, dtype=torch.bfloat16, device=x.device)
    slots[t, k] = back
    return _combine(slots, valid)


# --- local launcher -------------------------------------------------------------------------------

def _rank_main(rank: int, world_size: int, tmp: str, device_type: str, fn, args) -> None:
    if device_type == "cuda":  # rank r on GPU r, or time-sliced on GPU r % #GPUs (symm_comm.testing's placement)
        from symm_comm.testing import placement, stage_collectives_on_host
        pl = placement(rank, world_size)
        torch.cuda.set_device(pl.device)
        backend = "gloo" if pl.shared_gpu else "nccl"
        if pl.shared_gpu:
            stage_collectives_on_host()
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # no oversubscription
        backend = "gloo"
    store = dist.FileStore(os.path.join(tmp, "store"), world_size)  # a file: no port to race for
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))


def run_local_ranks(fn, world_size: int, *args, device_type: str = "cpu") -> list:
    """Run fn(rank, world_size, *args) in `world_size` spawned processes joined in the default
    process group (gloo on CPU; NCCL with GPU `rank` on CUDA, or with fewer GPUs than ranks gloo with rank r on GPU
    r % #GPUs, time-sliced: symm_comm.testing.placement); return each rank's result.
    fn must be importable (module level); a rank's exception is re-raised here."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.spawn(_rank_main, args=(world_size, tmp, device_type, fn, args),
                                    nprocs=world_size, join=True)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False)
                for r in range(world_size)]
