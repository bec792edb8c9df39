"""GPU entry points of fp4_gemm (ctypes launchers over libfp4_gemm.so).

Inputs are torch CUDA tensors or CuPy arrays; outputs are allocated with the input's framework.
Every argument is checked here (dtype, shape, device, strides, alignment) and again in C.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import _arrays as A
from ._lib import LIB

GROUP = 128  # channels per activation scale (the DeepEP convention on Hopper)


def quantize_fp8_cuda(x, gran: int = GROUP, pow2: bool = False):
    """BF16 [T, H] (CuPy: uint16 raw BF16 bits) -> (E4M3 [T, H], FP32 scales [T, H/128])."""
    if gran != GROUP:
        raise ValueError(f"gran: the CUDA quantiser supports gran={GROUP} only, got {gran}")
    xv = A.view(x, "x")
    A.check(xv, "x", ("bf16", "u16"), ndim=2)
    T, H = xv.shape
    if H % GROUP:
        raise ValueError(f"x: hidden size {H} is not a multiple of {GROUP}")
    if xv.strides[1] != 1:
        raise ValueError(f"x: the last dimension must be contiguous (strides {xv.strides})")
    if T > 1 and xv.strides[0] % 4:
        raise ValueError(f"x: row stride {xv.strides[0]} must be a multiple of 4 elements")
    if xv.ptr % 8:
        raise ValueError("x: data pointer must be 8-byte aligned")
    q = A.empty_like_framework(xv, (T, H), "fp8")
    s = A.empty_like_framework(xv, (T, H // GROUP), "f32")
    qv, sv = A.view(q, "q"), A.view(s, "scales")
    LIB.call("fp4g_quantize_fp8", xv.ptr, qv.ptr, sv.ptr, T, H, xv.strides[0] if T > 1 else H,
             int(bool(pow2)), A.stream_of(xv))
    return q, s


BLOCK_NS = (8, 16, 32, 64, 128)
_LAYOUT = {"contiguous": 0, "masked": 1}
_err_words: dict = {}


@dataclass
class PackedWeights:
    """Device-resident transformed weights in the kernel's chunk order (see layout.cuh)."""
    packed: object      # uint8 [G, N/128, K/128, chunk]
    row_scale: object   # float32 [G, N]
    num_groups: int
    n: int
    k: int
    gate_up_interleave: bool = False


def prepare_weights(tw, device="cuda") -> PackedWeights:
    """TransformedWeights (fp4_gemm.numerics.transform_weights, [G, N, K/2]) -> PackedWeights on `device`."""
    import torch
    from .layout import pack_weights
    codes, shift = tw.codes, tw.shift
    if codes.dim() == 2:
        codes, shift = codes[None], shift[None]
    G, N, K = codes.shape[0], codes.shape[1], codes.shape[2] * 2
    packed = pack_weights(codes.to(device), shift.to(device))
    row_scale = tw.row_scale.reshape(G, N).to(device=device, dtype=torch.float32).contiguous()
    return PackedWeights(packed.contiguous(), row_scale, G, N, K, bool(getattr(tw, "gate_up_interleave", False)))


def _error_word(a: A.DevArray):
    key = (a.framework, a.device)
    if key not in _err_words:
        if a.framework == "torch":
            import torch
            _err_words[key] = torch.zeros(1, dtype=torch.int32, device=f"cuda:{a.device}")
        else:
            import cupy
            with cupy.cuda.Device(a.device):
                _err_words[key] = cupy.zeros(1, dtype=cupy.int32)
    return _err_words[key]


_KERNEL_ERRORS = {1: "a math warpgroup timed out waiting for data (pipeline stalled)",
                  2: "the producer timed out waiting for a free pipeline stage"}


def check_errors():
    """Raise if any GEMM launched so far reported a device-side error (synchronises). Clears it."""
    for key, w in _err_words.items():
        code = int(w[0].item()) if key[0] == "torch" else int(w[0].get())
        if code:
            w.fill(0)
            raise RuntimeError(f"fp4_gemm kernel error on device {key[1]}: {_KERNEL_ERRORS.get(code, code)}")


def pick_block_n(expected_m: int) -> int:
    for b in BLOCK_NS:
        if expected_m <= b:
            return b
    return BLOCK_NS[-1]


def grouped_gemm(x, x_scales, w: PackedWeights, *, group_offsets=None, masked_m=None, block_n=None,
                 out=None):
    """FP8 x MXFP4 grouped GEMM, BF16 output: out[r] = W_g @ (x[r] * scale) for the rows r of group g.

    Contiguous: x [M, K] (groups are row segments), group_offsets int32 [G + 1] on the GPU.
    Masked:     x [G, max_m, K], masked_m int32 [G] on the GPU (valid rows per group).
    x: FP8 E4M3 (CuPy: uint8), x_scales FP32 [..., K/128]. No host synchronisation.
    """
    if (group_offsets is None) == (masked_m is None):
        raise ValueError("pass exactly one of group_offsets (contiguous) or masked_m (masked)")
    masked = masked_m is not None
    xv, sv = A.view(x, "x"), A.view(x_scales, "x_scales")
    A.check(xv, "x", ("fp8", "u8"), ndim=3 if masked else 2, contiguous=True)
    A.check(sv, "x_scales", ("f32",), ndim=3 if masked else 2, contiguous=True)
    gv = A.view(masked_m if masked else group_offsets, "masked_m" if masked else "group_offsets")
    A.check(gv, "masked_m" if masked else "group_offsets", ("i32",), ndim=1, contiguous=True)
    pv, rv = A.view(w.packed, "w.packed"), A.view(w.row_scale, "w.row_scale")
    A.same_device(xv, sv, gv, pv, rv)
    G, N, K = w.num_groups, w.n, w.k
    if xv.shape[-1] != K:
        raise ValueError(f"x: last dimension {xv.shape[-1]} != weights' K {K}")
    if tuple(sv.shape) != tuple(xv.shape[:-1]) + (K // GROUP,):
        raise ValueError(f"x_scales: expected shape {tuple(xv.shape[:-1]) + (K // GROUP,)}, got {sv.shape}")
    if masked:
        if xv.shape[0] != G or gv.shape[0] != G:
            raise ValueError(f"x / masked_m: expected {G} groups, got {xv.shape[0]} / {gv.shape[0]}")
        max_m = xv.shape[1]
        rows = G * max_m
        out_shape = (G, max_m, N)
    else:
        if gv.shape[0] != G + 1:
            raise ValueError(f"group_offsets: expected {G + 1} entries, got {gv.shape[0]}")
        max_m = 0
        rows = xv.shape[0]
        out_shape = (rows, N)
    if block_n is None:
        block_n = pick_block_n(max_m if masked else -(-rows // max(G, 1)))
    if block_n not in BLOCK_NS:
        raise ValueError(f"block_n: must be one of {BLOCK_NS}, got {block_n}")
    if out is None:
        out = A.empty_like_framework(xv, out_shape, "bf16")
    ov = A.view(out, "out")
    A.check(ov, "out", ("bf16", "u16"), contiguous=True)
    if tuple(ov.shape) != out_shape:
        raise ValueError(f"out: expected shape {out_shape}, got {ov.shape}")
    err = A.view(_error_word(xv), "err")
    LIB.call("fp4g_grouped_gemm_bf16", xv.ptr, sv.ptr, pv.ptr, rv.ptr, gv.ptr, ov.ptr, _LAYOUT["masked" if masked else "contiguous"],
             G, rows, max_m, N, K, block_n, 0, err.ptr, A.stream_of(xv))
    return out
