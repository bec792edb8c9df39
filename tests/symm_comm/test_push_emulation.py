"""CPU emulation of the push dispatch's row placement (include/symm_comm/dispatch.cuh: stage_push,
build_push_tables, push_rows, push_bucket_counts) against the pull path's (metadata.cuh slots +
pool.cuh build_pool_tables + pull_rows): for random routings (R 1..8, contiguous and masked, -1 ids,
duplicate ids in a token, ranks with 0 tokens, owners that overflow) every owner must end with the
same pool rows (row -> (source, token, k)), the same combine bucket sizes and the same capacity
decision. Pure numpy: runs without the library or a GPU."""
from __future__ import annotations

import numpy as np
import pytest


def _slots(idx, E):
    """slot of every flat id (token * K + k) at its expert: rank among the same expert's ids, row-major."""
    flat = idx.reshape(-1)
    slot = np.full(flat.shape, -1, dtype=np.int64)
    run = np.zeros(E, dtype=np.int64)
    for i, e in enumerate(flat):
        if 0 <= e < E:
            slot[i] = run[e]
            run[e] += 1
    return slot, run  # run = counts per expert


def _owner_tables(cnt, d, Lx, R, T, bm, P, max_m, masked):
    """build_pool_tables + check_capacity at owner d; cnt[s][e] = count of (source s, expert e)."""
    c = np.clip(cnt[:, d * Lx:(d + 1) * Lx], 0, T)  # [R][Lx]
    le_count = c.sum(axis=0)
    if masked:
        le_start = np.arange(Lx + 1) * max_m
        ok = bool((le_count <= max_m).all())
    else:
        aligned = (le_count + bm - 1) // bm * bm
        le_start = np.concatenate([[0], np.cumsum(aligned)])
        ok = le_start[Lx] <= P
    pos = le_start[:Lx][None, :] + np.concatenate([np.zeros((1, Lx), np.int64), np.cumsum(c, axis=0)[:-1]])  # [R][Lx]
    return pos, le_start, le_count, ok


def _push_tables(cnt, me, E, Lx, R, T, bm, P, max_m, masked):
    """build_push_tables at source `me`: pos[e], ok[d] (an independent re-derivation)."""
    pos = np.zeros(E, dtype=np.int64)
    ok = np.zeros(R, dtype=bool)
    for d in range(R):
        tot = np.zeros(Lx, np.int64)
        pre = np.zeros(Lx, np.int64)
        for le in range(Lx):
            for s in range(R):
                v = min(max(int(cnt[s, d * Lx + le]), 0), T)
                tot[le] += v
                if s < me:
                    pre[le] += v
        if masked:
            ls = np.arange(Lx) * max_m
            ok[d] = bool((tot <= max_m).all())
        else:
            run, ls = 0, np.zeros(Lx + 1, np.int64)
            for le in range(Lx):
                ls[le] = run
                run += (tot[le] + bm - 1) // bm * bm
            ls[Lx] = run
            ok[d] = run <= P
        pos[d * Lx:(d + 1) * Lx] = ls[:Lx] + pre
    return pos, ok


