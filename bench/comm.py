"""EP dispatch / combine benchmark: symm_comm vs an NCCL all_to_all_single exchange, with the peer
copy bandwidth measured in the same run. One process per visible GPU (the rank count comes from
the machine). H 7168, 256 experts, top-8; tokens per rank 1, 128, 4096 (override with --tokens).

Times: CUDA events, median after warm-up, routing rotated over --rotations fresh draws.
  symm_*_us     : GPU time of one call when calls run back to back (host enqueued ahead), an event
                  recorded after every call; max over ranks of the per-rank median.
  symm_*_host_us: one call timed alone from Python (validation + ctypes launch + kernel).
  symm_pair_seq_us: one dispatch + combine pair in a back-to-back sequence of 4 x the rotated pairs with
                  events only after its first pair and at its end (an event after every call costs ~3 us of
                  GPU time: experiments/launch_gap_probe.py; the first pair absorbs the ranks' start skew).
  symm_*_seq_us : per call from that: symm_*_us less half of (dispatch + combine - pair), the per-call
                  event cost (the probe measured it the same for both kernel shapes).
  symm_*_kernel_us: the kernel's own GPU duration in the back-to-back sequence (CUDA profiler, CUPTI
                  timestamps; median; max over ranks): no launch gap, no event — DeepEP's way of timing
                  (bench_kineto). Includes the kernel's waits for the other ranks.
  nccl_*_us     : all_to_all_single exchange (counts exchange + host sync for the splits + rows),
                  timed per call; max over ranks.
Bytes: rows that cross NVLink into/out of this rank (token rows of other ranks; local rows excluded),
max over ranks; GB/s = those bytes / symm time; pct_peer = GB/s / measured peer read (dispatch)
or write (combine) bandwidth. Dispatch counts one row per (token, k) delivered (what the pool
receives, the same bytes as the NCCL exchange); since layout v7 the pull reads a token's row ONCE
per owner rank, so dispatch_link_MB (distinct (source, token) rows read from other ranks) is what
actually crosses the links, and dispatch_link_pct_peer its rate against the peer read bandwidth."""
from __future__ import annotations

import argparse
import faulthandler
import os
import socket
import statistics
import sys
import traceback
from pathlib import Path

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (header, kernel_times_sequence, time_cuda, time_cuda_sequence,  # noqa: E402
                    time_cuda_sequence_total, write_results)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_rank(rank, world, port):
    """This process's GPU and the process group of a job of `world` ranks on this machine."""
    torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda", rank))


def spawn_ranks(worker, *args):
    """worker(rank, world, port, *args) in one process per GPU of the machine, joined."""
    import torch.multiprocessing as mp
    world = torch.cuda.device_count()
    mp.spawn(worker, args=(world, _free_port(), *args), nprocs=world, join=True)


