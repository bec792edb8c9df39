"""GPU entry points of fp4_gemm (ctypes launchers over libfp4_gemm.so).

Inputs are torch CUDA tensors or CuPy arrays; outputs are allocated with the input's framework.
Every argument is checked here (dtype, shape, device, strides, alignment) and again in C.
"""
from __future__ import annotations

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