@pytest.mark.parametrize("seed", range(24))
def test_push_rows_equal_pull_rows(seed):
    rng = np.random.default_rng(seed)
    R = int(rng.integers(1, 9))
    Lx = int(rng.integers(1, 6))
    E = R * Lx
    K = int(rng.integers(1, min(E, 8) + 1))
    T = int(rng.integers(1, 40))  # max_tokens
    chunk = 16
    C = (T + chunk - 1) // chunk
    bm = int(rng.choice([1, 4, 16, 128]))
    masked = bool(seed % 2)
    max_m = int(rng.integers(1, R * T + 1))
    P_full = R * T * K + Lx * (bm - 1)
    P = (P_full + bm - 1) // bm * bm if seed % 3 else max(bm, (P_full // 3) // bm * bm)  # some owners overflow
    P = max(P, (Lx * max_m + bm - 1) // bm * bm)  # symm_layout_compute: the masked layout always fits P
    ntok = [int(rng.integers(0, T + 1)) if s % 3 else T for s in range(R)]
    if R > 1:
        ntok[-1] = 0 if seed % 5 == 0 else ntok[-1]
    idx = []
    for s in range(R):
        a = np.stack([rng.permutation(E)[:K] for _ in range(ntok[s])]) if ntok[s] else np.zeros((0, K), np.int64)
        a = a.astype(np.int64)
        if ntok[s] and K > 1:
            a[::3, 1] = a[::3, 0]  # duplicate ids in a token (slots in k order)
        a[rng.random(a.shape) < 0.15] = -1
        idx.append(a)
    slots, cnt = zip(*(_slots(a, E) for a in idx))
    cnt = np.stack(cnt)  # [R][E]

    # ---- pull: owner d pulls (s, slot j of (le, s)) -> pos[s][le] + j; meta_slots[le][s][j] = flat id
    pull = {}
    pull_hist = {}
    pull_ok = {}
    for d in range(R):
        pos, le_start, le_count, ok = _owner_tables(cnt, d, Lx, R, T, bm, P, max_m, masked)
        pull_ok[d] = ok
        rows = {}
        hist = np.zeros((R, C), np.int64)
        if ok:
            for s in range(R):
                flat = idx[s].reshape(-1)
                for le in range(Lx):
                    ids = [i for i in range(flat.size) if flat[i] == d * Lx + le]  # meta_slots order
                    for j, i in enumerate(ids[:T]):
                        r = int(pos[s, le] + j)
                        assert r not in rows
                        rows[r] = (s, i // K, i % K)
                        hist[s, (i // K) // chunk] += 1
            for r in rows:
                assert r < P and (not masked or r < Lx * max_m)
        pull[d], pull_hist[d] = rows, hist

    # ---- push: source s stores (t, k) -> owner d row pos_s[e] + slot
    push = {d: {} for d in range(R)}
    push_hist_at_owner = {d: np.zeros((R, C), np.int64) for d in range(R)}
    for s in range(R):
        pos, ok = _push_tables(cnt, s, E, Lx, R, T, bm, P, max_m, masked)
        flat = idx[s].reshape(-1)
        hist0 = np.zeros((R, C), np.int64)  # stage_push: counted per valid id
        for i, e in enumerate(flat):
            if 0 <= e < E:
                hist0[e // Lx, (i // K) // chunk] += 1
        for d in range(R):
            assert ok[d] == pull_ok[d]
            push_hist_at_owner[d][s] = hist0[d] if ok[d] else 0
        for i, e in enumerate(flat):
            if not (0 <= e < E):
                continue
            sl = slots[s][i]
            d = e // Lx
            if sl >= T or not ok[d]:
                continue
            r = int(pos[e] + sl)
            assert r not in push[d], "two rows stored to one pool row"
            push[d][r] = (s, i // K, i % K)
    for d in range(R):
        assert push[d] == pull[d], f"owner {d}: push rows differ from pull rows"
        assert np.array_equal(push_hist_at_owner[d], pull_hist[d]), f"owner {d}: bucket sizes differ"


def _group_size(N, warps):
    """push_rows (push v2): items per warp group."""
    return 4 if N >= 8 * warps else (2 if N >= 4 * warps else 1)


@pytest.mark.parametrize("seed", range(16))
@pytest.mark.parametrize("warps", [1, 3, 2112])
def test_push_group_arrivals(seed, warps):
    """Push v2 publication: a warp takes g consecutive items, stores them, then ONE red.release.sys per
    distinct (owner, block) of the group with the group's row count there. With pad_blocks' bumps
    (block_m - valid rows of the block; block_m for blocks past the used rows or when the owner
    overflows), every block of every owner must end at exactly block_m (arrivals == epoch * block_m),
    and no group may bump a block it stored no row into."""
    rng = np.random.default_rng(1000 + seed)
    R = int(rng.integers(1, 5))
    Lx = int(rng.integers(1, 6))
    E = R * Lx
    K = int(rng.integers(1, min(E, 8) + 1))
    T = int(rng.integers(1, 64))
    bm = int(rng.choice([1, 4, 16, 128]))
    masked = bool(seed % 2)
    max_m = int(rng.integers(1, R * T + 1))
    P_full = R * T * K + Lx * (bm - 1)
    P = (P_full + bm - 1) // bm * bm if seed % 3 else max(bm, (P_full // 3) // bm * bm)
    P = max(P, (Lx * max_m + bm - 1) // bm * bm)
    nblk = P // bm
    ntok = [int(rng.integers(0, T + 1)) for _ in range(R)]
    idx = []
    for s in range(R):
        a = np.stack([rng.permutation(E)[:K] for _ in range(ntok[s])]) if ntok[s] else np.zeros((0, K), np.int64)
        a = a.astype(np.int64)
        a[rng.random(a.shape) < 0.15] = -1
        idx.append(a)
    slots, cnt = zip(*(_slots(a, E) for a in idx))
    cnt = np.stack(cnt)
    arrivals = np.zeros((R, nblk), np.int64)
    # padding (pad_blocks at each owner)
    for d in range(R):
        pos, le_start, le_count, ok = _owner_tables(cnt, d, Lx, R, T, bm, P, max_m, masked)
        valid = np.zeros(nblk * bm, bool)
        if ok:
            for s in range(R):
                for le in range(Lx):
                    n = min(int(cnt[s][d * Lx + le]), T)
                    valid[pos[s, le]:pos[s, le] + n] = True
        arrivals[d] += bm - valid.reshape(nblk, bm).sum(axis=1)
    # group publication at each source
    for s in range(R):
        pos, ok = _push_tables(cnt, s, E, Lx, R, T, bm, P, max_m, masked)
        flat = idx[s].reshape(-1)
        N = flat.size
        g = _group_size(N, warps)
        for q0 in range(0, N, g):
            bumps = {}
            for q in range(q0, min(q0 + g, N)):
                e = flat[q]
                if not (0 <= e < E):
                    continue
                d, sl = e // Lx, slots[s][q]
                if sl < 0 or sl >= T or not ok[d]:
                    continue
                key = (d, int(pos[e] + sl) // bm)
                bumps[key] = bumps.get(key, 0) + 1
            for (d, b), n in bumps.items():
                arrivals[d, b] += n
    assert (arrivals == bm).all(), arrivals
