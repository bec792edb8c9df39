"""The CUDA quantize_fp8 kernel, called with torch tensors and with CuPy arrays, must equal the
Python reference bitwise (codes and scales), including strided rows and power-of-two scales."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu

from fp4_gemm import numerics as nm  # noqa: E402
from fp4_gemm import quantize_fp8  # noqa: E402


def _x(T, H, gen):
    x = torch.randn(T, H, generator=gen) * torch.exp(3 * torch.randn(T, 1, generator=gen))
    x[0, :128] = 0.0                      # an all-zero group
    if T > 1:
        x[1, 128:256] *= 1e-30            # tiny magnitudes (BF16 keeps them)
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("T,H", [(1, 128), (7, 4096), (300, 7168), (2048, 1024)])
@pytest.mark.parametrize("pow2", [False, True])
def test_torch_bitwise(T, H, pow2):
    seed = int(os.environ.get("MEGAMOE_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    x = _x(T, H, torch.Generator().manual_seed(seed))
    q_ref, s_ref = nm.quantize_fp8(x, pow2=pow2)
    q, s = quantize_fp8(x.cuda(), pow2=pow2)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8)), f"seed={seed}: codes differ"
    assert torch.equal(s.cpu().view(torch.int32), s_ref.view(torch.int32)), f"seed={seed}: scales differ"


def test_strided_rows():
    seed = int(os.environ.get("MEGAMOE_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    big = _x(64, 1024, torch.Generator().manual_seed(seed)).cuda()
    x = big[:, 256:768]  # row stride 1024
    q, s = quantize_fp8(x)
    q_ref, s_ref = nm.quantize_fp8(x.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(s.cpu(), s_ref)


def test_cupy_bitwise():
    cp = pytest.importorskip("cupy")
    seed = int(os.environ.get("MEGAMOE_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    x = _x(33, 512, torch.Generator().manual_seed(seed))
    q_ref, s_ref = nm.quantize_fp8(x)
    xc = cp.asarray(x.view(torch.int16).numpy()).view(cp.uint16)  # raw BF16 bits
    q, s = quantize_fp8(xc)
    assert isinstance(q, cp.ndarray) and q.dtype == cp.uint8
    assert (cp.asnumpy(q) == q_ref.view(torch.uint8).numpy()).all(), f"seed={seed}: codes differ"
    assert (cp.asnumpy(s) == s_ref.numpy()).all(), f"seed={seed}: scales differ"


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="x: hidden size"):
        quantize_fp8(torch.zeros(2, 100, dtype=torch.bfloat16, device="cuda"))
    with pytest.raises(TypeError, match="x: expected dtype"):
        quantize_fp8(torch.zeros(2, 128, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="gran"):
        quantize_fp8(torch.zeros(2, 128, dtype=torch.bfloat16, device="cuda"), gran=64)
