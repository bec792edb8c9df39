"""Multi-process GPU checks of symm_comm (one process per GPU), used by test_comm_gpu.py and runnable
directly:  python3 tests/symm_comm/comm_worker.py --world 2 --backend torch
Every received row is checked exactly (payload rows encode their source rank and token), per-expert
counts exactly, combine bitwise against a torch.distributed all-to-all reference."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

POISON_U8 = 0xEE


# ---- process plumbing ------------------------------------------------------------------------


def oversubscribed(world: int) -> bool:
    """More ranks than GPUs (test_comm_oversubscribed): rank r runs on GPU r % #GPUs, so the kernels'
    R-rank protocol (every peer a different rank: NVLink peers and, through a second mapping, ranks on the
    same GPU) runs at 2 or 4 ranks on one GPU. symm_comm.testing places the ranks: a gloo-only process
    group (NCCL refuses two ranks on one GPU) with the tests' CUDA-tensor collectives staged through host
    copies, and backend="ipc" (symm_comm.Buffer's CUDA IPC mappings: torch symmetric memory refuses two
    ranks on one GPU). The ranks sharing a GPU run in separate processes, i.e. time-sliced: correct, not fast."""
    return world > torch.cuda.device_count()


def _worker(rank, world, port, backend, scenarios, outdir):
    res = {"rank": rank, "ok": False, "done": []}
    try:
        from symm_comm.testing import init_rank
        pl = init_rank(rank, world, f"tcp://127.0.0.1:{port}", backend)
        res["backend"] = pl.backend
        run_all(pl.backend, scenarios, res)
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        try:
            if res["ok"]:
                dist.destroy_process_group()
        except Exception:
            pass
    os._exit(0 if res["ok"] else 1)


def launch(world: int, backend: str, scenarios: list[str], timeout_s: float = 600) -> list[dict]:
    """Spawn `world` processes; returns their result dicts (raises on a hang)."""
    from symm_comm.testing import spawn_ranks
    return spawn_ranks(_worker, world, (backend, scenarios,), timeout_s, "symm_comm test")


# ---- inputs and references --------------------------------------------------------------------
def make_inputs(rank, T, H, E, K, gen, neg_frac=0.1, hot_expert=None):
    """FP8 rows whose bytes encode (rank, token); scales encode (rank, token, j); random routing."""
    dev = torch.device("cuda", torch.cuda.current_device())
    S = H // 128
    t = torch.arange(T, device=dev, dtype=torch.int64)
    h = torch.arange(H, device=dev, dtype=torch.int64)
    xb = ((rank * 131 + t[:, None] * 7 + h[None, :] * 3 + (t[:, None] * h[None, :]) % 13) % 251).to(torch.uint8)
    if T:
        xb[:, 0] = rank
        xb[:, 1] = (t & 255).to(torch.uint8)
        xb[:, 2] = (t >> 8).to(torch.uint8)
    x = xb.view(torch.float8_e4m3fn)
    j = torch.arange(S, device=dev, dtype=torch.float32)
    scales = rank * 65536.0 + t[:, None].float() * 16 + j[None, :]
    scales = scales.contiguous()
    idx = torch.rand(T, E, generator=gen, device=dev).argsort(dim=1)[:, :K].contiguous()
    if hot_expert is not None and T:
        idx[:, 0] = hot_expert
        others = idx[:, 1:]
        others[others == hot_expert] = -1
    if neg_frac > 0 and T:
        drop = torch.rand(T, K, generator=gen, device=dev) < neg_frac
        idx[drop] = -1
    w = torch.rand(T, K, generator=gen, device=dev) + 0.5
    return x, scales, idx.contiguous(), w.contiguous()


def all_gather_var(t: torch.Tensor, world: int):
    """all_gather of tensors whose first dim differs per rank."""
    n = torch.tensor([t.shape[0]], device=t.device)
    ns = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(ns, n)
    ns = [int(v) for v in ns]
    m = max(max(ns), 1)
    pad = torch.zeros((m,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    pad[: t.shape[0]] = t
    outs = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(outs, pad)
    return [o[:k] for o, k in zip(outs, ns)]


def expected_dispatch(buf, idx_all, masked):
    """Rows this rank must receive: (src, token, k, local expert) in pool order, and their pool rows."""
    R, rank, Lx, bm = buf.num_ranks, buf.rank, buf.num_local_experts, buf.block_m
    S_, T_, K_, LE = [], [], [], []
    for s, idx in enumerate(idx_all):
        mine = (idx >= rank * Lx) & (idx < (rank + 1) * Lx)
        nz = mine.nonzero()  # row-major: token, then k
        S_.append(torch.full((nz.shape[0],), s, device=idx.device, dtype=torch.int64))
        T_.append(nz[:, 0])
        K_.append(nz[:, 1])
        LE.append(idx[nz[:, 0], nz[:, 1]] - rank * Lx)
    S_, T_, K_, LE = (torch.cat(v) for v in (S_, T_, K_, LE))
    LE, order = torch.sort(LE, stable=True)
    S_, T_, K_ = S_[order], T_[order], K_[order]
    counts = torch.bincount(LE, minlength=Lx)
    if masked:
        starts = torch.arange(Lx + 1, device=LE.device) * buf.max_m
    else:
        aligned = (counts + bm - 1) // bm * bm
        starts = torch.zeros(Lx + 1, dtype=torch.int64, device=LE.device)
        starts[1:] = torch.cumsum(aligned, 0)
    first = torch.zeros(Lx + 1, dtype=torch.int64, device=LE.device)
    first[1:] = torch.cumsum(counts, 0)
    within = torch.arange(LE.shape[0], device=LE.device) - first[LE]
    rows = starts[LE] + within
    return S_, T_, K_, LE, rows, counts, starts


def check_dispatch(buf, outs, inputs_all, masked, T_max):
    pool, pool_s, pool_w, counts, h = outs
    x_all, s_all, idx_all, w_all = inputs_all
    S_, T_, K_, LE, rows, ecounts, starts = expected_dispatch(buf, idx_all, masked)
    H, K = buf.hidden, buf.topk
    assert torch.equal(counts.long(), ecounts), f"expert counts {counts.tolist()} != {ecounts.tolist()}"
    assert torch.equal(h.expert_offsets.long(), starts), f"offsets {h.expert_offsets.tolist()} != {starts.tolist()}"
    px = buf.pool_x.view(torch.uint8)
    n = rows.shape[0]
    if n:
        xs = torch.cat(x_all)[_flat_index(x_all, S_, T_)]
        got = px[rows]
        bad = (got != xs).any(dim=1)
        assert not bad.any(), (f"{int(bad.sum())} pool rows wrong; first at row {int(rows[bad][0])}: "
                               f"expected src {int(S_[bad][0])} token {int(T_[bad][0])}, got bytes "
                               f"{got[bad][0][:3].tolist()}")
        ss = torch.cat(s_all)[_flat_index(s_all, S_, T_)]
        assert torch.equal(buf.pool_s[rows], ss), "pool scales wrong"
        ws = torch.cat(w_all)[_flat_index(w_all, S_, T_), K_]
        assert torch.equal(buf.pool_w[rows], ws), "pool top-k weights wrong"
        code = (S_ * T_max + T_) * K + K_
        assert torch.equal(buf.row_src[rows].long(), code), "row_src wrong"
    used = int(starts[-1])
    valid = torch.zeros(used, dtype=torch.bool, device=rows.device)
    valid[rows] = True
    assert bool((buf.row_src[:used][~valid] == -1).all()), "padding rows must have row_src == -1"
    # arrival counters: every block complete for this epoch
    # (the device's epoch; the handle's host mirror must equal it, None only for a captured dispatch)
    dev_epoch = int(buf.epochs[0].item())
    assert h.epoch is None or h.epoch == dev_epoch, f"handle epoch {h.epoch} != device epoch {dev_epoch}"
    target = (dev_epoch * buf.block_m) & 0xFFFFFFFF
    arr = buf.arrivals.long() & 0xFFFFFFFF
    assert bool((arr == target).all()), f"arrivals {arr[:8].tolist()} != {target}"
    if masked:
        assert pool.shape == (buf.num_local_experts, buf.max_m, H)
    return S_, T_, K_, rows


def _flat_index(lst, S_, T_):
    off = torch.zeros(len(lst) + 1, dtype=torch.int64, device=S_.device)
    off[1:] = torch.cumsum(torch.tensor([t.shape[0] for t in lst], device=S_.device), 0)
    return off[S_] + T_


def expert_out_from_row_src(buf, rows_total):
    """BF16 [rows_total, H]: f(src, token, k, h) for valid rows (exact small multiples of 1/4), NaN for padding."""
    H, K, T_max = buf.hidden, buf.topk, buf.max_tokens
    code = buf.row_src[:rows_total].long()
    valid = code >= 0
    k = code % K
    t = (code // K) % T_max
    s = code // (K * T_max)
    hh = torch.arange(H, device=code.device)
    f = (((s * 7 + t * 3 + k * 5)[:, None] + hh[None, :]) % 61 - 30).float() * 0.25
    f[~valid] = float("nan")
    return f.to(torch.bfloat16)


def f_value(rank, t, k, H, dev):
    hh = torch.arange(H, device=dev)
    return (((rank * 7 + t * 3 + k * 5)[:, None] + hh[None, :]) % 61 - 30).float() * 0.25


def expected_combine(rank, idx, w, H, E, weighted):
    T, K = idx.shape
    acc = torch.zeros(T, H, dtype=torch.float32, device=idx.device)
    t = torch.arange(T, device=idx.device)
    for k in range(K):
        v = f_value(rank, t, torch.full_like(t, k), H, idx.device).to(torch.bfloat16).float()
        if weighted:
            v = w[:, k:k + 1] * v
        ok = ((idx[:, k] >= 0) & (idx[:, k] < E))[:, None]
        acc = torch.where(ok, acc + v, acc)
    return acc.to(torch.bfloat16)


def a2a_reference_combine(buf, expert_out, rows_total, idx, w, weighted):
    """The same combine through torch.distributed.all_to_all_single (owner -> source), reduced in k order."""
    R, H, K, T_max, E = buf.num_ranks, buf.hidden, buf.topk, buf.max_tokens, buf.num_experts
    code = buf.row_src[:rows_total].long()
    sel = (code >= 0).nonzero().flatten()
    code = code[sel]
    dst = code // (K * T_max)
    order = torch.argsort(dst, stable=True)
    sel, code, dst = sel[order], code[order], dst[order]
    send_counts = torch.bincount(dst, minlength=R)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sc, rc = send_counts.tolist(), recv_counts.tolist()
    rows = expert_out.view(-1, H)[sel].contiguous()
    recv_rows = torch.empty((sum(rc), H), dtype=rows.dtype, device=rows.device)
    dist.all_to_all_single(recv_rows, rows, rc, sc)
    tk = torch.stack([(code // K) % T_max, code % K], 1).contiguous()
    recv_tk = torch.empty((sum(rc), 2), dtype=tk.dtype, device=tk.device)
    dist.all_to_all_single(recv_tk, tk, rc, sc)
    T = idx.shape[0]
    slots = torch.zeros(K, T, H, dtype=torch.float32, device=rows.device)
    present = torch.zeros(K, T, dtype=torch.bool, device=rows.device)
    slots[recv_tk[:, 1], recv_tk[:, 0]] = recv_rows.float()
    present[recv_tk[:, 1], recv_tk[:, 0]] = True
    acc = torch.zeros(T, H, dtype=torch.float32, device=rows.device)
    for k in range(K):
        v = slots[k] * w[:, k:k + 1] if weighted else slots[k]
        acc = torch.where(present[k][:, None], acc + v, acc)
    return acc.to(torch.bfloat16)


# ---- scenarios ----------------------------------------------------------------------------------
def one_round(buf, x, s, idx, w, layout, weighted=False, poison=True, a2a=False, idx_dtype=None):
    R, H, E = buf.num_ranks, buf.hidden, buf.num_experts
    if poison:
        buf.pool_x.view(torch.uint8).fill_(POISON_U8)
        buf.pool_s.fill_(float("nan"))
        buf.pool_w.fill_(float("nan"))
        buf.row_src.fill_(-7)
    idx_in = idx.to(idx_dtype) if idx_dtype is not None else idx
    outs = buf.dispatch(x, s, idx_in, w, layout=layout)
    masked = layout == "masked"
    inputs_all = tuple(all_gather_var(a, R) for a in (x.view(torch.uint8), s, idx, w))
    inputs_all = (inputs_all[0], inputs_all[1], inputs_all[2], inputs_all[3])
    check_dispatch(buf, outs, inputs_all, masked, buf.max_tokens)
    h = outs[-1]
    rows_total = h.num_rows()
    if masked:
        eo = torch.full((buf.num_local_experts * buf.max_m, H), float("nan"), device=x.device).to(torch.bfloat16)
        eo[:rows_total] = expert_out_from_row_src(buf, rows_total)
        eo = eo.view(buf.num_local_experts, buf.max_m, H)
    else:
        eo = expert_out_from_row_src(buf, rows_total)
    y_out = torch.full((x.shape[0], H), float("nan"), device=x.device, dtype=torch.bfloat16)
    y = buf.combine(eo, h, topk_w=w if weighted else None, out=y_out)
    ref = expected_combine(buf.rank, idx, w, H, E, weighted)
    assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), \
        f"combine differs from the formula at {int((y != ref).sum())} elements"
    if a2a:
        ref2 = a2a_reference_combine(buf, eo, rows_total, idx, w, weighted)
        assert torch.equal(y.view(torch.int16), ref2.view(torch.int16)), "combine differs from the all-to-all reference"
    if buf.layout.cmb_in_rows > 0:  # the pull combine of the same rows: the same bits (every rank pulls here)
        pull_combine_check(buf, eo, h, w if weighted else None, ref, masked)
    return outs


def pull_combine_check(buf, eo, h, w, ref, masked):
    """Expert rows written into buf.combine_input() (the rest of the region poisoned with NaN), combined
    by the pull path into a poisoned output; must equal `ref` bit for bit."""
    H = buf.hidden
    view = buf.combine_input()
    view.fill_(float("nan"))
    n = eo.numel() // H
    view[:n] = eo.reshape(n, H)
    y = torch.full((h.num_tokens, H), float("nan"), device=view.device, dtype=torch.bfloat16)
    y = buf.combine(buf.combine_input(masked=masked), h, topk_w=w, out=y)
    assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), \
        f"pull combine differs from the formula at {int((y != ref).sum())} elements"


def expect_error(fn, cls, *words):
    try:
        fn()
    except cls as e:
        msg = str(e)
        for w_ in words:
            assert w_ in msg, f"error message {msg!r} lacks {w_!r}"
        return e
    raise AssertionError(f"expected {cls.__name__}")


def run_all(backend, scenarios, res):
    import symm_comm
    from symm_comm import SymmCommError, SymmTimeoutError
    R, rank = dist.get_world_size(), dist.get_rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234 + rank)
    E, H, K, T_max = 32, 7168, 8, 128
    buf = symm_comm.Buffer(None, E, H, K, T_max, backend=backend, timeout_s=30.0, combine_input_rows=-1)
    rep = buf.memory_report()
    assert rep["total"] == buf.nbytes > 0
    res["bytes"] = buf.nbytes

    def step(name, fn):
        if name in scenarios or "all" in scenarios:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            dist.barrier()
            res["done"].append(name)
            # Per-step wall time on stderr (seen with pytest -s): a slow step shows itself in a log
            # even when the whole test later times out.
            print(f"[symm rank {rank}] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)

    def basic():
        T = [T_max, 77, 1, 100][rank % 4]
        x, s, idx, w = make_inputs(rank, T, H, E, K, gen)
        for layout in ("contiguous", "masked"):
            for weighted in (False, True):
                one_round(buf, x, s, idx, w, layout, weighted=weighted, a2a=True)
        outs = one_round(buf, x, s, idx, w, "contiguous", idx_dtype=torch.int32, a2a=True)
        # one_round ends with a pull combine: a push combine of the same dispatch right after it (no
        # dispatch between) must wait for the pull call's late "zeroed" signal (layout v9) and be exact
        eo = expert_out_from_row_src(buf, outs[-1].num_rows())
        for _ in range(2):
            y = buf.combine(eo, outs[-1])
            assert torch.equal(y.view(torch.int16), expected_combine(rank, idx, w, H, E, False).view(torch.int16)), \
                "push combine after a pull combine differs"

    def few_sms():
        # Small T on 3, 2 and 1 CTAs (the metadata, staging and pull of a small call share the few CTAs);
        # 50 tokens: the dedup encoding; 20 (<= 256 ids): plain ids.
        for sms, T in ((3, 50), (1, 50), (2, 20), (1, 20)):
            buf.num_sms = sms
            x, s, idx, w = make_inputs(rank, T, H, E, K, gen)
            one_round(buf, x, s, idx, w, "contiguous", weighted=True)
            one_round(buf, x, s, idx, w, "masked")
        buf.num_sms = 0

    def zero_tokens():
        T = 0 if rank == R - 1 else 64
        x, s, idx, w = make_inputs(rank, T, H, E, K, gen)
        one_round(buf, x, s, idx, w, "contiguous", weighted=True, a2a=True)
        one_round(buf, x, s, idx, w, "masked")

    def one_expert():
        x, s, idx, w = make_inputs(rank, T_max, H, E, K, gen, neg_frac=0.0, hot_expert=E - 1)
        one_round(buf, x, s, idx, w, "contiguous", weighted=True, a2a=True)
        # every rank sends all its tokens to expert E-1: the masked layout holds max_m rows per expert
        if R * T_max > buf.max_m:
            if rank == R - 1:
                expect_error(lambda: buf.dispatch(x, s, idx, w, layout="masked"), SymmCommError, "max_m",
                             f"rank {rank}")
            else:
                buf.dispatch(x, s, idx, w, layout="masked")
        one_round(buf, x, s, idx, w, "contiguous")  # still usable

    def bad_expert():
        x, s, idx, w = make_inputs(rank, 16, H, E, K, gen)
        if rank == 0:
            idx = idx.clone()
            idx[3, 2] = E + 5
            expect_error(lambda: buf.dispatch(x, s, idx, w), SymmCommError, "expert id", str(E + 5), "rank 0")
        else:
            buf.dispatch(x, s, idx, w)
        x, s, idx, w = make_inputs(rank, 16, H, E, K, gen)
        one_round(buf, x, s, idx, w, "contiguous")

    def bad_args():
        x, s, idx, w = make_inputs(rank, 8, H, E, K, gen)
        expect_error(lambda: buf.dispatch(x.view(torch.int8), s, idx, w), TypeError, "x_fp8")
        expect_error(lambda: buf.dispatch(x, s[:, :3], idx, w), ValueError, "x_scales")
        expect_error(lambda: buf.dispatch(x, s, idx.float(), w), TypeError, "topk_idx")
        expect_error(lambda: buf.dispatch(x.cpu(), s, idx, w), ValueError, "x_fp8")
        big = make_inputs(rank, T_max + 1, H, E, K, gen)
        expect_error(lambda: buf.dispatch(*big), ValueError, "max_tokens")
        x2 = torch.empty(8 * H + 1, dtype=torch.uint8, device=dev)[1:].view(8, H)
        expect_error(lambda: buf.dispatch(x2, s, idx, w), ValueError, "aligned")
        outs = one_round(buf, x, s, idx, w, "contiguous")
        expect_error(lambda: buf.combine(torch.zeros(5, H, device=dev), outs[-1]), TypeError, "expert_out")
        for bad in (-5, 10 ** 9):  # raised before any allocation (every rank alike)
            expect_error(lambda: symm_comm.Buffer(None, E, H, K, T_max, backend=backend, combine_input_rows=bad),
                         ValueError, "combine_input_rows")
        if R > 1:  # layouts that differ between ranks: every rank refuses, before the collective allocation
            expect_error(lambda: symm_comm.Buffer(None, E, H, K, T_max, backend=backend,
                                                  combine_input_rows=0 if rank == 0 else -1),
                         ValueError, "layouts differ")
        # the pull path takes buf.combine_input() itself (a slice would hide rows), once per dispatch
        outs = one_round(buf, x, s, idx, w, "contiguous")  # its last combine pulled
        expect_error(lambda: buf.combine(buf.combine_input(), outs[-1]), ValueError, "already combined")
        expect_error(lambda: buf.combine(buf.combine_input()[:8], outs[-1]), ValueError, "combine_input()")
        x, s, idx, w = make_inputs(rank, 8, H, E, K, gen)
        one_round(buf, x, s, idx, w, "contiguous")

    def many_calls():
        n = int(os.environ.get("SYMM_TEST_CALLS", "200"))
        for i in range(n):
            T = int(torch.randint(0, T_max + 1, (1,), generator=gen, device=dev))
            x, s, idx, w = make_inputs(rank, T, H, E, K, gen, neg_frac=0.15)
            layout = "masked" if i % 3 == 2 else "contiguous"
            one_round(buf, x, s, idx, w, layout, weighted=bool(i % 2), a2a=(i % 10 == 0),
                      idx_dtype=torch.int32 if i % 4 == 1 else None)

    def cuda_graph():
        """dispatch (masked) + expert output + combine captured in ONE CUDA graph, replayed with fresh
        routing and weights copied into the captured input tensors (the CUDA-graph decode use of the
        masked layout): every replay's pool, counts and combine checked exactly, outputs poisoned first."""
        T = [48, 17, 1, 33][rank % 4]
        Lx, mm = buf.num_local_experts, buf.max_m
        x, s, idx, w = make_inputs(rank, T, H, E, K, gen)
        hh = torch.arange(H, device=dev)

        def expert_out():  # graph-safe expert_out_from_row_src (no boolean-mask indexing: no host sync)
            code = buf.row_src[:Lx * mm].long()
            k, t, src = code % K, (code // K) % T_max, code // (K * T_max)
            f = (((src * 7 + t * 3 + k * 5)[:, None] + hh[None, :]) % 61 - 30).float() * 0.25
            f = torch.where((code >= 0)[:, None], f, torch.full_like(f, float("nan")))
            return f.to(torch.bfloat16).view(Lx, mm, H)

        y = torch.empty((T, H), dtype=torch.bfloat16, device=dev)
        y2 = torch.empty_like(y)
        one_round(buf, x, s, idx, w, "masked", weighted=True)  # eager first: the launchers' one-time setup
        torch.cuda.synchronize()
        dist.barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs = buf.dispatch(x, s, idx, w, layout="masked", check=False)
            eo = expert_out()
            buf.combine(eo, outs[-1], topk_w=w, out=y, check=False)
            buf.combine_input(masked=True).copy_(eo)  # and the pull combine of the same rows
            buf.combine(buf.combine_input(masked=True), outs[-1], topk_w=w, out=y2, check=False)
        torch.cuda.synchronize()
        dist.barrier()
        for i in range(12):
            _, _, idx2, w2 = make_inputs(rank, T, H, E, K, gen, neg_frac=0.1 + 0.05 * (i % 3))
            idx.copy_(idx2)
            w.copy_(w2)
            buf.pool_x.view(torch.uint8).fill_(POISON_U8)
            buf.pool_s.fill_(float("nan"))
            buf.pool_w.fill_(float("nan"))
            y.fill_(float("nan"))
            y2.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            buf.check_errors()
            inputs_all = tuple(all_gather_var(a, R) for a in (x.view(torch.uint8), s, idx, w))
            check_dispatch(buf, outs, inputs_all, True, buf.max_tokens)
            ref = expected_combine(rank, idx, w, H, E, True)
            assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), f"graph replay {i}: combine differs"
            assert torch.equal(y2.view(torch.int16), ref.view(torch.int16)), f"graph replay {i}: pull combine differs"
        del g
        torch.cuda.synchronize()
        # the buffer stays usable eagerly after the replays (device epochs advanced without the host)
        x, s, idx, w = make_inputs(rank, T, H, E, K, gen)
        one_round(buf, x, s, idx, w, "contiguous", weighted=False)

    def cupy_inputs():
        try:
            import cupy
        except ImportError:
            return
        x, s, idx, w = make_inputs(rank, 32, H, E, K, gen)
        cx = cupy.from_dlpack(x.view(torch.uint8))
        cs, ci, cw = (cupy.from_dlpack(a) for a in (s, idx.to(torch.int32), w))
        pool, ps, pw, cnt, h = buf.dispatch(cx, cs, ci, cw)
        assert isinstance(pool, cupy.ndarray) and pool.dtype == cupy.uint8
        inputs_all = tuple(all_gather_var(a, R) for a in (x.view(torch.uint8), s, idx, w))
        S_, T_, K_, LE, rows, ecounts, starts = expected_dispatch(buf, inputs_all[2], False)
        assert torch.equal(torch.from_dlpack(cnt).long(), ecounts)
        rows_total = h.num_rows()
        eo = cupy.from_dlpack(expert_out_from_row_src(buf, rows_total).view(torch.int16)).view(cupy.uint16)
        y = buf.combine(eo, h)
        assert isinstance(y, cupy.ndarray) and y.dtype == cupy.uint16
        ref = expected_combine(rank, idx, w, H, E, False)
        assert torch.equal(torch.from_dlpack(y.view(cupy.int16)), ref.view(torch.int16))

    def large():
        """T * K > 2048: the one-pass metadata (per-CTA token ranges, cross-CTA prefix per expert), mixed
        with the small path on other ranks / calls; duplicate ids in a token (k order inside a token),
        one hot expert, 1 and 3 CTAs (several walk batches per CTA), int32 ids, back-to-back calls."""
        Eb, Hb, Tb = 64, 512, 640
        big = symm_comm.Buffer(None, Eb, Hb, K, Tb, backend=backend, timeout_s=30.0, combine_input_rows=-1)
        try:
            T = [Tb, 300, 200, 512][rank % 4]
            x, s, idx, w = make_inputs(rank, T, Hb, Eb, K, gen)
            idx[::3, 1] = idx[::3, 0]  # the same expert twice in a token: slots in k order
            for layout in ("contiguous", "masked"):
                one_round(big, x, s, idx, w, layout, weighted=True, a2a=True)
            one_round(big, x, s, idx, w, "contiguous", idx_dtype=torch.int32)
            xh, sh, ih, wh = make_inputs(rank, T, Hb, Eb, K, gen, neg_frac=0.0, hot_expert=Eb - 1)
            one_round(big, xh, sh, ih, wh, "contiguous", weighted=True, a2a=True)
            for sms in (1, 3):
                big.num_sms = sms
                one_round(big, x, s, idx, w, "contiguous", weighted=True)
            big.num_sms = 0
            # Slot overflow on rank 0 (k = 0 and 1 of all 640 tokens to expert 0: 1280 ids for 640 slots):
            # reported there; the owner sees the raw count, turns the dedup off for the call (tokens past
            # slot 640 lost their leader) and every pool row is still written once, so the arrival
            # counters stay in step and the next round (checked) is exact.
            if rank == 0:
                io = idx.clone()
                io[:, 0] = 0
                io[:, 1] = 0
                expect_error(lambda: big.dispatch(x, s, io, w), SymmCommError, "slots", "expert 0", "rank 0")
            else:
                big.dispatch(x, s, idx, w)
            torch.cuda.synchronize()
            one_round(big, x, s, idx, w, "contiguous", weighted=True, a2a=True)
            for i in range(12):
                Ti = int(torch.randint(0, Tb + 1, (1,), generator=gen, device=dev))
                xi, si, ii, wi = make_inputs(rank, Ti, Hb, Eb, K, gen, neg_frac=0.15)
                big.num_sms = (0, 5, 0, 2)[i % 4]
                one_round(big, xi, si, ii, wi, "masked" if i % 3 == 2 else "contiguous", weighted=bool(i % 2),
                          a2a=(i % 4 == 0), idx_dtype=torch.int32 if i % 4 == 1 else None)
            big.num_sms = 0
        finally:
            torch.cuda.synchronize()
            dist.barrier()
            big.destroy()
        # top-12 (K > 8: the pull combine's one-item path, rows in batches of 8)
        rounds_on_own_buffer(16 * R, 256, 12, 96, 96 - 20 * (rank % 2))
        # top-6 (K does not divide 32): the one-pass metadata's dedup sends take the owner-mask loads
        # (metadata.cuh meta_walk, rolled loop) instead of the lane match of K = 8; duplicates in a token
        rounds_on_own_buffer(8 * R, 256, 6, 420, 420 - 30 * (rank % 2), dup_every=4)

    def rounds_on_own_buffer(Eb, Hb, Kb, Tb, T, dup_every=0):
        """A buffer of its own (destroyed after): one weighted round per pool layout, checked exactly and
        against the all-to-all reference; dup_every: k = 2 repeats k = 1's expert in every dup_every-th token."""
        b = symm_comm.Buffer(None, Eb, Hb, Kb, Tb, backend=backend, timeout_s=30.0, combine_input_rows=-1)
        try:
            xb, sb, ib, wb = make_inputs(rank, T, Hb, Eb, Kb, gen)
            if dup_every:
                ib[::dup_every, 2] = ib[::dup_every, 1]
            for layout in ("contiguous", "masked"):
                one_round(b, xb, sb, ib, wb, layout, weighted=True, a2a=True)
        finally:
            torch.cuda.synchronize()
            dist.barrier()
            b.destroy()

    def pool_overflow():
        small = symm_comm.Buffer(None, 3 * R, 256, 3, 40, block_m=16, pool_rows=64, backend=backend, timeout_s=30.0)
        try:
            x, s, idx, w = make_inputs(rank, 40, 256, 3 * R, 3, gen, neg_frac=0.0)
            need = 40 * 3 * R  # all ranks' rows land somewhere; some owner needs > 64 rows
            small.pool_x.view(torch.uint8).fill_(POISON_U8)
            errs = []
            try:
                small.dispatch(x, s, idx, w)
            except SymmCommError as e:
                errs.append(str(e))
                assert "pool capacity exceeded" in str(e) and "64" in str(e), str(e)
                # nothing written into the pool
                assert bool((small.pool_x.view(torch.uint8) == POISON_U8).all()), "pool written on overflow"
            n_err = torch.tensor([len(errs)], device=dev)
            dist.all_reduce(n_err)
            assert int(n_err) >= 1 and need > 64
            # a small routing fits: 2 tokens per rank, one expert each
            x, s, idx, w = make_inputs(rank, 2, 256, 3 * R, 3, gen, neg_frac=0.0)
            idx[:, 1:] = -1
            one_round(small, x, s, idx, w, "contiguous", weighted=True, a2a=True)
        finally:
            torch.cuda.synchronize()
            dist.barrier()
            small.destroy()

    def timeout():
        if R < 2:
            return
        x, s, idx, w = make_inputs(rank, 16, H, E, K, gen)
        *_, h_old = buf.dispatch(x, s, idx, w)  # a handle from before the reset
        buf.timeout_ns = int(2e9)
        if rank != R - 1:
            t0 = time.time()
            e = expect_error(lambda: buf.dispatch(x, s, idx, w), SymmTimeoutError, f"rank {rank}", "dispatch",
                             f"rank {R - 1}")
            assert time.time() - t0 < 20, "timeout took too long"
            # further calls refuse until resync
            expect_error(lambda: buf.dispatch(x, s, idx, w), SymmCommError, "resync")
            res["timeout_msg"] = str(e)
        buf.resync()
        expect_error(lambda: buf.combine(torch.zeros(1, H, dtype=torch.bfloat16, device="cuda"), h_old), ValueError,
                     "stale")
        buf.timeout_ns = int(30e9)
        x, s, idx, w = make_inputs(rank, 40, H, E, K, gen)
        one_round(buf, x, s, idx, w, "contiguous", weighted=True, a2a=True)
        one_round(buf, x, s, idx, w, "masked")
        # combine modes that disagree: rank 0 pulls, the others push. Rank 0 sees a peer's push start
        # signal and reports the mode error (never reads rows); the others wait for rank 0's rows and time out.
        buf.timeout_ns = int(2e9)
        *_, h = buf.dispatch(x, s, idx, w)
        eo = expert_out_from_row_src(buf, h.num_rows())
        if rank == 0:
            v = buf.combine_input()
            v[:eo.shape[0]] = eo
            expect_error(lambda: buf.combine(v, h), SymmCommError, "rank 0", "disagree on the combine mode")
        else:
            expect_error(lambda: buf.combine(eo, h), SymmTimeoutError, f"rank {rank}", "combine")
        buf.resync()
        buf.timeout_ns = int(30e9)
        one_round(buf, x, s, idx, w, "contiguous", weighted=True)

    try:
        step("basic", basic)
        step("few_sms", few_sms)
        step("zero_tokens", zero_tokens)
        step("one_expert", one_expert)
        step("bad_expert", bad_expert)
        step("bad_args", bad_args)
        step("cupy", cupy_inputs)
        step("cuda_graph", cuda_graph)
        step("large", large)
        step("many_calls", many_calls)
        step("pool_overflow", pool_overflow)
        step("timeout", timeout)
    finally:
        torch.cuda.synchronize()
        buf.destroy()
        if backend == "nvshmem":
            dist.barrier()
            symm_comm.nvshmem_finalize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs)")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--scenarios", default="all")
    a = ap.parse_args()
    world = a.world or torch.cuda.device_count()
    res = launch(world, a.backend, a.scenarios.split(","))
    ok = all(r["ok"] for r in res)
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k != "traceback"}))
        if not r["ok"]:
            print(r.get("traceback", ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
