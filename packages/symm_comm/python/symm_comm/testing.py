"""Rank placement for multi-rank tests: R ranks on the GPUs there are, one GPU included.

    from symm_comm.testing import init_rank, free_port
    # in each spawned process (rank r of `world`; the parent picked port = free_port()):
    pl = init_rank(r, world, f"tcp://127.0.0.1:{port}")      # device set, process group up
    buf = symm_comm.Buffer(None, E, H, K, T, backend=pl.backend)

With at least as many GPUs as ranks: rank r on GPU r, a "cpu:gloo,cuda:nccl" process group, the backend
asked for (default "torch": torch symmetric memory). With fewer GPUs than ranks (`shared_gpu`): rank r on
GPU r % #GPUs, a gloo-only group (NCCL refuses two ranks on one GPU), backend "ipc" (CUDA IPC mappings:
torch symmetric memory and NVSHMEM refuse two ranks on one GPU), and torch.distributed's all_to_all_single
/ all_gather / all_reduce / broadcast wrapped so that CUDA tensors go through host copies (gloo has no
CUDA all-to-all). Ranks sharing a GPU are time-sliced: a correctness check, never a performance run.
"""
from __future__ import annotations

import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .backends import keep_multicast_off


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    world: int
    device: torch.device   # this rank's GPU
    backend: str           # symm_comm.Buffer backend to pass: the one asked for, or "ipc" when shared_gpu
    pg_backend: str        # torch.distributed backend: "cpu:gloo,cuda:nccl", or "gloo" when shared_gpu
    shared_gpu: bool       # fewer GPUs than ranks: several ranks per GPU


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for init_method=f"tcp://127.0.0.1:{port}")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def placement(rank: int, world: int, backend: str = "torch", n_gpus: int | None = None) -> RankPlacement:
    """Where rank `rank` of `world` runs (pure: touches no GPU when n_gpus is given).

    backend: the symm_comm backend wanted with one GPU per rank ("torch", "nvshmem" or "ipc"); with fewer
    GPUs than ranks it becomes "ipc" ("nvshmem" then raises: NVSHMEM wants one PE per GPU)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside [0, {world})")
    n = torch.cuda.device_count() if n_gpus is None else n_gpus
    if n < 1:
        raise RuntimeError("symm_comm.testing: no CUDA device (multi-rank GPU tests need at least one GPU)")
    shared = world > n
    if shared:
        if backend == "nvshmem":
            raise ValueError(f"backend 'nvshmem' needs one GPU per rank ({world} ranks, {n} GPUs); "
                             "use 'torch' or 'ipc' (placed as 'ipc')")
        return RankPlacement(rank, world, torch.device("cuda", rank % n), "ipc", "gloo", True)
    return RankPlacement(rank, world, torch.device("cuda", rank), backend, "cpu:gloo,cuda:nccl", False)


def init_rank(rank: int, world: int, init_method: str, backend: str = "torch", *,
              stage_collectives: bool = True, n_gpus: int | None = None) -> RankPlacement:
    """In a spawned rank process: keep NVLink multicast off, set the device, init the default process
    group as placement() says, and (shared GPUs, stage_collectives) stage CUDA-tensor collectives on the
    host. Returns the placement; pass placement.backend to symm_comm.Buffer."""
    keep_multicast_off()
    pl = placement(rank, world, backend, n_gpus)
    torch.cuda.set_device(pl.device)
    if pl.shared_gpu:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        if stage_collectives:
            stage_collectives_on_host()
    else:
        dist.init_process_group(pl.pg_backend, init_method=init_method, rank=rank, world_size=world,
                                device_id=pl.device)
    return pl


_STAGED = {"on": False}


def stage_collectives_on_host() -> None:
    """Wrap torch.distributed.all_to_all_single / all_gather / all_reduce / broadcast (module attributes:
    code calling dist.<name> sees the wrappers) so a gloo group runs them on host copies of CUDA tensors.
    Synchronous (async_op is ignored, None returned). Idempotent; for gloo-only test processes."""
    if _STAGED["on"]:
        return
    a2a, ag, ar, bc = dist.all_to_all_single, dist.all_gather, dist.all_reduce, dist.broadcast

    def all_to_all_single(out, inp, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        if not out.is_cuda:
            return a2a(out, inp, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
        o = out.cpu()
        a2a(o, inp.cpu(), output_split_sizes, input_split_sizes, group=group)
        out.copy_(o)

    def all_gather(outs, t, group=None, async_op=False):
        if not t.is_cuda:
            return ag(outs, t, group=group, async_op=async_op)
        hs = [o.cpu() for o in outs]
        ag(hs, t.cpu(), group=group)
        for o, h in zip(outs, hs):
            o.copy_(h)

    def all_reduce(t, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if not t.is_cuda:
            return ar(t, op=op, group=group, async_op=async_op)
        h = t.cpu()
        ar(h, op=op, group=group)
        t.copy_(h)

    def broadcast(t, src=None, group=None, async_op=False, **kw):
        if not t.is_cuda:
            return bc(t, src, group=group, async_op=async_op, **kw)
        h = t.cpu()
        bc(h, src, group=group, **kw)
        t.copy_(h)

    dist.all_to_all_single, dist.all_gather, dist.all_reduce, dist.broadcast = (
        all_to_all_single, all_gather, all_reduce, broadcast)
    _STAGED["on"] = True


def visible_gpus() -> int:
    """torch.cuda.device_count(), 0 without CUDA (for skip conditions in the parent test process)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # pragma: no cover
        return 0


__all__ = ["RankPlacement", "free_port", "placement", "init_rank", "stage_collectives_on_host", "visible_gpus"]


def spawn_ranks(worker, world: int, args: tuple, timeout_s: float = 600, what: str = "test") -> list:
    """Runs worker(rank, world, port, *args, outdir) in `world` spawned processes (importable worker;
    each writes its result dict to outdir/rank<r>.json) and returns the results in rank order. A rank
    with no result file gets {"rank": r, "ok": False, "error": ...}; processes alive after timeout_s
    are killed and RuntimeError is raised (a hang is an error, never a wait)."""
    import json
    import os
    import tempfile
    import time

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    outdir = tempfile.mkdtemp(prefix="symm_ranks_")
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, *args, outdir)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout_s
    for p in procs:
        p.join(max(1.0, deadline - time.time()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in hung:
        procs[i].kill()
    results = []
    for r in range(world):
        fn = os.path.join(outdir, f"rank{r}.json")
        if os.path.exists(fn):
            with open(fn) as f:
                results.append(json.load(f))
        else:
            results.append({"rank": r, "ok": False, "error": "no result (crashed or hung)", "done": []})
    if hung:
        raise RuntimeError(f"{what} processes {hung} hung (killed after {timeout_s} s); results: {results}")
    return results
