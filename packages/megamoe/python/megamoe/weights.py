"""The experts' weights as MegaMoE takes them, and their checks (pure torch, CPU or GPU tensors).

    ExpertWeights(num_experts, experts, w1, w2)
        w1: TransformedWeights [E_local, 2I, H], gate/up rows interleaved
            (fp4_gemm.numerics.transform_weights(*quantize_mxfp4(w1), gate_up_interleave=True))
        w2: TransformedWeights [E_local, H, I]   (transform_weights(*quantize_mxfp4(w2)))

megamoe.reference.MoEWeights has the same fields and is accepted as it is (make_weights).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fp4_gemm.numerics import MAX_SHIFT, MIN_SHIFT, TransformedWeights

from fp4_gemm.layout import constants as _fp4_constants

SCALE_GROUP = _fp4_constants()["kScaleGroup"]  # channels per FP8 activation scale, input and L2 input
MX_GROUP = 32      # K elements per MXFP4 exponent (shift) group

__all__ = ["ExpertWeights", "check_weights", "local_experts", "WeightShapes"]


@dataclass
class ExpertWeights:
    """Experts `experts` (global ids, a contiguous range) of a layer with `num_experts` experts."""
    num_experts: int
    experts: range
    w1: TransformedWeights  # [E_local, 2I, H], gate/up interleaved
    w2: TransformedWeights  # [E_local, H, I]

    @property
    def hidden(self) -> int:
        return self.w2.codes.shape[-2]

    @property
    def intermediate(self) -> int:
        return self.w2.codes.shape[-1] * 2

    @property
    def n_clamped(self) -> int:
        """Weight groups the FP4 -> FP8 transform clamped (lossy), W1 and W2."""
        return int(self.w1.n_clamped) + int(self.w2.n_clamped)


@dataclass(frozen=True)
class WeightShapes:
    num_experts: int
    num_local: int
    hidden: int
    intermediate: int
    experts: range


def _slice_tw(tw: TransformedWeights, sl: slice) -> TransformedWeights:
    # n_clamped stays the whole set's count (an upper bound for the slice; recounting needs the codes'
    # exponents, which the transform folded away); the layer's log says "up to" for it
    return TransformedWeights(tw.codes[sl].contiguous(), tw.shift[sl].contiguous(), tw.row_scale[sl].contiguous(),
                              tw.n_clamped, tw.gate_up_interleave)


def local_experts(weights, rank: int, num_ranks: int) -> ExpertWeights:
    """The experts rank `rank` of `num_ranks` owns, [rank*E/R, (rank+1)*E/R), sliced out of a weight set
    holding all experts (ExpertWeights or reference.MoEWeights)."""
    E = int(weights.num_experts)
    if num_ranks < 1 or E % num_ranks or not 0 <= rank < num_ranks:
        raise ValueError(f"num_ranks / rank: {E} experts over {num_ranks} ranks, rank {rank}")
    if weights.experts != range(E):
        raise ValueError(f"weights: local_experts needs the full set range({E}), got {weights.experts}")
    L = E // num_ranks
    sl = slice(rank * L, (rank + 1) * L)
    return ExpertWeights(E, range(rank * L, (rank + 1) * L), _slice_tw(weights.w1, sl), _slice_tw(weights.w2, sl))


def _check_tw(tw, name: str, L: int, N: int, K: int, interleaved: bool) -> None:
    for f in ("codes", "shift", "row_scale", "gate_up_interleave"):
        if not hasattr(tw, f):
            raise TypeError(f"{name}: expected fp4_gemm.numerics.TransformedWeights, got {type(tw).__name__} "
                            f"(no .{f})")
    want = {"codes": ((L, N, K // 2), torch.uint8), "shift": ((L, N, K // MX_GROUP), torch.int8),
            "row_scale": ((L, N), torch.float32)}
    for f, (shape, dtype) in want.items():
        t = getattr(tw, f)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}.{f}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"{name}.{f}: expected dtype {dtype}, got {t.dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}.{f}: expected shape {list(shape)} ([E_local, N, ...] with E_local={L}, "
                             f"N={N}, K={K}), got {list(t.shape)}")
    if bool(tw.gate_up_interleave) != interleaved:
        raise ValueError(f"{name}: gate_up_interleave must be {interleaved} "
                         + ("(transform W1 with gate_up_interleave=True: the L1 epilogue pairs gate and up rows)"
                            if interleaved else "(W2 has no gate/up halves)"))
    if not bool(torch.isfinite(tw.row_scale).all()):
        bad = int((~torch.isfinite(tw.row_scale)).sum())
        raise ValueError(f"{name}.row_scale: {bad} non-finite (NaN/inf) entries")
    if bool((tw.row_scale < 0).any()):
        raise ValueError(f"{name}.row_scale: negative entries (the row scales are powers of two)")
    sh = tw.shift
    if sh.numel() and not (MIN_SHIFT <= int(sh.min()) and int(sh.max()) <= MAX_SHIFT):
        raise ValueError(f"{name}.shift: values must lie in [{MIN_SHIFT}, {MAX_SHIFT}], got "
                         f"[{int(sh.min())}, {int(sh.max())}]")


def check_weights(weights, num_ranks: int, rank: int) -> WeightShapes:
    """Validates an ExpertWeights / MoEWeights for rank `rank` of `num_ranks`; returns the sizes.
    Every error names the field (w1.codes, w2.row_scale, experts, ...)."""
    for f in ("num_experts", "experts", "w1", "w2"):
        if not hasattr(weights, f):
            raise TypeError(f"weights: expected megamoe.ExpertWeights or megamoe.reference.MoEWeights, got "
                            f"{type(weights).__name__} (no .{f})")
    E = weights.num_experts
    if not isinstance(E, int) or E < 1:
        raise ValueError(f"weights.num_experts: {E!r} must be a positive int")
    if E % num_ranks:
        raise ValueError(f"weights.num_experts: {E} experts do not split evenly over {num_ranks} ranks")
    L = E // num_ranks
    want = range(rank * L, (rank + 1) * L)
    ex = weights.experts
    if not isinstance(ex, range) or ex != want:
        raise ValueError(f"weights.experts: rank {rank} of {num_ranks} must hold experts {want} "
                         f"(rank r owns [r*E/R, (r+1)*E/R)), got {ex!r}")
    c1, c2 = getattr(weights.w1, "codes", None), getattr(weights.w2, "codes", None)
    if not isinstance(c1, torch.Tensor) or c1.dim() != 3 or not isinstance(c2, torch.Tensor) or c2.dim() != 3:
        raise ValueError("weights.w1 / w2: codes must be [E_local, N, K/2] tensors")
    H = c1.shape[2] * 2
    I2 = c1.shape[1]
    if I2 % 2:
        raise ValueError(f"weights.w1.codes: {I2} rows, expected 2I (gate and up)")
    I = I2 // 2
    if H <= 0 or H % SCALE_GROUP:
        raise ValueError(f"hidden size H={H} (weights.w1.codes.shape[2] * 2) must be a positive multiple of "
                         f"{SCALE_GROUP}")
    if I <= 0 or I % SCALE_GROUP:
        raise ValueError(f"intermediate size I={I} (weights.w1.codes.shape[1] / 2) must be a positive multiple of "
                         f"{SCALE_GROUP} (one L2-input scale per {SCALE_GROUP} channels)")
    _check_tw(weights.w1, "w1", L, 2 * I, H, True)
    _check_tw(weights.w2, "w2", L, H, I, False)
    return WeightShapes(E, L, H, I, want)


def weight_bytes(*packed) -> int:
    """Device bytes of fp4_gemm PackedWeights."""
    n = 0
    for pw in packed:
        for t in (pw.packed, pw.row_scale):
            n += t.numel() * t.element_size()
    return n
