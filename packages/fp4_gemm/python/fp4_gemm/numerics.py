"""Reference numerics of fp4_gemm in plain torch (CPU or CUDA tensors, fully vectorised).

FP8 E4M3 activation quantisation (bitwise what `csrc/quantize.cu` computes), OCP MXFP4 weight
quantisation, and the offline transform that folds MXFP4 group exponents into per-group shifts so
the kernel can decode E2M1 codes straight to E4M3 (see DESIGN.md section 1 and `layout.cuh`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .layout import constants as layout_constants

__all__ = [
    "FP8_E4M3_MAX", "MIN_AMAX", "MIN_SHIFT", "MAX_SHIFT", "MIN_EXACT_SHIFT",
    "e2m1_values", "fp8_e4m3_lut",
    "quantize_fp8", "dequantize_fp8", "quantize_mxfp4", "dequantize_mxfp4",
    "TransformedWeights", "transform_weights", "decode_transformed", "dequantize_transformed",
    "interleave_rows", "deinterleave_rows",
]

# --- constants ------------------------------------------------------------------------------------

FP8_E4M3_MAX = 448.0  # kFp8E4M3Max in fp8.cuh
MIN_AMAX = 1e-10      # kMinAmax in fp8.cuh: keeps an all-zero group's scale finite
_POW2_ROUND_UP = 0x007FFFFF   # add to FP32 bits, then mask: mantissa rounded up to a power of two
_EXP_MASK = -0x00800000       # 0xFF800000 as int32: sign + exponent bits

MX_GROUP = 32          # OCP MX block size
E2M1_EMAX = 2          # exponent of E2M1's largest binade (6 = 1.5 * 2^2)
E2M1_MAX = 6.0
E8M0_BIAS = 127
E8M0_MIN, E8M0_MAX = -127, 127  # representable UE8M0 exponents; biased 255 is NaN
E8M0_NAN = 255
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # by 3-bit magnitude index
_E2M1_SIGN_BIT = 0x8
_E2M1_MAG_MASK = 0x7          # magnitude bits of a code: 0 is +-0
_E2M1_MAG_MASK_BYTE = 0x77    # both nibbles of a packed byte
_NIBBLE = 0xF
_F64_MANT_BITS, _F64_BIAS = 52, 1023

INTERLEAVE_ROWS = 8  # gate rows, then the matching up rows, per 16-row block


_LAYOUT = layout_constants()  # layout.cuh is the single source of these
MIN_SHIFT = _LAYOUT["kMinShift"]  # stored shifts are clamped here: every value decodes to 0 below
MAX_SHIFT = _LAYOUT["kMaxShift"]  # shift of a row's largest group
# A group decodes exactly while its smallest E2M1 magnitude (0.5 = 2^-1) times 2^shift is still an
# E4M3 number, i.e. >= the smallest E4M3 subnormal 2^-9.
_E4M3_MIN_SUBNORMAL_EXP = -9
_E2M1_MIN_EXP = -1
MIN_EXACT_SHIFT = _E4M3_MIN_SUBNORMAL_EXP - _E2M1_MIN_EXP


# --- small helpers --------------------------------------------------------------------------------

def _pow2(e: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Exact 2^e for an integer tensor e (|e| < 1023) by building FP64 bits: pow/exp2/ldexp are not
    guaranteed exact on every backend, and 2^e may be an FP32 subnormal (exact after the cast)."""
    bits = (e.to(torch.int64) + _F64_BIAS) << _F64_MANT_BITS
    return bits.view(torch.float64).to(dtype)


