"""Grouped FP8 x MXFP4 GEMM on the GPU against the float64 reference (same quantised inputs)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

from fp4_gemm import ops, quantize_fp8  # noqa: E402

from gemm_cases import (fresh_generator, gemm_error_bound, gemm_reference, random_tokens, random_weights,  # noqa: E402
                        reference_bf16_step_check)

POISON = 0x7FC1  # a BF16 NaN: any element the kernel fails to write stays NaN


CONTIGUOUS_CASES = [
    # (G, N, K, group sizes)
    (1, 128, 128, [1]),
    (3, 256, 256, [0, 37, 130]),
    (8, 384, 512, [5, 0, 0, 200, 17, 64, 1, 129]),
    (16, 256, 1024, "random"),
    (64, 128, 256, "random"),
    (4, 7168, 256, [300, 0, 77, 1]),
    (2, 256, 7168, [513, 2]),
    (3, 512, 384, [4096, 9, 1000]),
    # the scheduler's shared-memory unit table across all 12 warps of its build (> 96 groups), and the
    # plain walk beyond its 1024 groups
    (300, 128, 128, "random40"),
    (1100, 128, 128, "random40"),
]


@pytest.mark.parametrize("G,N,K,sizes", CONTIGUOUS_CASES)
@pytest.mark.parametrize("block_n", [None, 8, 16, 32, 64, 128])  # every kernel configuration
def test_contiguous(G, N, K, sizes, block_n):
    gen = fresh_generator()
    if sizes in ("random", "random40"):
        sizes = torch.randint(0, 300 if sizes == "random" else 40, (G,), generator=gen).tolist()
        sizes[0] = 0
    tw, pw = random_weights(G, N, K, gen)
    M = sum(sizes)
    if M == 0:
        pytest.skip("no rows")
    x = random_tokens(M, K, gen)
    xq, xs = quantize_fp8(x)
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    out = torch.full((M, N), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=block_n, out=out)
    torch.cuda.synchronize()
    ops.check_errors()
    starts = offs.tolist()
    groups = [(g, starts[g], sizes[g]) for g in range(G)]
    ref = gemm_reference(xq, xs, tw, groups)
    reference_bf16_step_check(out, ref, f"contiguous G={G} N={N} K={K} block_n={block_n}",
                              gemm_error_bound(xq, xs, tw, groups))


@pytest.mark.parametrize("G,N,K,max_m", [(4, 256, 512, 8), (32, 384, 256, 16), (6, 256, 1024, 200), (2, 128, 7168, 64)])
@pytest.mark.parametrize("block_n", [None, 128])  # 128: the kRegs kernel (2-CTA clusters with FP4_TOKEN_MULTICAST)
def test_masked(G, N, K, max_m, block_n):
    gen = fresh_generator()
    tw, pw = random_weights(G, N, K, gen)
    m = torch.randint(0, max_m + 1, (G,), generator=gen)
    m[0] = 0
    m[-1] = max_m
    x = random_tokens(G * max_m, K, gen)
    xq, xs = quantize_fp8(x)
    out = torch.empty((G, max_m, N), dtype=torch.int16, device="cuda").fill_(POISON).view(torch.bfloat16)
    ops.grouped_gemm(xq.view(G, max_m, K), xs.view(G, max_m, K // 128), pw,
                     masked_m=m.to(torch.int32).cuda(), out=out, block_n=block_n)
    torch.cuda.synchronize()
    ops.check_errors()
    groups = [(g, g * max_m, int(m[g])) for g in range(G)]
    ref = gemm_reference(xq, xs, tw, groups).view(G, max_m, N)
    bound = gemm_error_bound(xq, xs, tw, groups).view(G, max_m, N)
    for g in range(G):
        mg = int(m[g])
        if mg:
            reference_bf16_step_check(out[g, :mg], ref[g, :mg], f"masked g={g}", bound[g, :mg])
        # rows past masked_m are not touched
        assert torch.isnan(out[g, mg:].float()).all(), f"masked g={g}: wrote rows past masked_m"


def test_cupy_arrays():
    cp = pytest.importorskip("cupy")
    gen = fresh_generator()
    G, N, K = 3, 256, 256
    tw, pw = random_weights(G, N, K, gen)
    sizes = [10, 0, 21]
    x = random_tokens(31, K, gen)
    xq, xs = quantize_fp8(x)
    offs = torch.tensor([0, 10, 10, 31], dtype=torch.int32, device="cuda")
    cpw = ops.PackedWeights(cp.asarray(pw.packed), cp.asarray(pw.row_scale), G, N, K)
    out = ops.grouped_gemm(cp.asarray(xq.view(torch.uint8)), cp.asarray(xs), cpw, group_offsets=cp.asarray(offs))
    cp.cuda.get_current_stream().synchronize()
    out_t = torch.as_tensor(out, device="cuda").view(torch.bfloat16)
    ref = gemm_reference(xq, xs, tw, [(0, 0, 10), (1, 10, 0), (2, 10, 21)])
    reference_bf16_step_check(out_t, ref, "cupy")


def test_bad_arguments():
    gen = fresh_generator()
    tw, pw = random_weights(2, 128, 256, gen)
    xq, xs = quantize_fp8(random_tokens(4, 256, gen))
    offs = torch.tensor([0, 2, 4], dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="x"):
        ops.grouped_gemm(xq.float(), xs, pw, group_offsets=offs)
    with pytest.raises(ValueError, match="x_scales"):
        ops.grouped_gemm(xq, xs[:, :1].contiguous(), pw, group_offsets=offs)
    with pytest.raises(ValueError, match="group_offsets"):
        ops.grouped_gemm(xq, xs, pw, group_offsets=offs[:2])
    with pytest.raises(ValueError, match="CUDA"):
        ops.grouped_gemm(xq.cpu(), xs, pw, group_offsets=offs)
    with pytest.raises(ValueError, match="block_n"):
        ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=24)
    with pytest.raises(ValueError, match="w.packed"):  # weights that do not match (G, N, K)
        ops.grouped_gemm(xq, xs, ops.PackedWeights(pw.packed, pw.row_scale, 2, 256, 256), group_offsets=offs)
    with pytest.raises(TypeError, match="w.row_scale"):
        ops.grouped_gemm(xq, xs, ops.PackedWeights(pw.packed, pw.row_scale.double(), 2, 128, 256), group_offsets=offs)
    # An output whose data pointer is not 16-byte aligned (the staged epilogue stores 16-byte pieces).
    base = torch.empty(4 * 128 + 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="out"):
        ops.grouped_gemm(xq, xs, pw, group_offsets=offs, out=base[1:1 + 4 * 128].view(4, 128))
