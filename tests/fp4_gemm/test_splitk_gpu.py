"""Split-K of the few-token GEMMs (block_n 8 / 16 with a SplitKWorkspace) against the float64 reference:
calls with fewer tiles than CTAs, so the kernel splits K over several CTAs and the last one sums the
partials. Each case checks that the split really ran (the NaN-poisoned partials were written), that the
workspace's counters are zero again, and that two runs give the same bits (the sum order is fixed)."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

from fp4_gemm import ops, quantize_fp8  # noqa: E402
from fp4_gemm._lib import LIB  # noqa: E402

from gemm_cases import (check_l1, fresh_generator, gemm_error_bound, gemm_reference, l1_reference,  # noqa: E402
                        random_tokens, random_weights, reference_bf16_step_check)

POISON = 0x7FC1  # a BF16 NaN


def _splits(units, workers, k_blocks, slots):
    LIB.require()
    return LIB.lib.fp4g_splitk_splits(units, workers, k_blocks, slots)


@pytest.mark.parametrize("units,workers,k_blocks,slots,want", [
    (96, 264, 32, 1056, 2),    # flash L1 at 1 token: 6 experts x 16 n-block pairs
    (144, 264, 56, 1056, 3),   # pro L1 at 1 token
    (192, 264, 16, 1056, 1),   # flash L2 at 1 token: one round unsplit, the split overhead outweighs a split
    (336, 264, 24, 1056, 1),   # pro L2 at 1 token
    (1, 264, 64, 1056, 8),     # one tile: kMaxKSplits
    (6, 264, 16, 1056, 4),     # few tiles, short K: kMinSplitKBlocks
    (1440, 264, 32, 1056, 1),  # enough tiles: unsplit
    (96, 264, 32, 0, 1),       # no workspace
    (96, 264, 4, 1056, 1),     # too short a K
    (20, 264, 8, 1056, 1),     # 8 K blocks: two splits of 4 do not pay for their overhead
    (100, 264, 32, 250, 2),    # slots bound the split
])
def test_split_choice(units, workers, k_blocks, slots, want):
    assert _splits(units, workers, k_blocks, slots) == want


def _fresh_ws():
    ws = ops.SplitKWorkspace("cuda")
    ws.partials.fill_(float("nan"))
    return ws


def _after(ws, what, split_expected=True):
    torch.cuda.synchronize()
    ops.check_errors()
    assert int(ws.counters.abs().sum()) == 0, f"{what}: counters not left zero"
    written = bool((~torch.isnan(ws.partials)).any())
    assert written == split_expected, f"{what}: partials {'not ' if split_expected else ''}written"


BF16_CASES = [
    # (G, N, K, sizes, block_n)
    (6, 512, 4096, [1, 1, 0, 1, 2, 1], 8),
    (3, 256, 7168, [3, 9, 1], 16),
    (4, 384, 2048, [1, 0, 5, 2], 8),
    (5, 1024, 2048, [16, 0, 7, 1, 11], 16),
]


@pytest.mark.parametrize("G,N,K,sizes,block_n", BF16_CASES)
def test_splitk_bf16(G, N, K, sizes, block_n):
    gen = fresh_generator()
    tw, pw = random_weights(G, N, K, gen)
    M = sum(sizes)
    xq, xs = quantize_fp8(random_tokens(M, K, gen))
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ws = _fresh_ws()
    outs = []
    for rep in range(2):
        out = torch.full((M, N), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)
        ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=block_n, out=out, splitk=ws)
        _after(ws, f"bf16 rep {rep}")
        outs.append(out.clone())
    st = offs.tolist()
    groups = [(g, st[g], sizes[g]) for g in range(G)]
    reference_bf16_step_check(outs[0], gemm_reference(xq, xs, tw, groups), f"split-K G={G} N={N} K={K} bn={block_n}",
                              gemm_error_bound(xq, xs, tw, groups))
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "split-K result not reproducible"


def test_splitk_masked():
    gen = fresh_generator()
    G, N, K, max_m = 4, 256, 2048, 8
    tw, pw = random_weights(G, N, K, gen)
    m = torch.tensor([3, 0, 8, 1], dtype=torch.int32)
    xq, xs = quantize_fp8(random_tokens(G * max_m, K, gen))
    ws = _fresh_ws()
    out = torch.full((G, max_m, N), POISON, dtype=torch.int16, device="cuda").view(torch.bfloat16)
    ops.grouped_gemm(xq.view(G, max_m, K), xs.view(G, max_m, K // 128), pw, masked_m=m.cuda(), out=out, block_n=8,
                     splitk=ws)
    _after(ws, "masked")
    groups = [(g, g * max_m, int(m[g])) for g in range(G)]
    ref = gemm_reference(xq, xs, tw, groups).view(G, max_m, N)
    bound = gemm_error_bound(xq, xs, tw, groups).view(G, max_m, N)
    for g in range(G):
        if int(m[g]):
            reference_bf16_step_check(out[g, :int(m[g])], ref[g, :int(m[g])], f"masked g={g}", bound[g, :int(m[g])])


@pytest.mark.parametrize("G,I,K,sizes,block_n", [(4, 256, 4096, [1, 2, 0, 1], 8), (3, 384, 2048, [9, 1, 14], 16)])
@pytest.mark.parametrize("clamp,pow2", [(float("inf"), False), (1.0, True)])
def test_splitk_l1(G, I, K, sizes, block_n, clamp, pow2):
    gen = fresh_generator()
    tw, pw = random_weights(G, 2 * I, K, gen, gate_up=True)
    M = sum(sizes)
    xq, xs = quantize_fp8(random_tokens(M, K, gen))
    w = (torch.rand(M, generator=gen) + 0.05).cuda()
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ws = _fresh_ws()
    res = []
    for rep in range(2):
        q = torch.full((M, I), 0x7F, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        s = torch.full((M, I // 128), float("nan"), device="cuda")
        ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, activation_clamp=clamp, pow2=pow2, block_n=block_n,
                            out=(q, s), splitk=ws)
        _after(ws, f"l1 rep {rep}")
        res.append((q.view(torch.uint8).clone(), s.clone()))
    st = offs.tolist()
    q_ref, s_ref, bound = l1_reference(xq, xs, tw, [(g, st[g], sizes[g]) for g in range(G)], w, clamp, pow2,
                                       with_bound=True)
    print(check_l1(res[0][0], res[0][1], q_ref, s_ref, f"split-K L1 G={G} I={I} K={K} bn={block_n}", bound))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1]), "split-K L1 not reproducible"


def test_many_tiles_run_unsplit():
    """Enough tiles for every CTA: no split (the workspace stays untouched), same result as without one."""
    gen = fresh_generator()
    G, N, K = 200, 512, 1024  # 800 tiles on 264 CTAs: 4 rounds unsplit, a split would need 1600 slots
    sizes = torch.randint(1, 16, (G,), generator=gen).tolist()
    tw, pw = random_weights(G, N, K, gen)
    M = sum(sizes)
    xq, xs = quantize_fp8(random_tokens(M, K, gen))
    offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ws = _fresh_ws()
    a = ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=16, splitk=ws)
    _after(ws, "many tiles", split_expected=False)
    b = ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=16)
    torch.cuda.synchronize()
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_one_workspace_many_calls():
    """One workspace through a sequence of split calls of different shapes and epilogues (each leaves the
    counters zero for the next): every result checked."""
    gen = fresh_generator()
    ws = _fresh_ws()
    for i in range(12):
        G = int(torch.randint(1, 6, (1,), generator=gen))
        K = 128 * int(torch.randint(8, 40, (1,), generator=gen))
        bn = (8, 16)[i % 2]
        sizes = torch.randint(0, 2 * bn, (G,), generator=gen).tolist()
        sizes[0] = max(sizes[0], 1)
        M = sum(sizes)
        xq, xs = quantize_fp8(random_tokens(M, K, gen))
        offs = torch.tensor([0] + torch.tensor(sizes).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        st = offs.tolist()
        groups = [(g, st[g], sizes[g]) for g in range(G)]
        what = f"call {i}: G={G} K={K} bn={bn} sizes={sizes}"
        if i % 3 == 2:
            I = 256
            tw, pw = random_weights(G, 2 * I, K, gen, gate_up=True)
            w = (torch.rand(M, generator=gen) + 0.05).cuda()
            q, s = ops.grouped_gemm_l1(xq, xs, pw, w, group_offsets=offs, block_n=bn, splitk=ws)
            torch.cuda.synchronize()
            ops.check_errors()
            q_ref, s_ref, bound = l1_reference(xq, xs, tw, groups, w, with_bound=True)
            check_l1(q.view(torch.uint8), s, q_ref, s_ref, what, bound)
        else:
            N = 128 * int(torch.randint(1, 5, (1,), generator=gen))
            tw, pw = random_weights(G, N, K, gen)
            out = ops.grouped_gemm(xq, xs, pw, group_offsets=offs, block_n=bn, splitk=ws)
            torch.cuda.synchronize()
            ops.check_errors()
            reference_bf16_step_check(out, gemm_reference(xq, xs, tw, groups), what, gemm_error_bound(xq, xs, tw, groups))
        assert int(ws.counters.abs().sum()) == 0, f"{what}: counters not left zero"


def test_bad_workspace():
    gen = fresh_generator()
    _, pw = random_weights(1, 256, 256, gen)
    xq, xs = quantize_fp8(random_tokens(4, 256, gen))
    offs = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    with pytest.raises(TypeError, match="splitk"):
        ops.grouped_gemm(xq, xs, pw, group_offsets=offs, splitk=object())
    with pytest.raises(ValueError, match="slots"):
        ops.SplitKWorkspace("cuda", slots=0)
    with pytest.raises(ValueError, match="device"):
        ops.SplitKWorkspace("cpu")