def e2m1_values(device=None) -> torch.Tensor:
    """FP32 [16]: the E2M1 value of each 4-bit code (bit 3 = sign, bits 0-2 = magnitude index)."""
    mags = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def fp8_e4m3_lut(shift: int, device=None) -> torch.Tensor:
    """uint8 [8]: E4M3 codes (RNE) of the E2M1 magnitudes {0,.5,1,1.5,2,3,4,6} * 2^shift."""
    if not MIN_SHIFT <= shift <= MAX_SHIFT:
        raise ValueError(f"shift {shift} outside [{MIN_SHIFT}, {MAX_SHIFT}]")
    mags = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return (mags * 2.0 ** shift).to(torch.float8_e4m3fn).view(torch.uint8)


def _unpack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] -> int64 [..., K] codes; element 2j is the low nibble of byte j."""
    lo, hi = codes & _NIBBLE, codes >> 4
    return torch.stack([lo, hi], dim=-1).flatten(-2).long()


def _pack_nibbles(idx: torch.Tensor) -> torch.Tensor:
    """int [..., K] 4-bit codes -> uint8 [..., K/2] (element 2j in the low nibble)."""
    pairs = idx.to(torch.uint8).unflatten(-1, (-1, 2))
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _check_uint8(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.uint8:
        raise TypeError(f"{name}: expected uint8, got {t.dtype}")


# --- FP8 activations ------------------------------------------------------------------------------

def quantize_fp8(x: torch.Tensor, gran: int = 128, pow2: bool = False):
    """BF16/FP32 [..., H] -> (E4M3 [..., H], FP32 scales [..., H/gran]), one scale per `gran`
    channels; bitwise the formula of fp8.cuh (scale = max(amax, 1e-10) / 448, q = e4m3(x / scale))."""
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"x: expected bfloat16/float16/float32, got {x.dtype}")
    if x.dim() < 1 or gran <= 0 or x.shape[-1] % gran:
        raise ValueError(f"x: last dimension {tuple(x.shape)[-1:]} is not a multiple of gran={gran}")
    xg = x.float().unflatten(-1, (-1, gran))
    a = xg.abs()
    # fmaxf in the kernel's warp max ignores NaN; mirror it so scales stay bitwise equal.
    amax = torch.where(a.isnan(), torch.zeros_like(a), a).amax(dim=-1)
    # A tensor divisor, not a Python scalar: torch's CUDA division by a scalar multiplies by its
    # reciprocal, which is not the IEEE division the kernel does.
    s = amax.clamp_min(MIN_AMAX) / torch.full_like(amax, FP8_E4M3_MAX)
    if pow2:
        bits = (s.view(torch.int32) + _POW2_ROUND_UP) & _EXP_MASK  # s > 0: no int32 overflow
        s = bits.view(torch.float32)
    # Division (not times 1/s) as in the kernel; the clamp mirrors its saturating (SATFINITE) cvt.
    q = (xg / s.unsqueeze(-1)).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q.flatten(-2), s


def dequantize_fp8(q: torch.Tensor, s: torch.Tensor, gran: int = 128) -> torch.Tensor:
    """E4M3 [..., H] and FP32 scales [..., H/gran] -> FP32 [..., H]."""
    if q.shape[-1] != s.shape[-1] * gran:
        raise ValueError(f"q {tuple(q.shape)} and scales {tuple(s.shape)} disagree for gran={gran}")
    return (q.float().unflatten(-1, (-1, gran)) * s.float().unsqueeze(-1)).flatten(-2)


# --- MXFP4 weights --------------------------------------------------------------------------------

def _round_e2m1(a: torch.Tensor) -> torch.Tensor:
    """Magnitudes a >= 0 -> nearest E2M1 magnitude, ties to even, saturating at 6.
    The grid spacing is 0.5 on [0, 2), 1 on [2, 4), 2 on [4, 6]; scaling by a power of two is exact
    and torch.round is half-to-even, which on each binade's grid is ties-to-even mantissa."""
    step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(a.dtype)
    return (torch.round(a / step) * step).clamp_max(E2M1_MAX)


