"""Grouped GEMM with the L1 (SwiGLU x top-k weight -> FP8) epilogue against the reference recipe."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

from fp4_gemm import ops, quantize_fp8  # noqa: E402
from gemm_cases import fresh_generator, check_l1, l1_reference, random_tokens, random_weights  # noqa: E402


@pytest.mark.parametrize("G,I,K,sizes,block_n", [(4, 128, 512, [0, 37, 130, 5], None), (2, 384, 7168, [70, 9], None),
                                                 (8, 64, 256, [1, 0, 300, 64, 65, 0, 7, 128], None),
                                                 # 3 weight n-blocks (odd: a 2-CTA cluster's dummy tile), 128 tokens
                                                 (5, 192, 1024, [0, 200, 5, 129, 0], 128),
                                                 # 134 tile pairs (> the ~66 clusters): CTAs run several pairs,
                                                 # dummy tiles between real ones (L1 buffer parity skips them)
                                                 (4, 192, 512, [4000, 3000, 1000, 300], 128)])
@pytest.mark.parametrize("clamp,pow2", [(float("inf"), False), (1.0, False), (float("inf"), True)])
def test_l1_contiguous(G, I, K, sizes, block_n, clamp, pow2):
    gen = fresh_generator()
    tw, pw = random_weights(G, 2 * I, K, gen, gate_up=True)
    M = sum(sizes)
    x = random_tokens(M, K, gen)
    xq, xs = quantize_fp8(x)
    w = (torch.rand(M, generator=gen) + 0.05).cuda()
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q, s = ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, activation_clamp=clamp, pow2=pow2,
                               block_n=block_n)
    torch.cuda.synchronize()
    ops.check_errors()
    assert q.shape == (M, I) and s.shape == (M, I // 64)
    st = offs.tolist()
    q_ref, s_ref, bound = l1_reference(xq, xs, tw, [(g, st[g], sizes[g]) for g in range(G)], w, clamp, pow2,
                                       with_bound=True)
    print(check_l1(q.view(torch.uint8), s, q_ref, s_ref, f"G={G} I={I} K={K} clamp={clamp} pow2={pow2}", bound))


def test_l1_masked():
    gen = fresh_generator()
    G, I, K, max_m = 3, 256, 1024, 40
    tw, pw = random_weights(G, 2 * I, K, gen, gate_up=True)
    m = torch.tensor([0, 40, 17], dtype=torch.int32)
    xq, xs = quantize_fp8(random_tokens(G * max_m, K, gen))
    w = (torch.rand(G * max_m, generator=gen) + 0.05).cuda()
    q, s = ops.grouped_gemm_l1(xq.view(G, max_m, K), xs.view(G, max_m, K // 128), pw, w.view(G, max_m),
                               masked_m=m.cuda())
    torch.cuda.synchronize()
    ops.check_errors()
    q_ref, s_ref, bound = l1_reference(xq, xs, tw, [(g, g * max_m, int(m[g])) for g in range(G)], w, with_bound=True)
    q, s = q.view(torch.uint8).view(G * max_m, I), s.view(G * max_m, I // 64)
    valid = torch.cat([torch.arange(g * max_m, g * max_m + int(m[g])) for g in range(G)])
    check_l1(q[valid], s[valid], q_ref[valid], s_ref[valid], "masked", bound[valid])


def test_l1_needs_interleaved_weights():
    gen = fresh_generator()
    _, pw = random_weights(1, 256, 256, gen, gate_up=False)
    xq, xs = quantize_fp8(random_tokens(4, 256, gen))
    with pytest.raises(ValueError, match="gate_up_interleave"):
        ops.grouped_gemm_l1(xq, xs, pw, torch.ones(4, device="cuda"),
                            group_offsets=torch.tensor([0, 4], dtype=torch.int32, device="cuda"))
