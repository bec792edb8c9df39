"""CPU tests of the per-call dispatch mode (SYMM_DISPATCH_PUSH=2; the default is 0 = pull since layout v7; csrc/dispatch.cu
symm_dispatch_kind, include/symm_comm/dispatch.cuh "per-call mode", barrier.cuh rank_arrive_whole):
- the host rule (the library's symm_dispatch_kind, the function symm_dispatch itself uses);
- every rank reaches the same mode for a call, and phase A wrote what that mode reads on every rank;
- the completion ("done") signal row stays counted across mode switches: a push call's wait
  "word >= epoch << 32" holds exactly when every arrival of the source's calls <= epoch is in, for any
  interleaving of arrivals and any mix of push / pull calls and grid sizes (and it would hang without
  the pull calls' whole-call arrival: the bug this protects against)."""
from __future__ import annotations

import ctypes
import random

import pytest
from symm_lib_util import layout as _layout, lib_or_skip as _lib_or_skip

PULL, PUSH, AUTO = 0, 1, 2  # SYMM_KIND_* (layout.cuh)


def _kind(L, T, mode=2, min_env=-1):
    lib = _lib_or_skip().lib
    out = ctypes.c_int32(-1)
    k = lib.symm_dispatch_kind(ctypes.byref(L), T, mode, min_env, ctypes.byref(out))
    assert k >= 0, k
    return k, out.value


def test_host_rule_bench_shape():
    L = _layout(2, 0, 256, 7168, 8, 4096)
    assert _kind(L, 0)[1] == 2048  # default threshold at H 7168, K 8
    for T, want in [(0, AUTO), (1, AUTO), (128, AUTO), (2047, AUTO), (2048, PUSH), (4096, PUSH)]:
        assert _kind(L, T) == (want, 2048), T
        assert _kind(L, T, mode=0)[0] == PULL
        assert _kind(L, T, mode=1)[0] == PUSH
    # threshold override (SYMM_PUSH_MIN_TOKENS)
    assert _kind(L, 63, min_env=64) == (AUTO, 64)
    assert _kind(L, 64, min_env=64) == (PUSH, 64)
    assert _kind(L, 0, min_env=0) == (PUSH, 0)  # 0: every call pushes
    # a buffer whose max_tokens cannot reach the threshold: the plain pull kernel, no decision
    Ls = _layout(2, 0, 256, 7168, 8, 128)
    for T in (0, 1, 128):
        assert _kind(Ls, T)[0] == PULL
    assert _kind(Ls, 128, min_env=128)[0] == PUSH
    assert _kind(Ls, 127, min_env=128)[0] == AUTO


def test_host_rule_scales_with_row_bytes():
    L = _layout(2, 0, 64, 512, 8, 640)  # the GPU test's "large" buffer: 2048 * 7168 / 512 = 28672 tokens
    assert _kind(L, 640)[1] == 28672 and _kind(L, 640)[0] == PULL
    L = _layout(4, 0, 384, 4096, 6, 8192)
    k, m = _kind(L, 8192)
    assert m == -(-2048 * 8 * 7168 // (6 * 4096)) and k == PUSH


def _call_modes(kinds, Ts, min_tokens):
    """What each rank's kernel does for one call: (mode, staged/sent slots, kept slots/counts)."""
    out = []
    for k, T in zip(kinds, Ts):
        if k == PULL:
            push = False
        elif k == PUSH:
            push = True
        else:
            push = max(Ts) >= min_tokens  # decide_push: every rank's num_tokens from meta_all[parity][E]
        out.append((push, k != PUSH, k != PULL))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_every_rank_same_mode(seed):
    rng = random.Random(seed)
    for R in (1, 2, 4, 8):
        Tmax = rng.choice([128, 640, 4096])
        L = _layout(R, 0, 8 * R, 7168, 8, Tmax)
        for mode in (0, 1, 2):
            for min_env in (-1, 0, 64, 1000, Tmax):
                for _ in range(6):
                    Ts = [rng.choice([0, 1, rng.randrange(Tmax + 1), Tmax, min(Tmax, max(min_env, 0))])
                          for _ in range(R)]
                    kinds, mins = zip(*(_kind(L, T, mode, min_env) for T in Ts))
                    assert len(set(mins)) == 1
                    res = _call_modes(kinds, Ts, mins[0])
                    modes = {p for p, _, _ in res}
                    assert len(modes) == 1, (Ts, kinds)
                    push = modes.pop()
                    if push:
                        assert all(kept for _, _, kept in res), "a rank pushes without its slot map / counts"
                    else:
                        assert all(sent for _, sent, _ in res), "a rank pulls from a source that did not stage"
                    if mode == 2:  # auto: push iff the largest call reaches the threshold
                        assert push == (Tmax >= mins[0] and max(Ts) >= mins[0]), (Ts, mins[0])


def _done_row_trace(modes, grids, rng, pull_arrives=True):
    """One source's arrivals at one waiter's done word, calls in stream order (call e+1 starts after
    call e completed), the arrivals of a call in random order; yields (word, arrivals_done_upto) after
    every arrival, where arrivals_done_upto = the last call all of whose arrivals are in."""
    word = 0
    for e, (push, n) in enumerate(zip(modes, grids), start=1):
        if push:
            incs = [(1 << 32) - (n - 1)] + [1] * (n - 1)  # CTA 0, then the others (cta_rank_barrier_counted)
            rng.shuffle(incs)
        else:
            incs = [1 << 32] if pull_arrives else []  # rank_arrive_whole: CTA 0, the whole call at once
        for i, v in enumerate(incs):
            word += v
            yield word, e if i == len(incs) - 1 else e - 1
        if not incs:
            yield word, e


@pytest.mark.parametrize("seed", range(16))
def test_done_row_counted_across_mode_switches(seed):
    rng = random.Random(seed)
    n_calls = 60
    modes = [rng.random() < 0.5 for _ in range(n_calls)]
    grids = [rng.choice([1, 2, 3, 5, 132]) for _ in range(n_calls)]  # few_sms / num_sms per call
    for word, done in _done_row_trace(modes, grids, rng):
        for e in range(1, n_calls + 1):
            # the push call e's wait passes iff every arrival of calls <= e is in
            assert (word >= e << 32) == (done >= e), (e, word, done)


def test_done_row_without_pull_arrivals_hangs():
    """The bug the whole-call arrival prevents: push calls only counting, a push after a pull waits forever."""
    rng = random.Random(0)
    modes, grids = [False, True], [4, 4]
    last = list(_done_row_trace(modes, grids, rng, pull_arrives=False))[-1][0]
    assert last < 2 << 32  # the push call 2 would wait for 2 << 32: never reached (time-out, phase 9)
    last = list(_done_row_trace(modes, grids, rng, pull_arrives=True))[-1][0]
    assert last == 2 << 32
