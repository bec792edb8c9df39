"""The torch.library registrations: fake implementations give the right shapes/dtypes without a
GPU (what torch.compile traces with); on a GPU the ops run under torch.compile and in a CUDA graph
and match the eager results bitwise."""
from __future__ import annotations


import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import fp4_gemm  # noqa: F401  (registers the ops)


def test_fake_shapes():
    with FakeTensorMode():
        x = torch.empty(37, 256, dtype=torch.float8_e4m3fn)
        s = torch.empty(37, 2)
        packed = torch.empty(3, 2, 2, 8704, dtype=torch.uint8)
        rs = torch.empty(3, 256)
        offs = torch.empty(4, dtype=torch.int32)
        out = torch.ops.fp4_gemm.grouped_gemm_contiguous(x, s, packed, rs, offs, 256, 256, 0)
        assert out.shape == (37, 256) and out.dtype == torch.bfloat16
        xm = torch.empty(3, 16, 256, dtype=torch.float8_e4m3fn)
        om = torch.ops.fp4_gemm.grouped_gemm_masked(xm, torch.empty(3, 16, 2), packed, rs,
                                                    torch.empty(3, dtype=torch.int32), 256, 256, 0)
        assert om.shape == (3, 16, 256)
        lq, ls = torch.ops.fp4_gemm.grouped_gemm_l1_contiguous(x, s, packed, rs, torch.empty(37), offs, 256, 256)
        assert lq.shape == (37, 128) and lq.dtype == torch.float8_e4m3fn and ls.shape == (37, 1)  # one per 128
        q, qs = torch.ops.fp4_gemm.quantize_fp8(torch.empty(5, 384, dtype=torch.bfloat16), False)
        assert q.shape == (5, 384) and q.dtype == torch.float8_e4m3fn and qs.shape == (5, 3)


@pytest.mark.gpu
def test_compile_and_cuda_graph():
    from gemm_cases import fresh_generator, random_tokens, random_weights
    gen = fresh_generator()
    tw, pw = random_weights(4, 256, 512, gen)
    x = random_tokens(100, 512, gen)
    offs = torch.tensor([0, 30, 30, 99, 100], dtype=torch.int32, device="cuda")

    def layer(x):
        q, s = torch.ops.fp4_gemm.quantize_fp8(x, False)
        return torch.ops.fp4_gemm.grouped_gemm_contiguous(q, s, pw.packed, pw.row_scale, offs, 256, 512, 0)

    eager = layer(x)
    compiled = torch.compile(layer, fullgraph=True)(x)
    assert torch.equal(eager.view(torch.int16), compiled.view(torch.int16))
    g = torch.cuda.CUDAGraph()
    static_x = x.clone()
    layer(static_x)  # warm up outside capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        static_out = layer(static_x)
    x2 = random_tokens(100, 512, gen)
    static_x.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out.view(torch.int16), layer(x2).view(torch.int16))
