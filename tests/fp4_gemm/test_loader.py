"""Without the CUDA library a GPU entry point raises KernelsNotBuiltError saying how to build,
before it touches its arguments; the pure-Python parts keep working."""
from __future__ import annotations

import pytest
import torch

import fp4_gemm
from fp4_gemm import ops
from fp4_gemm._native import KernelsNotBuiltError, NativeLib


def test_missing_library_message(tmp_path, monkeypatch):
    monkeypatch.setenv("MEGAMOE_LIB_DIR", str(tmp_path))
    lib = NativeLib("no_such_pkg", tmp_path, {}, "no_such_fn")
    assert not lib.available()
    with pytest.raises(KernelsNotBuiltError, match="not built") as e:
        lib.require()
    assert "nvcc" in str(e.value) and "MEGAMOE_LIB_DIR" in str(e.value)


def test_gpu_entry_points_raise_before_work(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "LIB", NativeLib("no_such_pkg", tmp_path, {}, "no_such_fn"))
    with pytest.raises(KernelsNotBuiltError):
        ops.quantize_fp8_cuda(object())
    with pytest.raises(KernelsNotBuiltError):
        ops.grouped_gemm(object(), object(), None, group_offsets=object())
    q, s = fp4_gemm.quantize_fp8(torch.randn(3, 256).bfloat16())  # CPU reference still works
    assert q.shape == (3, 256) and s.shape == (3, 2)
