"""fp4_gemm: MXFP4 utilities and FP8 x MXFP4 grouped GEMMs for Hopper (sm_90a).

Pure-Python numerics (torch, CPU or GPU) live in `fp4_gemm.numerics`; CUDA launchers in
`fp4_gemm.ops`. `quantize_fp8` dispatches: CUDA tensors / CuPy arrays run the kernel, CPU
tensors the reference; both give bitwise-equal results.
"""
from __future__ import annotations

from ._native import KernelsNotBuiltError, NoCudaDeviceError
from . import _arrays

__all__ = ["quantize_fp8", "KernelsNotBuiltError", "NoCudaDeviceError"]

try:  # torch.library ops (torch.compile / CUDA graphs); torch is optional for the package
    from . import torch_ops  # noqa: F401
except ImportError:  # pragma: no cover
    pass


def quantize_fp8(x, gran: int = 128, pow2: bool = False):
    """Per-token, per-`gran`-channel FP8 E4M3 quantisation -> (codes, FP32 scales). Zero tokens
    (x of shape [0, H]) give empty outputs on either path (the CUDA path launches nothing)."""
    if _arrays.is_torch(x) and not x.is_cuda:
        from .numerics import quantize_fp8 as ref
        return ref(x, gran=gran, pow2=pow2)
    from .ops import quantize_fp8_cuda
    return quantize_fp8_cuda(x, gran=gran, pow2=pow2)