def quantize_mxfp4(w: torch.Tensor, group: int = MX_GROUP):
    """Float [..., N, K] -> (codes uint8 [..., N, K/2], exps uint8 [..., N, K/group]) by the OCP MX
    rule: e = floor(log2(amax)) - 2 per group (exps = e + 127, all-zero group -> e = -127), codes =
    E2M1(w / 2^e) with ties to even, saturating at 6. Non-finite weights raise ValueError."""
    if not w.is_floating_point():
        raise TypeError(f"w: expected a floating dtype, got {w.dtype}")
    if w.dim() < 2 or group <= 0 or group % 2 or w.shape[-1] % group:
        raise ValueError(f"w: shape {tuple(w.shape)} needs [..., N, K] with K a multiple of group={group}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w: non-finite weights have no MXFP4 encoding")
    # FP64 input keeps FP64 so its range is not cut at FP32's; every scaling below is exact.
    work = torch.float64 if w.dtype == torch.float64 else torch.float32
    wg = w.to(work).unflatten(-1, (-1, group))
    amax = wg.abs().amax(dim=-1)
    _, ex = torch.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1): floor(log2(amax)) = ex - 1, exactly
    e = torch.where(amax > 0, ex.long() - 1 - E2M1_EMAX, torch.full_like(ex, E8M0_MIN, dtype=torch.long))
    e = e.clamp(E8M0_MIN, E8M0_MAX)
    scaled = wg * _pow2(-e, work).unsqueeze(-1)
    mag = _round_e2m1(scaled.abs())
    table = torch.tensor(_E2M1_MAGNITUDES, dtype=work, device=w.device)
    idx = torch.searchsorted(table, mag.contiguous())  # exact grid points: index of the value
    idx = idx | torch.where(torch.signbit(scaled), _E2M1_SIGN_BIT, 0)  # sign kept, as an IEEE cast would
    codes = _pack_nibbles(idx.flatten(-2))
    return codes, (e + E8M0_BIAS).to(torch.uint8)


def _check_mx(codes: torch.Tensor, exps: torch.Tensor) -> int:
    """Validate an MXFP4 pair; return the group size."""
    _check_uint8(codes, "codes")
    _check_uint8(exps, "exps")
    K = 2 * codes.shape[-1]
    if codes.shape[:-1] != exps.shape[:-1] or exps.shape[-1] == 0 or K % exps.shape[-1]:
        raise ValueError(f"codes {tuple(codes.shape)} and exps {tuple(exps.shape)} disagree")
    if bool((exps == E8M0_NAN).any()):
        raise ValueError("exps: 255 is the UE8M0 NaN scale")
    return K // exps.shape[-1]


def dequantize_mxfp4(codes: torch.Tensor, exps: torch.Tensor) -> torch.Tensor:
    """(codes uint8 [..., N, K/2], exps uint8 [..., N, K/group]) -> FP32 [..., N, K], exact (values
    beyond FP32's range, only possible for exps > 252, become inf)."""
    group = _check_mx(codes, exps)
    vals = e2m1_values(codes.device)[_unpack_nibbles(codes)]
    scale = _pow2(exps.long() - E8M0_BIAS, torch.float32)
    return (vals.unflatten(-1, (-1, group)) * scale.unsqueeze(-1)).flatten(-2)


# --- gate/up row interleave -----------------------------------------------------------------------

def _interleave_perm(n: int, device) -> torch.Tensor:
    """Source row of each output row: block b of 16 = gate rows 8b..8b+7, then up rows I+8b..I+8b+7."""
    if n % (2 * INTERLEAVE_ROWS):
        raise ValueError(f"gate/up interleave needs 2I rows with I % {INTERLEAVE_ROWS} == 0, got {n}")
    half = n // 2
    p = torch.arange(n, device=device)
    b, j = p // (2 * INTERLEAVE_ROWS), p % (2 * INTERLEAVE_ROWS)
    return torch.where(j < INTERLEAVE_ROWS, INTERLEAVE_ROWS * b + j, half + INTERLEAVE_ROWS * b + j - INTERLEAVE_ROWS)