def _routing(rank, T, H, E, K, gen, dev):
    x = torch.randint(0, 256, (T, H), generator=gen, device=dev, dtype=torch.uint8).view(torch.float8_e4m3fn)
    s = torch.rand(T, H // 128, generator=gen, device=dev) + 0.5
    idx = torch.rand(T, E, generator=gen, device=dev).argsort(dim=1)[:, :K].contiguous()
    w = torch.rand(T, K, generator=gen, device=dev)
    return x, s, idx, w


# ---- peer bandwidth -----------------------------------------------------------------------------
def measure_peer_bw(buf, nbytes):
    """Every rank concurrently copies nbytes from (write: to) the next rank's buffer. Best of a
    copy-engine copy and an SM copy kernel; bytes/s per direction per GPU."""
    if buf.num_ranks < 2:
        return float("nan"), float("nan")
    nbytes, fns = _peer_copies(buf, nbytes)
    res = {name: nbytes / t for name, t in _time_copies(fns).items()}
    if buf.rank == 0:
        print("peer copy GB/s per direction:", {k: round(v / 1e9, 1) for k, v in res.items()}, flush=True)
    return (max(v for k, v in res.items() if k.startswith("read")),
            max(v for k, v in res.items() if k.startswith("write")))


def peer_copy_floor_us(buf, nbytes):
    """The raw link's time for exactly nbytes (what one op moves over the link at a size): best of a
    copy-engine copy and an SM copy kernel, per call, each rank reading from (writing to) the next rank
    at once, timed like our calls (CUDA events, one launch each). Returns (read us, write us).
    Collective: every rank calls it, whatever its nbytes (at least 16 bytes are copied)."""
    if buf.num_ranks < 2:
        return float("nan"), float("nan")
    res = {name: t * 1e6 for name, t in _time_copies(_peer_copies(buf, max(int(nbytes), 16))[1]).items()}
    return (min(v for k, v in res.items() if k.startswith("read")),
            min(v for k, v in res.items() if k.startswith("write")))


def _peer_copies(buf, nbytes):
    """This rank reading from (writing to) the next rank's buffer, nbytes (rounded down to 16, capped
    by the buffer): copy-engine copies, and SM copy kernels where the peer view is a device tensor.
    Returns (nbytes, {name: fn})."""
    off = buf.layout.off_pool_x
    nbytes = min(nbytes, buf.nbytes - off) // 16 * 16
    remote = _peer_view(buf, (buf.rank + 1) % buf.num_ranks, off, nbytes)
    local = torch.empty(nbytes, dtype=torch.uint8, device=buf.device)
    fns = {"read_ce": lambda: local.copy_(remote), "write_ce": lambda: remote.copy_(local)}
    if remote.device == local.device:
        fns["read_sm"] = lambda: torch.add(remote.view(torch.int32), 0, out=local.view(torch.int32))
        fns["write_sm"] = lambda: torch.add(local.view(torch.int32), 0, out=remote.view(torch.int32))
    return nbytes, fns


def _time_copies(fns):
    """Seconds per call of each copy, every rank at once (barrier before each)."""
    res = {}
    for name, fn in fns.items():
        dist.barrier()
        res[name] = time_cuda(fn, warmup=3, reps=10)
    dist.barrier()
    return res


def _peer_view(buf, peer, off, nbytes):
    be = buf._backend
    try:
        if be.name == "torch":
            toff = be.peer_ptrs[buf.rank] - int(be.handle.buffer_ptrs[buf.rank])
            return be.handle.get_buffer(peer, (nbytes,), torch.uint8, off + toff)
        import nvshmem.core as nvc
        return nvc.get_peer_tensor(buf.raw, peer)[off:off + nbytes]
    except Exception as e:  # noqa: BLE001
        print(f"peer view through the backend failed ({e}); wrapping the raw pointer", flush=True)
        return _wrap_ptr(be.peer_ptrs[peer] + off, nbytes, buf.device)


def _wrap_ptr(ptr, nbytes, device):
    """A torch uint8 tensor over raw device memory (a peer mapping)."""
    class _CAI:
        __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                    "strides": None}
    return torch.as_tensor(_CAI(), device=device)


