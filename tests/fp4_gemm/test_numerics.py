"""fp4_gemm.numerics against independent definitions (numpy + ml_dtypes casts), over every element.

Inputs are fresh random draws each run; the seed is printed (shown on failure) and can be pinned
with MEGAMOE_TEST_SEED=<seed>.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from fp4_gemm import layout
from fp4_gemm import numerics as nm

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
E2M1_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
FP8_REL_HALF_ULP = 2.0 ** -4      # E4M3: 3 mantissa bits
FP8_SUBNORMAL_HALF_STEP = 2.0 ** -10
FP32_SLACK = 1 + 2.0 ** -20      # rounding of x / s and of q * s in FP32


def set_amax(group: torch.Tensor, amax: float) -> None:
    """Rescale a slice in place to the given max |value| (normalised first: no FP32 overflow)."""
    group.div_(group.abs().max()).mul_(amax)


def log_spread(gen, shape, lo, hi):
    """Powers of two 2^k, k uniform in [lo, hi], as FP32 (one per group: magnitudes across binades)."""
    return torch.ldexp(torch.ones(shape), torch.randint(lo, hi + 1, shape, generator=gen)).float()


# --- independent references -----------------------------------------------------------------------

def ref_quantize_fp8(x32: np.ndarray, gran: int, pow2: bool):
    xg = x32.reshape(x32.shape[0], -1, gran)
    s = np.maximum(np.abs(xg).max(-1), np.float32(1e-10)) / np.float32(448)
    if pow2:
        m, ex = np.frexp(s)
        s = np.where(m == 0.5, s, np.ldexp(np.float32(1), ex)).astype(np.float32)
    q = (xg / s[..., None]).astype(ml_dtypes.float8_e4m3fn)
    return q.reshape(x32.shape).view(np.uint8), s


def ref_quantize_mxfp4(w32: np.ndarray, group: int = 32):
    wg = w32.astype(np.float64).reshape(*w32.shape[:-1], -1, group)
    amax = np.abs(wg).max(-1)
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax)) - 2, -127).clip(-127, 127).astype(np.int64)
    scaled = (wg / np.ldexp(1.0, e)[..., None]).astype(np.float32)
    nib = np.clip(scaled, -6, 6).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    nib = nib.reshape(w32.shape)
    return (nib[..., 0::2] | (nib[..., 1::2] << 4)).astype(np.uint8), (e + 127).astype(np.uint8)


def ml_decode_e2m1(codes: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> float64 [..., K] through ml_dtypes' float4_e2m1fn."""
    nib = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(*codes.shape[:-1], -1)
    return nib.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)


def ml_e4m3(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def ml_dequantize_mxfp4(codes: np.ndarray, exps: np.ndarray) -> np.ndarray:
    vals = ml_decode_e2m1(codes)
    return (vals.reshape(*exps.shape, -1) * np.ldexp(1.0, exps.astype(np.int64) - 127)[..., None]).reshape(vals.shape)


# --- constants and tables -------------------------------------------------------------------------

def test_header_constants(tmp_path):
    h = tmp_path / "h.cuh"
    h.write_text("struct S {\n  static constexpr int kA = -13;  // c\n  static constexpr int kB = kA * 2;\n"
                 "static constexpr int kC=7;\n};\n")
    assert layout.header_constants(h) == {"kA": -13, "kB": -26, "kC": 7}
    assert (nm.MIN_SHIFT, nm.MAX_SHIFT, nm.MIN_EXACT_SHIFT) == (-13, 6, -8)


def test_e2m1_values_match_ml_dtypes():
    ref = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    got = nm.e2m1_values().numpy()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))  # -0 at code 8 too


def test_fp8_e4m3_lut_matches_ml_dtypes():
    for shift in range(nm.MIN_SHIFT, nm.MAX_SHIFT + 1):
        ref = (E2M1_GRID * 2.0 ** shift).astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        assert np.array_equal(nm.fp8_e4m3_lut(shift).numpy(), ref), shift
    assert not nm.fp8_e4m3_lut(nm.MIN_SHIFT).any()  # kMinShift: every magnitude rounds to 0
    assert nm.fp8_e4m3_lut(nm.MIN_SHIFT + 1).any()
    for bad in (nm.MIN_SHIFT - 1, nm.MAX_SHIFT + 1):
        with pytest.raises(ValueError):
            nm.fp8_e4m3_lut(bad)


