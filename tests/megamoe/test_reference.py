"""The pure-PyTorch reference: against a naive per-token loop, and multi-rank against single-process.

Inputs are fresh each run; set MEGAMOE_TEST_SEED to replay a failure (the seed is in its message).
"""
from __future__ import annotations

import math
import os

import ml_dtypes
import numpy as np
import pytest
import torch

from fp4_gemm.numerics import dequantize_transformed, quantize_fp8
from megamoe.reference import (_scaled_matmul, make_weights, moe_reference, moe_reference_distributed,
                               run_local_ranks)

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def seed():
    return int(os.environ.get("MEGAMOE_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def _why(seed: int) -> str:
    return f"seed {seed} (replay: MEGAMOE_TEST_SEED={seed})"


CANCEL_SCALE = 2.0 ** -20  # small slots of a cancelling token: low bits below FP32 ulps of slot 1


def _tokens(gen: torch.Generator, T: int, H: int) -> torch.Tensor:
    """BF16 [T, H] with per-token magnitudes over 2^-4..2^4, so the FP8 scales differ."""
    return (torch.randn(T, H, generator=gen) * 2.0 ** torch.randint(-4, 5, (T, 1), generator=gen)).bfloat16()


def _inputs(gen: torch.Generator, T: int, H: int, E: int, K: int, *, p_missing: float = 0.25,
            hot: int | None = None, p_hot: float = 0.9, p_cancel: float = 0.5):
    """x (_tokens) and routing with -1 entries; with `hot`, a fraction p_hot of the slots go to that
    expert (repeats within a token are allowed: every slot is its own pair).

    A fraction p_cancel of the tokens make the combine's slot order visible (an FP32 sum of a few
    similar BF16 rows is exact in any order): slots 0 and 2 are routed, slot 1 repeats slot 0 with
    the negated weight, so its row is exactly -row 0, and the weights of slots 2.. are scaled by
    2^-20. In slot order rows 0 and 1 cancel exactly; in another order the small rows' low bits are
    rounded away against row 0 or 1.
    """
    x = _tokens(gen, T, H)
    routed = torch.randint(0, E, (T, K), generator=gen)
    if hot is not None:
        routed = torch.where(torch.rand(T, K, generator=gen) < p_hot, hot, routed)
    idx = torch.where(torch.rand(T, K, generator=gen) < p_missing, -1, routed)
    w = torch.rand(T, K, generator=gen)
    cancel = torch.rand(T, generator=gen) < p_cancel
    idx[cancel, 0] = idx[cancel, 1] = routed[cancel, 0]
    idx[cancel, 2] = routed[cancel, 2]
    w[cancel, 1] = -w[cancel, 0]
    w[cancel, 2:] *= CANCEL_SCALE
    return x, idx, w


def _bits(y: torch.Tensor) -> torch.Tensor:
    return y.view(torch.int16)


# --- (a) against a naive loop ---------------------------------------------------------------------

def _dequant(q: torch.Tensor, s: torch.Tensor, gran: int) -> np.ndarray:
    """FP64, exact (an FP32 product of code and scale could round)."""
    return (q.double().numpy().reshape(-1, gran) * s.double().numpy().reshape(-1, 1)).reshape(-1)


def _naive_moe(x, idx, w, weights, clamp: float, pow2: bool, l2_gran: int):
    """DESIGN.md section 1 written out per token and slot in numpy: FP64 dot products, BF16 via
    FP32, FP32 SwiGLU with exp from math.exp, FP32 combine. Returns (y, per-slot L2 rows)."""
    T, K = idx.shape
    H, I = weights.hidden, weights.intermediate
    xq, xs = quantize_fp8(x, gran=128, pow2=pow2)
    y = np.zeros((T, H), dtype=BF16)
    rows = np.zeros((T, K, H), dtype=BF16)
    c = np.float32(clamp)
    for t in range(T):
        xd = _dequant(xq[t], xs[t], 128)
        acc = np.zeros(H, dtype=np.float32)
        for k in range(K):
            e = int(idx[t, k])
            if e < 0:
                continue
            gu = (weights.w1_deq[e].numpy() @ xd).astype(np.float32).astype(BF16).astype(np.float32)
            gate, up = np.minimum(gu[:I], c), np.clip(gu[I:], -c, c)
            exp = np.array([math.exp(-float(g)) for g in gate], dtype=np.float32)
            a = gate / (np.float32(1) + exp) * up * np.float32(w[t, k])
            aq, a_s = quantize_fp8(torch.from_numpy(a), gran=l2_gran, pow2=pow2)
            rows[t, k] = (weights.w2_deq[e].numpy() @ _dequant(aq, a_s, l2_gran)).astype(np.float32).astype(BF16)
            acc += rows[t, k].astype(np.float32)
        y[t] = acc.astype(BF16)
    return y, rows


@pytest.mark.parametrize("clamp, pow2, l2_gran", [(math.inf, False, 128), (0.75, True, 64)])
def test_matches_naive_loop(seed, clamp, pow2, l2_gran):
    H, I, E, K, T = 256, 256, 8, 4, 13
    gen = torch.Generator().manual_seed(seed)
    weights = make_weights(E, H, I, seed=seed)
    x, idx, w = _inputs(gen, T, H, E, K)
    y, inter = moe_reference(x, idx, w, weights, activation_clamp=clamp, pow2_scales=pow2,
                             l2_gran=l2_gran, return_intermediates=True)
    y_naive, rows_naive = _naive_moe(x, idx, w, weights, clamp, pow2, l2_gran)
    assert np.array_equal(_bits(inter.l2_out).numpy(), rows_naive.view(np.int16)), _why(seed)
    assert np.array_equal(_bits(y).numpy(), y_naive.view(np.int16)), _why(seed)


def test_weights_layout(seed):
    """w1_deq is the interleaved kernel layout put back in gate-then-up order, row scales are
    powers of two (the reference's exact per-group sums rely on it), nothing clamped at this scale."""
    E, H, I = 2, 256, 128
    weights = make_weights(E, H, I, seed=seed)
    kernel_rows = dequantize_transformed(weights.w1)
    for p in range(2 * I):  # interleaved row p: block p // 16, gate rows first, then up rows
        b, j = divmod(p, 16)
        src = 8 * b + j if j < 8 else I + 8 * b + j - 8
        assert torch.equal(kernel_rows[:, p], weights.w1_deq[:, src]), (p, _why(seed))
    for tw in (weights.w1, weights.w2):
        mant, _ = torch.frexp(tw.row_scale.double())
        assert bool((mant == 0.5).all()), _why(seed)
    assert weights.n_clamped == 0, _why(seed)
    assert torch.equal(make_weights(E, H, I, seed=seed, experts=range(1, 2)).w2_deq, weights.w2_deq[1:])


def test_gemm_batch_invariant(seed):
    """The FP64 GEMM gives each row the same bits alone, in a batch, or in another order, before
    any rounding to BF16 (which would hide nearly every difference from the y-level tests)."""
    gen = torch.Generator().manual_seed(seed)
    w = make_weights(1, 1024, 128, seed=seed).w1_deq[0]
    q, s = quantize_fp8(_tokens(gen, 33, 1024))
    batch = _scaled_matmul(q, s, w, 128)
    perm = torch.randperm(33, generator=gen)
    assert torch.equal(_scaled_matmul(q[perm], s[perm], w, 128), batch[perm]), _why(seed)
    for t in range(33):
        assert torch.equal(_scaled_matmul(q[t:t + 1], s[t:t + 1], w, 128), batch[t:t + 1]), _why(seed)


# --- (b) multi-rank equals single-process ---------------------------------------------------------

SHAPE = dict(E=8, H=256, I=128)
K = 4
MAX_TOKENS = 12  # per rank
CASE_OPTIONS = {  # moe_reference keyword arguments per case
    "random": {},
    "empty_rank": {},
    "skewed": dict(activation_clamp=0.75, pow2_scales=True, l2_gran=64),
}


def _cases(seed: int, world: int) -> dict:
    """{case: per-rank (x, topk_idx, topk_w)}. empty_rank: the last rank has no tokens;
    skewed: 90% of the slots go to one random expert."""
    gen = torch.Generator().manual_seed(seed)
    E, H = SHAPE["E"], SHAPE["H"]
    tokens = lambda: torch.randint(1, MAX_TOKENS + 1, (world,), generator=gen).tolist()
    hot = int(torch.randint(0, E, (1,), generator=gen))
    t_empty = tokens()
    t_empty[-1] = 0
    return {
        "random": [_inputs(gen, T, H, E, K) for T in tokens()],
        "empty_rank": [_inputs(gen, T, H, E, K) for T in t_empty],
        "skewed": [_inputs(gen, T, H, E, K, p_missing=0.1, hot=hot) for T in tokens()],
    }


def _rank_worker(rank: int, world: int, cases: dict, seed: int) -> dict:
    per_rank = SHAPE["E"] // world
    weights = make_weights(**SHAPE, seed=seed, experts=range(rank * per_rank, (rank + 1) * per_rank))
    return {name: moe_reference_distributed(*inputs[rank], weights, **CASE_OPTIONS[name])
            for name, inputs in cases.items()}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_distributed_matches_single_process(seed, world):
    cases = _cases(seed, world)
    per_rank = run_local_ranks(_rank_worker, world, cases, seed)
    weights = make_weights(**SHAPE, seed=seed)
    for name, inputs in cases.items():
        x, idx, w = (torch.cat(parts) for parts in zip(*inputs))
        y = moe_reference(x, idx, w, weights, **CASE_OPTIONS[name])
        y_dist = torch.cat([r[name] for r in per_rank])
        assert torch.equal(_bits(y_dist), _bits(y)), f"{name}, {world} ranks, {_why(seed)}"