# ---- NCCL baseline ------------------------------------------------------------------------------
class NcclEP:
    """Per-(token, k) row exchange with all_to_all_single (same bytes as symm_comm), expert-major on
    the receiver; combine sends the rows back and sums over k."""

    def __init__(self, R, E, H, K):
        self.R, self.E, self.H, self.K, self.L = R, E, H, K, E // R

    def dispatch(self, x, s, idx, w):
        R, H, K, L = self.R, self.H, self.K, self.L
        T = idx.shape[0]
        flat = idx.reshape(-1)
        owner = torch.where(flat >= 0, flat // L, torch.full_like(flat, R))
        order = torch.argsort(owner, stable=True)
        counts = torch.bincount(owner, minlength=R + 1)[:R]
        rc = torch.empty_like(counts)
        dist.all_to_all_single(rc, counts)
        sc_l, rc_l = counts.tolist(), rc.tolist()  # host sync: NCCL needs the split sizes
        sel = order[: sum(sc_l)]
        tok = sel // K
        rows = x.view(torch.uint8).index_select(0, tok)
        meta = torch.cat([s.index_select(0, tok), w.reshape(-1)[sel, None],
                          (flat[sel] % L).float()[:, None]], 1)
        rrows = torch.empty((sum(rc_l), H), dtype=torch.uint8, device=x.device)
        rmeta = torch.empty((sum(rc_l), meta.shape[1]), dtype=meta.dtype, device=x.device)
        dist.all_to_all_single(rrows, rows, rc_l, sc_l)
        dist.all_to_all_single(rmeta, meta, rc_l, sc_l)
        le = rmeta[:, -1].long()
        perm = torch.argsort(le, stable=True)
        pool = rrows.index_select(0, perm)
        pool_meta = rmeta.index_select(0, perm)
        return pool, pool_meta, (perm, sc_l, rc_l, tok, T)

    def combine(self, expert_out, h):
        perm, sc_l, rc_l, tok, T = h
        back = torch.empty_like(expert_out)
        back[perm] = expert_out
        recv = torch.empty((sum(sc_l), self.H), dtype=expert_out.dtype, device=expert_out.device)
        dist.all_to_all_single(recv, back, sc_l, rc_l)
        y = torch.zeros((T, self.H), dtype=torch.float32, device=expert_out.device)
        y.index_add_(0, tok, recv.float())
        return y.to(torch.bfloat16)


# ---- worker ------------------------------------------------------------------------------------
def _worker(rank, world, port, args, q):
    try:
        if os.environ.get("BENCH_HANG_S"):  # diagnostics: every thread's Python stack, then exit
            faulthandler.dump_traceback_later(float(os.environ["BENCH_HANG_S"]), exit=True)
        init_rank(rank, world, port)
        out = _run(rank, world, args)
        q.put((rank, out, None))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001
        q.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        os._exit(1)


def _run(rank, R, args):
    import symm_comm
    dev = torch.device("cuda", rank)
    E, H, K = args.experts, args.hidden, args.topk
    S = H // 128
    Tmax = max(args.tokens)
    pull = args.combine == "pull"
    buf = symm_comm.Buffer(None, E, H, K, Tmax, backend=args.backend, check=False, timeout_s=60.0,
                           verbose=True, combine_input_rows=-1 if pull else 0)
    read_bw, write_bw = measure_peer_bw(buf, 1 << 30)
    nccl = NcclEP(R, E, H, K)
    gen = torch.Generator(device=dev)
    gen.manual_seed(100 + rank)
    eo_rows = torch.randn(buf.pool_rows, H, generator=gen, device=dev).to(torch.bfloat16)  # NCCL path's rows
    eo = eo_rows
    if args.layout == "masked":  # the masked combine takes [local experts, max_m, H]
        eo = torch.randn(buf.num_local_experts, buf.max_m, H, generator=gen, device=dev).to(torch.bfloat16)
    if pull:  # the pull combine reads the rows in place: the producer writes them into the buffer's region
        eo = buf.combine_input(masked=args.layout == "masked").copy_(eo)
    rows_out = []
    for T in args.tokens:
        rots = [_routing(rank, T, H, E, K, gen, dev) for _ in range(args.rotations)]
        # remote rows received per routing (dispatch) = rows sent back (combine)
        remote_rows, link_rows = [], []
        Lay = buf.layout
        for r in rots:
            *_, h = buf.dispatch(*r, check=True, layout=args.layout)
            sc = buf.raw[Lay.off_src_counts: Lay.off_src_counts + 4 * buf.num_local_experts * R]
            sc = sc.view(torch.int32).view(buf.num_local_experts, R).sum(0)
            remote_rows.append(int(sc.sum()) - int(sc[rank]))
            # distinct (source, token) among the used pool rows (row_src = (src * T + token) * K + k)
            used = int(buf.raw[Lay.off_exp_offsets: Lay.off_exp_offsets + 4 * (buf.num_local_experts + 1)]
                       .view(torch.int32)[-1])
            rs = buf.raw[Lay.off_row_src: Lay.off_row_src + 4 * used].view(torch.int32)
            st = rs[rs >= 0] // K
            link_rows.append(int(torch.unique(st[st // Lay.max_tokens != rank]).numel()))
            buf.combine(eo, h, check=True)
        torch.cuda.synchronize()
        state = {}

        def d(i):
            def f(rep):
                state[i] = buf.dispatch(*rots[(rep + i) % len(rots)], layout=args.layout)[-1]
            return f

        def c(i):
            def f(rep):
                buf.combine(eo, state[i])
            return f

        npairs = len(rots)
        fns = [g for i in range(npairs) for g in (d(i), c(i))]
        dist.barrier()
        tt = time_cuda_sequence(fns, warmup=3, reps=args.reps)
        buf.check_errors()
        d_times = [t for rep in tt for t in rep[0::2]]
        c_times = [t for rep in tt for t in rep[1::2]]
        # The same sequence with events only at its ends: per pair, without the per-call event cost.
        dist.barrier()
        seq_pairs = 4 * npairs
        pair_seq = statistics.median(time_cuda_sequence_total(fns * 4, warmup=1, reps=args.reps, skip=2)) / (seq_pairs - 1)
        buf.check_errors()
        # Kernel durations (profiler) in the same back-to-back sequence
        dist.barrier()
        kt = kernel_times_sequence(fns, ["symm_dispatch_kernel", "symm_combine"], warmup=1, reps=max(4, args.reps // 2))
        buf.check_errors()
        k_d = statistics.median(kt["symm_dispatch_kernel"]) * 1e6 if kt["symm_dispatch_kernel"] else float("nan")
        k_c = statistics.median(kt["symm_combine"]) * 1e6 if kt["symm_combine"] else float("nan")
        # host-inclusive single calls
        it = {"i": 0, "h": buf.dispatch(*rots[0], layout=args.layout)[-1]}

        def host_pair_d():
            it["h"] = buf.dispatch(*rots[it["i"] % npairs], layout=args.layout)[-1]

        def host_pair_c():
            buf.combine(eo, it["h"])
            it["i"] += 1

        dist.barrier()
        d_host = time_cuda(host_pair_d, warmup=3, reps=args.reps, setup=lambda i: (host_pair_c(), dist.barrier()))
        dist.barrier()
        c_host = time_cuda(host_pair_c, warmup=3, reps=args.reps, setup=lambda i: (host_pair_d(), dist.barrier()))
        buf.check_errors()
        # NCCL
        nst = {}

        def nd():
            nst["h"] = nccl.dispatch(*rots[nst.setdefault("i", 0) % npairs])

        def nc():
            pool = nst["h"][0]
            nccl.combine(eo_rows[: pool.shape[0]], nst["h"][2])
            nst["i"] += 1

        dist.barrier()
        n_d = time_cuda(nd, warmup=3, reps=args.reps, setup=lambda i: dist.barrier())
        nc()
        dist.barrier()
        n_c = time_cuda(nc, warmup=3, reps=args.reps, setup=lambda i: (nd(), dist.barrier()))
        med = statistics.median
        rr = max(remote_rows) if remote_rows else 0
        # floors at this size: the link's time for the bytes each op moves across it (dispatch: the
        # distinct rows read; combine: every remote row written back)
        floor_read, _ = peer_copy_floor_us(buf, statistics.mean(link_rows) * (H + 4 * S + 4))
        # (the combine's bytes both ways: the pull combine READS them; a bare one-launch read copy is the
        # floor of its data phase, the write copy that of a write-based one)
        floor_read_combine, floor_write = peer_copy_floor_us(buf, statistics.mean(remote_rows) * H * 2)
        rows_out.append({
            "tokens": T, "symm_dispatch_us": med(d_times) * 1e6, "symm_combine_us": med(c_times) * 1e6,
            "symm_dispatch_host_us": d_host * 1e6, "symm_combine_host_us": c_host * 1e6,
            "symm_pair_seq_us": pair_seq * 1e6, "symm_dispatch_kernel_us": k_d, "symm_combine_kernel_us": k_c,
            # per call without the per-call event: the event cost (d + c - pair) / 2 taken off each
            "symm_dispatch_seq_us": (med(d_times) - (med(d_times) + med(c_times) - pair_seq) / 2) * 1e6,
            "symm_combine_seq_us": (med(c_times) - (med(d_times) + med(c_times) - pair_seq) / 2) * 1e6,
            "nccl_dispatch_us": n_d * 1e6, "nccl_combine_us": n_c * 1e6,
            "remote_rows": statistics.mean(remote_rows), "dispatch_bytes": statistics.mean(remote_rows) * (H + 4 * S + 4),
            "combine_bytes": statistics.mean(remote_rows) * H * 2, "max_remote_rows": rr,
            "link_bytes": statistics.mean(link_rows) * (H + 4 * S + 4),
            "floor_read_us": floor_read, "floor_write_us": floor_write, "floor_read_combine_us": floor_read_combine,
        })
    buf.destroy()
    return {"rows": rows_out, "peer_read_Bps": read_bw, "peer_write_Bps": write_bw}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096])
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rotations", type=int, default=4)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--layout", default="contiguous", choices=["contiguous", "masked"],
                    help="symm_comm dispatch output layout (masked: [local experts, max_m, H], CUDA-graph decode)")
    ap.add_argument("--combine", default="push", choices=["push", "pull"],
                    help="push: expert_out a plain tensor (rows stored into the sources' combine buffers); pull: "
                         "expert_out written into buf.combine_input() (every rank reads its rows in place)")
    args = ap.parse_args()
    world = torch.cuda.device_count()
    if world < 1:
        sys.exit("bench/comm.py needs CUDA GPUs")
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    for _ in range(world):
        rank, out, err = q.get(timeout=1800)
        if err:
            errors.append(f"rank {rank}: {err}")
        else:
            results[rank] = out
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    if errors:
        print("\n".join(errors), file=sys.stderr)
        sys.exit(1)
    read_bw = min(results[r]["peer_read_Bps"] for r in results)
    write_bw = min(results[r]["peer_write_Bps"] for r in results)
    rows = []
    for i, T in enumerate(args.tokens):
        per = [results[r]["rows"][i] for r in sorted(results)]
        row = {"tokens": T}
        for k in ("symm_dispatch_us", "symm_combine_us", "symm_dispatch_host_us", "symm_combine_host_us",
                  "symm_pair_seq_us", "symm_dispatch_seq_us", "symm_dispatch_kernel_us", "symm_combine_kernel_us",
                  "symm_combine_seq_us", "nccl_dispatch_us", "nccl_combine_us", "floor_read_us", "floor_write_us",
                  "floor_read_combine_us"):
            row[k] = max(p[k] for p in per)
        db = max(p["dispatch_bytes"] for p in per)
        cb = max(p["combine_bytes"] for p in per)
        row["dispatch_MB"] = db / 1e6
        lb = max(p["link_bytes"] for p in per)
        row["dispatch_link_MB"] = lb / 1e6
        row["dispatch_GBps"] = db / (row["symm_dispatch_us"] * 1e-6) / 1e9
        row["combine_GBps"] = cb / (row["symm_combine_us"] * 1e-6) / 1e9
        if world > 1:
            row["dispatch_pct_peer"] = 100 * row["dispatch_GBps"] * 1e9 / read_bw
            row["dispatch_link_pct_peer"] = 100 * lb / (row["symm_dispatch_us"] * 1e-6) / read_bw
            row["combine_pct_peer"] = 100 * row["combine_GBps"] * 1e9 / write_bw
        row["speedup_dispatch_vs_nccl"] = row["nccl_dispatch_us"] / row["symm_dispatch_us"]
        row["speedup_combine_vs_nccl"] = row["nccl_combine_us"] / row["symm_combine_us"]
        rows.append(row)
    head = header({"ranks": world, "backend": args.backend, "layout": args.layout, "combine": args.combine,
                   "hidden": args.hidden,
                   "experts": args.experts,
                   "topk": args.topk, "peer_read_GBps": read_bw / 1e9, "peer_write_GBps": write_bw / 1e9,
                   "timing": "CUDA events (symm_*_kernel_us: CUDA profiler), median after warm-up, routing rotated; "
                             "max over ranks"})
    cols = ["tokens", "symm_dispatch_us", "symm_combine_us", "nccl_dispatch_us", "nccl_combine_us",
            "symm_dispatch_host_us", "symm_combine_host_us", "symm_pair_seq_us", "symm_dispatch_seq_us",
            "symm_combine_seq_us", "symm_dispatch_kernel_us", "symm_combine_kernel_us", "dispatch_MB", "dispatch_GBps", "combine_GBps",
            "dispatch_pct_peer", "combine_pct_peer", "dispatch_link_MB", "dispatch_link_pct_peer",
            "speedup_dispatch_vs_nccl", "speedup_combine_vs_nccl", "floor_read_us", "floor_write_us",
            "floor_read_combine_us"]
    lay = ("" if args.layout == "contiguous" else f"-{args.layout}") + ("-pull" if args.combine == "pull" else "")
    write_results(f"comm-{args.backend}-ep{world}{lay}", head, rows, cols)


if __name__ == "__main__":
    main()
