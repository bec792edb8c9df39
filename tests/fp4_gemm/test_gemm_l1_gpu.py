"""Grouped GEMM with the L1 (SwiGLU x top-k weight -> FP8) epilogue against the reference recipe."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

from fp4_gemm import ops, quantize_fp8  # noqa: E402
from gemm_cases import (fresh_generator, check_l1, gemm_reference, l1_reference, random_tokens,  # noqa: E402
                        random_weights)


@pytest.mark.parametrize("G,I,K,sizes,block_n", [(4, 128, 512, [0, 37, 130, 5], None), (2, 384, 7168, [70, 9], None),
                                                 (8, 128, 256, [1, 0, 300, 64, 65, 0, 7, 128], None),
                                                 (3, 256, 512, [9, 33, 1], 8), (3, 256, 512, [17, 3, 40], 16),
                                                 (3, 256, 512, [30, 64, 1], 32), (3, 256, 512, [100, 64, 1], 64),
                                                 # 3 n-block pairs (odd: a 2-CTA cluster's dummy pair), 128 tokens
                                                 (5, 384, 1024, [0, 200, 5, 129, 0], 128),
                                                 # many pair units (> the ~66 clusters): CTAs run several,
                                                 # dummy pairs between real ones
                                                 (4, 384, 512, [4000, 3000, 1000, 300], 128),
                                                 # the unit table across every warp of its build (> 96 groups)
                                                 (300, 128, 256, "random40", None)])
@pytest.mark.parametrize("clamp,pow2", [(float("inf"), False), (1.0, False), (float("inf"), True)])
def test_l1_contiguous(G, I, K, sizes, block_n, clamp, pow2):
    gen = fresh_generator()
    if sizes == "random40":
        sizes = torch.randint(0, 40, (G,), generator=gen).tolist()
    tw, pw = random_weights(G, 2 * I, K, gen, gate_up=True)
    M = sum(sizes)
    x = random_tokens(M, K, gen)
    xq, xs = quantize_fp8(x)
    w = (torch.rand(M, generator=gen) + 0.05).cuda()
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    q = torch.full((M, I), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)  # NaN poison
    s = torch.full((M, I // 128), float("nan"), device="cuda")
    q, s = ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, activation_clamp=clamp, pow2=pow2,
                               block_n=block_n, out=(q, s))
    torch.cuda.synchronize()
    ops.check_errors()
    assert q.shape == (M, I) and s.shape == (M, I // 128)
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
    q, s = q.view(torch.uint8).view(G * max_m, I), s.view(G * max_m, I // 128)
    valid = torch.cat([torch.arange(g * max_m, g * max_m + int(m[g])) for g in range(G)])
    check_l1(q[valid], s[valid], q_ref[valid], s_ref[valid], "masked", bound[valid])


def test_l1_needs_interleaved_weights():
    gen = fresh_generator()
    _, pw = random_weights(1, 256, 256, gen, gate_up=False)
    xq, xs = quantize_fp8(random_tokens(4, 256, gen))
    with pytest.raises(ValueError, match="gate_up_interleave"):
        ops.grouped_gemm_l1(xq, xs, pw, torch.ones(4, device="cuda"),
                            group_offsets=torch.tensor([0, 4], dtype=torch.int32, device="cuda"))


def test_l1_needs_128_channel_groups():
    gen = fresh_generator()
    _, pw = random_weights(1, 2 * 192, 256, gen, gate_up=True)
    xq, xs = quantize_fp8(random_tokens(4, 256, gen))
    with pytest.raises(ValueError, match="multiple of 128"):
        ops.grouped_gemm_l1(xq, xs, pw, torch.ones(4, device="cuda"),
                            group_offsets=torch.tensor([0, 4], dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("block_n", [8, 32, 128])
def test_group_counts_skip_padding(block_n):
    """A dispatch pool's layout: segments padded to 128 rows, group_counts the valid rows. The rows past
    a group's count are neither written (their poison survives) nor able to change the valid rows."""
    gen = fresh_generator()
    G, I, K = 3, 256, 512
    counts = [5, 0, 130]
    seg = [128 * ((c + 127) // 128) for c in counts]
    offs_l = [0] + torch.tensor(seg).cumsum(0).tolist()
    M = offs_l[-1]
    tw1, pw1 = random_weights(G, 2 * I, K, gen, gate_up=True)
    tw2, pw2 = random_weights(G, K, I, gen)
    x = random_tokens(M, K, gen)
    xq, xs = quantize_fp8(x)
    w = (torch.rand(M, generator=gen) + 0.05).cuda()
    offs = torch.tensor(offs_l, dtype=torch.int32, device="cuda")
    cnt = torch.tensor(counts, dtype=torch.int32, device="cuda")
    q = torch.full((M, I), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    s = torch.full((M, I // 128), float("nan"), device="cuda")
    ops.grouped_gemm_l1(xq, xs, pw1, w, group_offsets=offs, group_counts=cnt, block_n=block_n, out=(q, s))
    out = torch.full((M, K), 0x7FC1, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    # the L2 GEMM reads the L1 output as it stands (scales per 128 channels)
    ops.grouped_gemm(q, s, pw2, group_offsets=offs, group_counts=cnt, block_n=block_n, out=out)
    torch.cuda.synchronize()
    ops.check_errors()
    valid = torch.zeros(M, dtype=torch.bool)
    for g in range(G):
        valid[offs_l[g]:offs_l[g] + counts[g]] = True
    qc, sc, oc = q.view(torch.uint8).cpu(), s.cpu(), out.float().cpu()
    assert (qc[~valid] == 0x7F).all() and sc[~valid].isnan().all() and oc[~valid].isnan().all(), "padding rows written"
    groups = [(g, offs_l[g], counts[g]) for g in range(G)]
    q_ref, s_ref, bound = l1_reference(xq, xs, tw1, groups, w, with_bound=True)
    check_l1(qc[valid], sc[valid], q_ref[valid], s_ref[valid], f"counts block_n={block_n}", bound[valid])
    # K = I = 256 here: measured 98.8 % within one BF16 step (the 99 % bar of the large-K GEMM tests is
    # for K >= 512, where the per-128 promotion averages more)
    ref = gemm_reference(q.view(torch.float8_e4m3fn), s, tw2, groups)[valid].double()
    o = out[valid.cuda()].double().cpu()
    step = ref.to(torch.bfloat16).double().abs().clamp_min(2.0 ** -126) * 2.0 ** -7
    within = ((o - ref.to(torch.bfloat16).double()).abs() <= step * 1.0001).double().mean().item()
    rel = ((o - ref).norm() / ref.norm()).item()
    print(f"L2 on L1 output block_n={block_n}: within one BF16 step {within:.4f}, rel {rel:.2e}")
    assert torch.isfinite(o).all() and within >= 0.97 and rel <= 4e-3, (within, rel)