def interleave_rows(t: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """[gate rows; up rows] along `dim` -> 8 gate rows, 8 up rows, ... (dim=-1 for row_scale)."""
    return t.index_select(dim, _interleave_perm(t.shape[dim], t.device))


def deinterleave_rows(t: torch.Tensor, dim: int = -2) -> torch.Tensor:
    """Inverse of interleave_rows."""
    return t.index_select(dim, torch.argsort(_interleave_perm(t.shape[dim], t.device)))


# --- offline transform: MXFP4 -> per-group shifts + per-row scale ---------------------------------

@dataclass
class TransformedWeights:
    """Weights as the kernel sees them: value = e4m3(e2m1(code) * 2^shift) * row_scale."""
    codes: torch.Tensor      # uint8 [..., N, K/2], element 2j in the low nibble
    shift: torch.Tensor      # int8 [..., N, K/group], in [MIN_SHIFT, MAX_SHIFT]
    row_scale: torch.Tensor  # FP32 [..., N], 2^(B - MAX_SHIFT - 127), possibly subnormal
    n_clamped: int           # groups with a non-zero code and shift < MIN_EXACT_SHIFT (not all values
                             # exact in E4M3); all-zero groups are exact and not counted
    gate_up_interleave: bool


def transform_weights(codes: torch.Tensor, exps: torch.Tensor, gate_up_interleave: bool = False) -> TransformedWeights:
    """Fold each row's UE8M0 group exponents into shifts s = e - max_g(e) + 6 and a row scale;
    optionally interleave gate/up rows (input rows: gate 0..I-1, then up I..2I-1)."""
    _check_mx(codes, exps)
    e = exps.long()
    base = e.amax(dim=-1, keepdim=True)
    s = e - base + MAX_SHIFT
    # lossy groups only: an all-zero group (every code +-0) decodes exactly whatever its shift
    n_groups = e.shape[-1]
    if codes.shape[-1] % n_groups == 0:  # whole bytes per group (even group size): test both nibbles at once
        nonzero = ((codes & _E2M1_MAG_MASK_BYTE) != 0).unflatten(-1, (n_groups, -1)).any(dim=-1)
    else:
        nonzero = ((_unpack_nibbles(codes) & _E2M1_MAG_MASK) != 0).unflatten(-1, (n_groups, -1)).any(dim=-1)
    n_clamped = int(((s < MIN_EXACT_SHIFT) & nonzero).sum())
    shift = s.clamp_min(MIN_SHIFT).to(torch.int8)
    row_scale = _pow2(base.squeeze(-1) - MAX_SHIFT - E8M0_BIAS, torch.float32)
    if gate_up_interleave:
        codes, shift, row_scale = interleave_rows(codes), interleave_rows(shift), interleave_rows(row_scale, dim=-1)
    return TransformedWeights(codes.contiguous(), shift.contiguous(), row_scale.contiguous(),
                              n_clamped, gate_up_interleave)


def decode_transformed(tw: TransformedWeights) -> torch.Tensor:
    """FP32 [..., N, K]: the E4M3 value of each weight inside the kernel, e4m3(e2m1 * 2^shift) (RNE),
    before the row scale."""
    group = 2 * tw.codes.shape[-1] // tw.shift.shape[-1]
    vals = e2m1_values(tw.codes.device)[_unpack_nibbles(tw.codes)].unflatten(-1, (-1, group))
    exact = vals * _pow2(tw.shift.long(), torch.float32).unsqueeze(-1)  # exact: shift >= MIN_SHIFT
    return exact.to(torch.float8_e4m3fn).float().flatten(-2)


def dequantize_transformed(tw: TransformedWeights) -> torch.Tensor:
    """FP64 [..., N, K]: decode_transformed * row_scale, the weight value the kernel multiplies by."""
    return decode_transformed(tw).double() * tw.row_scale.double().unsqueeze(-1)
