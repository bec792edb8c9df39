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


def test_abi_mismatch_is_named():
    """A library that loads but implements another C ABI than the package mirrors is refused by name."""
    from pathlib import Path
    lib = NativeLib("fp4_gemm", Path(fp4_gemm.__file__).parent, {}, "fp4g_error_string", abi=("fp4g_abi_version", -1))
    if not lib.available():
        pytest.skip("libfp4_gemm.so not built")
    with pytest.raises(KernelsNotBuiltError, match="implements ABI [0-9]+, this package needs -1"):
        lib.require()


def test_gpu_entry_points_raise_before_work(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "LIB", NativeLib("no_such_pkg", tmp_path, {}, "no_such_fn"))
    with pytest.raises(KernelsNotBuiltError):
        ops.quantize_fp8_cuda(object())
    with pytest.raises(KernelsNotBuiltError):
        ops.grouped_gemm(object(), object(), None, group_offsets=object())
    q, s = fp4_gemm.quantize_fp8(torch.randn(3, 256).bfloat16())  # CPU reference still works
    assert q.shape == (3, 256) and s.shape == (3, 2)


def test_weight_buffers_must_match_the_shape():
    """The kernel trusts (G, N, K): packed buffers of another shape or dtype are refused up front."""
    from fp4_gemm._arrays import DevArray
    def dev(shape, kind, itemsize):
        strides, acc = [], 1
        for n in reversed(shape):
            strides.insert(0, acc)
            acc *= n
        return DevArray(None, "torch", 256, tuple(shape), tuple(strides), itemsize, kind, 0)
    w = ops.PackedWeights(None, None, 2, 256, 384)
    ops._check_weights(w, dev((2, 2, 3, 8704), "u8", 1), dev((2, 256), "f32", 4))
    with pytest.raises(ValueError, match="w.packed"):
        ops._check_weights(w, dev((2, 2, 2, 8704), "u8", 1), dev((2, 256), "f32", 4))
    with pytest.raises(TypeError, match="w.row_scale"):
        ops._check_weights(w, dev((2, 2, 3, 8704), "u8", 1), dev((2, 256), "bf16", 2))
    with pytest.raises(ValueError, match="N=100"):
        ops._check_weights(ops.PackedWeights(None, None, 2, 100, 384), dev((1,), "u8", 1), dev((1,), "f32", 4))