# --- FP8 activations ------------------------------------------------------------------------------

def fp8_input(gen, dtype, T=48, H=1024, gran=128):
    x = torch.randn(T, H, generator=gen)
    x = x * log_spread(gen, (T, H // gran), -40, 40).repeat_interleave(gran, dim=1)
    x[0, :gran] = 0                                           # all-zero group
    set_amax(x[1, :gran], 1e-30)           # tiny
    set_amax(x[2, :gran], 1e30)            # huge
    x[3, :gran] = 0
    x[3, 5] = -3.0                                            # a lone nonzero
    if dtype == torch.float32:
        set_amax(x[4, :gran], 3e38)        # near FP32 max
        set_amax(x[5, :gran], 1e-40)       # FP32 subnormals
    return x.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_fp8_matches_reference(gen, device, pow2, dtype):
    gran = 128
    x = fp8_input(gen, dtype).to(device)
    q, s = nm.quantize_fp8(x, gran=gran, pow2=pow2)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert q.shape == x.shape and s.shape == (x.shape[0], x.shape[1] // gran)
    x32 = x.float().cpu().numpy()
    q_ref, s_ref = ref_quantize_fp8(x32, gran, pow2)
    assert np.array_equal(s.cpu().numpy().view(np.uint32), s_ref.view(np.uint32))
    assert np.array_equal(q.cpu().view(torch.uint8).numpy(), q_ref)

    # Round trip: E4M3 rounding is within half an ulp of the scale-normalised value.
    s64 = np.repeat(s.cpu().double().numpy(), gran, axis=1)
    err = np.abs(x32.astype(np.float64) - nm.dequantize_fp8(q, s, gran).cpu().double().numpy())
    bound = np.maximum(FP8_REL_HALF_ULP * np.abs(x32), FP8_SUBNORMAL_HALF_STEP * s64) * FP32_SLACK
    assert (err <= bound).all()

    sc = s.cpu().double().numpy()
    assert np.isfinite(sc).all() and (sc > 0).all()
    amax = np.abs(x32.astype(np.float64)).reshape(x.shape[0], -1, gran).max(-1)
    assert not q[0, :gran].float().any()  # all-zero group: zero codes, finite scale
    if pow2:
        assert (np.frexp(sc)[0] == 0.5).all()  # exact powers of two
        assert (sc * 448 >= amax).all() and (sc * 448 < 2 * np.maximum(amax, 1e-10)).all()


def test_quantize_fp8_ties_to_even():
    # Group 0: amax 448 -> scale exactly 1, so the quotients are exact ties between E4M3 neighbours.
    vals = [448.0, 1.0625, 1.1875, -1.0625, 2.0 ** -10, 3 * 2.0 ** -10, 5 * 2.0 ** -10, 432.0]
    want = [448.0, 1.0, 1.25, -1.0, 0.0, 2.0 ** -8, 2.0 ** -8, 448.0]
    # Group 1: scale 7; 10.9375 / 7 = 1.5625 is a tie (-> 1.5), but 10.9375 * fl(1/7) rounds above it:
    # division, not multiplication by the reciprocal.
    vals1, want1 = [3136.0, 10.9375, -10.9375], [448.0, 1.5, -1.5]
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    x[0, :len(vals)] = torch.tensor(vals)
    x[0, 128:128 + len(vals1)] = torch.tensor(vals1)
    q, s = nm.quantize_fp8(x)
    assert s.tolist() == [[1.0, 7.0]]
    assert q[0, :len(vals)].float().tolist() == want
    assert q[0, 128:128 + len(vals1)].float().tolist() == want1


def test_quantize_fp8_rejects_bad_shapes():
    with pytest.raises(ValueError):
        nm.quantize_fp8(torch.zeros(2, 100, dtype=torch.bfloat16))
    with pytest.raises(TypeError):
        nm.quantize_fp8(torch.zeros(2, 128, dtype=torch.float64))


# --- MXFP4 ----------------------------------------------------------------------------------------

def mx_input(gen, dtype, G=3, N=64, K=512):
    w = torch.randn(G, N, K, generator=gen) * log_spread(gen, (G, N, K // 32), -30, 30).repeat_interleave(32, -1)
    w[0, 0, :32] = 0                                          # all-zero group
    set_amax(w[0, 1, :32], 1e-30)        # tiny
    set_amax(w[0, 2, :32], 1e30)         # huge
    set_amax(w[0, 3, :32], 3e38)         # near FP32 max
    set_amax(w[0, 4, :32], 1e-42)        # FP32 subnormals: e clamps at -127
    w[0, 5, :32] = torch.full((32,), 7.5).pow(torch.linspace(0, 1, 32))  # values in (6, 8) saturate
    w[0, 6, 3] = -0.0
    # BF16 weights (what checkpoints hold) have few mantissa bits: many scaled values are exact ties.
    return w.to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_mxfp4_matches_reference(gen, device, dtype):
    w = mx_input(gen, dtype).to(device)
    codes, exps = nm.quantize_mxfp4(w)
    assert codes.dtype == exps.dtype == torch.uint8
    assert codes.shape == (3, 64, 256) and exps.shape == (3, 64, 16)
    w32 = w.float().cpu().numpy()
    codes_ref, exps_ref = ref_quantize_mxfp4(w32)
    assert np.array_equal(exps.cpu().numpy(), exps_ref)
    assert np.array_equal(codes.cpu().numpy(), codes_ref)
    assert not codes[0, 0, :16].any() and exps[0, 0, 0] == 0  # all-zero group: e = -127

    deq = nm.dequantize_mxfp4(codes, exps)
    assert deq.dtype == torch.float32
    deq64 = deq.cpu().double().numpy()
    assert np.isfinite(deq64).all()
    assert np.array_equal(deq64, ml_dequantize_mxfp4(codes.cpu().numpy(), exps.cpu().numpy()))

    # Round trip: within half the local E2M1 spacing times 2^e; beyond 6 it saturates to 6.
    scale = np.repeat(np.ldexp(1.0, exps_ref.astype(np.int64) - 127), 32, axis=-1)
    a = np.abs(w32.astype(np.float64)) / scale
    half_step = np.where(a < 2, 0.25, np.where(a < 4, 0.5, 1.0))
    bound = np.where(a > 6, a - 6, half_step) * scale
    assert (np.abs(w32 - deq64) <= bound).all()
    assert (a < 8).all()


@pytest.mark.parametrize("device", DEVICES)
def test_mxfp4_ties_to_even(gen, device):
    # amax in [4, 8) -> e = 0, so these are the scaled values; each sits exactly between two points.
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0]
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]  # even mantissa; 7 would round to 8: saturates
    row = torch.zeros(32)
    row[:8], row[8:16] = torch.tensor(ties), -torch.tensor(ties)
    binade = torch.randint(-100, 100, (1,), generator=gen).item()  # same ties at any exponent
    w = torch.ldexp(row, torch.tensor(binade)).reshape(1, 32).to(device)
    codes, exps = nm.quantize_mxfp4(w)
    assert exps.item() == 127 + binade
    got = nm.dequantize_mxfp4(codes, exps).cpu().double() * 2.0 ** -binade
    assert got[0, :8].tolist() == want and got[0, 8:16].tolist() == [-v for v in want]


def test_mxfp4_rejects_bad_input():
    codes, exps = nm.quantize_mxfp4(torch.ones(2, 64))
    with pytest.raises(ValueError):
        nm.dequantize_mxfp4(codes, torch.full_like(exps, 255))
    with pytest.raises(ValueError):
        nm.transform_weights(codes, torch.full_like(exps, 255))
    with pytest.raises(ValueError):
        nm.quantize_mxfp4(torch.ones(2, 48))
    with pytest.raises(ValueError):
        nm.quantize_mxfp4(torch.tensor([[float("inf")] + [0.0] * 31]))


# --- interleave and transform ---------------------------------------------------------------------

def test_interleave_rows(gen):
    I = 24
    t = torch.randint(0, 255, (2, 2 * I, 5), generator=gen, dtype=torch.uint8)
    out = nm.interleave_rows(t)
    src = [(8 * (p // 16) + p % 16) if p % 16 < 8 else I + 8 * (p // 16) + p % 16 - 8 for p in range(2 * I)]
    assert torch.equal(out, t[:, src])
    assert torch.equal(nm.deinterleave_rows(out), t)
    r = torch.randn(2, 2 * I, generator=gen)
    assert torch.equal(nm.interleave_rows(r, dim=-1), r[:, src])
    assert torch.equal(nm.deinterleave_rows(nm.interleave_rows(r, dim=-1), dim=-1), r)
    with pytest.raises(ValueError):
        nm.interleave_rows(torch.zeros(2, 20, 4))


def check_decode(tw, true_shift: np.ndarray):
    """decode_transformed == ml_dtypes E4M3 of e2m1 * 2^(unclamped shift), every element."""
    vals = ml_decode_e2m1(tw.codes.cpu().numpy())
    exact = vals.reshape(*true_shift.shape, -1) * np.ldexp(1.0, true_shift)[..., None]
    want = ml_e4m3(exact).reshape(vals.shape)
    assert np.array_equal(nm.decode_transformed(tw).cpu().double().numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleave", [False, True])
def test_transform_exact_when_unclamped(gen, device, interleave):
    G, N, K = 2, 32, 256
    # Each group's amax is 5 * 2^k (so e = k), k in [-14, 0] and k = 0 for group 0: shifts cover
    # [-8, 6] and nothing is clamped.
    w = torch.randn(G, N, K // 32, 32, generator=gen)
    k = log_spread(gen, (G, N, K // 32), -14, 0)
    k[..., 0] = 1
    w = (w / w.abs().amax(-1, keepdim=True) * 5 * k[..., None]).flatten(-2)
    codes, exps = nm.quantize_mxfp4(w.to(device))
    tw = nm.transform_weights(codes, exps, gate_up_interleave=interleave)
    assert tw.n_clamped == 0 and tw.gate_up_interleave == interleave
    assert tw.codes.dtype == torch.uint8 and tw.shift.dtype == torch.int8 and tw.row_scale.dtype == torch.float32
    order = nm.interleave_rows if interleave else (lambda t, dim=-2: t)
    assert torch.equal(tw.codes, order(codes))
    e = order(exps.long())
    base = e.amax(-1)
    assert torch.equal(tw.shift.long(), e - base[..., None] + 6)
    assert int(tw.shift.min()) >= nm.MIN_EXACT_SHIFT and (tw.shift.amax(-1) == nm.MAX_SHIFT).all()
    assert np.array_equal(tw.row_scale.cpu().double().numpy(), np.ldexp(1.0, base.cpu().numpy() - 133))
    check_decode(tw, tw.shift.cpu().numpy().astype(np.int64))
    want = order(nm.dequantize_mxfp4(codes, exps)).double()
    got = nm.dequantize_transformed(tw)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    if interleave:
        assert torch.equal(nm.deinterleave_rows(tw.codes), codes)


@pytest.mark.parametrize("device", DEVICES)
def test_transform_clamped_groups(gen, device):
    # Row 0: group offsets below the row max (in binades) 0, -14 (s=-8: exact), -15 (s=-9),
    # -20 (s=-14, stored -13) and an all-zero group (biased exponent 0).
    N, K = 8, 5 * 32
    offsets = torch.tensor([0, -14, -15, -20, 0])
    base = torch.randint(40, 200, (N, 1), generator=gen)
    exps = (base + offsets).to(torch.uint8)
    exps[0, 4] = 0
    exps[1:, 1:] = base[1:]  # other rows: nothing clamped
    codes = torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8)
    i = torch.arange(32) % 16
    codes[:, 16:48] = (i | ((15 - i) << 4)).to(torch.uint8)  # groups 1, 2: every code in both nibbles
    codes[0, 64:80] = 0
    tw = nm.transform_weights(codes.to(device), exps.to(device))
    assert tw.n_clamped == 2  # -15 and -20; the all-zero group is exact (not counted)
    true_shift = exps.long().numpy() - base.numpy() + 6
    assert np.array_equal(tw.shift.cpu().numpy(), np.maximum(true_shift, nm.MIN_SHIFT))
    assert tw.shift[0].tolist() == [6, -8, -9, -13, -13]
    check_decode(tw, true_shift)  # storing -13 for -14 changes nothing: all round to 0
    dec = nm.decode_transformed(tw).cpu()
    assert not dec[0, 96:].any()  # s <= -13: every value is 0
    ok = true_shift[..., None].repeat(32, -1).reshape(N, K) >= nm.MIN_EXACT_SHIFT
    exact = torch.from_numpy(ml_dequantize_mxfp4(codes.numpy(), exps.numpy()))
    assert torch.equal(nm.dequantize_transformed(tw).cpu()[ok], exact[ok])
    # s = -9 is lossy: the 0.5 magnitude (a tie with 0 in E4M3) rounds to 0.
    g2 = torch.from_numpy(ml_decode_e2m1(codes[0:1, 32:48].numpy()))[0]
    assert (dec[0, 64:96][g2.abs() == 0.5] == 0).all() and (g2.abs() == 0.5).any()


def test_n_clamped_counts_only_lossy_groups():
    """An all-zero group (codes +0 or -0) far below the row max decodes exactly: not clamped; a group
    with a non-zero code at the same shift is."""
    K = 4 * 32
    exps = torch.tensor([[150, 150 - 20, 150 - 20, 150 - 20]], dtype=torch.uint8)
    codes = torch.full((1, K // 2), 0x21, dtype=torch.uint8)  # codes 1 (0.5) and 2 (1.0)
    codes[0, 16:32] = 0x00      # group 1: all +0
    codes[0, 32:48] = 0x88      # group 2: all -0
    codes[0, 48:64] = 0x00      # group 3: zeros but one 0.5
    codes[0, 63] = 0x10
    tw = nm.transform_weights(codes, exps)
    assert tw.shift[0].tolist()[1:] == [max(nm.MAX_SHIFT - 20, nm.MIN_SHIFT)] * 3
    assert tw.n_clamped == 1  # group 3 only
    assert not nm.decode_transformed(tw)[0, 32:96].any()  # groups 1, 2 decode to (+-)0: exact
    # odd group size (groups straddle bytes): the per-nibble path
    tw_odd = nm.transform_weights(torch.zeros(1, 3, dtype=torch.uint8), torch.tensor([[150, 100]], dtype=torch.uint8))
    assert tw_odd.n_clamped == 0
    c = torch.zeros(1, 3, dtype=torch.uint8)
    c[0, 2] = 0x10  # element 5 (group 1) is 0.5
    assert nm.transform_weights(c, torch.tensor([[150, 100]], dtype=torch.uint8)).n_clamped == 1


def test_n_clamped_random_construction(gen):
    G, N, NG = 4, 16, 12
    offsets = torch.randint(-40, 1, (G, N, NG), generator=gen)
    offsets[..., 0] = 0  # the row max
    base = torch.randint(60, 254, (G, N, 1), generator=gen)
    exps = (base + offsets).clamp_min(0).to(torch.uint8)
    codes = torch.randint(0, 256, (G, N, NG * 16), generator=gen, dtype=torch.uint8)
    tw = nm.transform_weights(codes, exps, gate_up_interleave=True)
    nonzero = ((codes & 0x77) != 0).unflatten(-1, (NG, 16)).any(-1)
    below = (base + offsets).clamp_min(0) - base < nm.MIN_EXACT_SHIFT - nm.MAX_SHIFT
    assert tw.n_clamped == int((below & nonzero).sum())
    assert int(tw.shift.min()) >= nm.MIN_SHIFT
    check_decode(tw, nm.interleave_rows(exps.long() - base).numpy() + 6)
