"""On a machine (or torch build) without CUDA the GPU entry points raise NoCudaDeviceError naming the
call, not torch's AssertionError; zero tokens quantise to empty outputs on both paths."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fp4_gemm
from fp4_gemm import NoCudaDeviceError, numerics as nm, ops
from fp4_gemm._native import require_cuda_device

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA errors")


class _FakeLib:
    """Library stand-in: loads, but any launch fails the test."""
    def require(self):
        pass

    def call(self, name, *args):
        raise AssertionError(f"{name} launched")


@no_cuda
def test_prepare_weights_without_cuda():
    tw = nm.transform_weights(*nm.quantize_mxfp4(torch.randn(2, 128, 128)))
    with pytest.raises(NoCudaDeviceError, match="prepare_weights.*no CUDA device"):
        ops.prepare_weights(tw)
    with pytest.raises(NoCudaDeviceError, match="prepare_weights"):
        ops.prepare_weights(tw, device="cuda:0")


@no_cuda
def test_gemm_and_quantiser_without_cuda(monkeypatch):
    monkeypatch.setattr(ops, "LIB", _FakeLib())
    x = torch.zeros(4, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(NoCudaDeviceError, match="grouped_gemm"):
        ops.grouped_gemm(x, torch.ones(4, 1), None, group_offsets=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(NoCudaDeviceError, match="grouped_gemm_l1"):
        ops.grouped_gemm_l1(x, torch.ones(4, 1), ops.PackedWeights(None, None, 1, 128, 128, True),
                            torch.ones(4), group_offsets=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(NoCudaDeviceError, match="quantize_fp8"):
        ops.quantize_fp8_cuda(torch.zeros(4, 128, dtype=torch.bfloat16))


@no_cuda
def test_require_cuda_device_helper():
    import symm_comm
    with pytest.raises(symm_comm.NoCudaDeviceError, match="symm_comm.Buffer: no CUDA device"):
        symm_comm.require_cuda_device("symm_comm.Buffer")
    # each package loads its own copy of packages/common/native_loader.py (like KernelsNotBuiltError)
    assert issubclass(NoCudaDeviceError, RuntimeError) and issubclass(symm_comm.NoCudaDeviceError, RuntimeError)
    require_cuda_device("x", "cpu")  # a non-CUDA device passes


@pytest.mark.parametrize("shape", [(0, 256), (3, 0, 128)])
def test_quantize_zero_tokens_cpu(shape):
    q, s = fp4_gemm.quantize_fp8(torch.randn(shape).bfloat16())
    assert q.dtype == torch.float8_e4m3fn and q.shape == shape
    assert s.dtype == torch.float32 and s.shape == shape[:-1] + (shape[-1] // 128,)


class _CaiArray:
    """A CUDA-array-interface object (what CuPy passes) with odd strides, as an empty slice may have."""
    def __init__(self, shape, typestr, strides):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False),
                                         "strides": strides, "version": 3}


def test_quantize_zero_tokens_cuda_path_launches_nothing(monkeypatch):
    """The CUDA path with T = 0: empty (0, H) / (0, H/128) outputs, no launch, no stride or alignment error."""
    monkeypatch.setattr(ops, "LIB", _FakeLib())
    made = []

    def empty(a, shape, kind):
        made.append((tuple(shape), kind))
        return np.empty(shape, dtype={"fp8": np.uint8, "f32": np.float32}[kind])

    monkeypatch.setattr(ops.A, "empty_like_framework", empty)
    q, s = ops.quantize_fp8_cuda(_CaiArray((0, 512), "<u2", (6, 2)))  # row stride 3 elements, pointer 0
    assert q.shape == (0, 512) and s.shape == (0, 4)
    assert made == [((0, 512), "fp8"), ((0, 4), "f32")]
    with pytest.raises(ValueError, match="multiple of 128"):  # the shape checks still run
        ops.quantize_fp8_cuda(_CaiArray((0, 100), "<u2", None))
