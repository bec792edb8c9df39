"""Where the time of one symm_comm dispatch / combine goes: %globaltimer stamps the kernels write into
their state (CTA 0's view of each stage, and the last CTA out), read after a back-to-back sequence
like bench/comm.py's (H 7168, 256 experts, top-8). Prints, per rank and token count, the stages in us
from the dispatch's start, the gap between the dispatch's end and the combine's start, and the
CUDA-event time of each call. Diagnostics only; run on >= 1 GPU: python3 experiments/comm_stamps.py"""
from __future__ import annotations

import os
import sys
from pathlib import Path

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/comm.py, bench/common.py
from comm import _routing, init_rank, spawn_ranks  # noqa: E402
from common import time_cuda_sequence  # noqa: E402

STAMPS = 160  # SYMM_STATE_STAMPS (layout.cuh)
NAMES = ["d.start", "d.phaseA", "d.barrier", "d.tables+pad", "d.pull(cta0)", "d.last_out",
         "c.start", "c.handshake+sched", "c.items(cta0)", "c.last_out"]


def _worker(rank, world, port, tokens):
    init_rank(rank, world, port)
    import symm_comm
    E, H, K = 256, 7168, 8
    pull = os.environ.get("STAMPS_COMBINE", "push") == "pull"  # the pull combine (rows in buf.combine_input())
    buf = symm_comm.Buffer(None, E, H, K, max(tokens), check=False, timeout_s=60.0,
                           combine_input_rows=-1 if pull else 0)
    dev = torch.device("cuda", rank)
    gen = torch.Generator(device=dev)
    gen.manual_seed(7 + rank)
    eo = torch.randn(buf.pool_rows, H, generator=gen, device=dev).to(torch.bfloat16)
    if pull:
        eo = buf.combine_input().copy_(eo)
    off = buf.layout.off_state + STAMPS
    for T in tokens:
        rots = [_routing(rank, T, H, E, K, gen, dev) for _ in range(4)]
        st = {}

        def d(i):
            def f(rep):
                st[i] = buf.dispatch(*rots[(rep + i) % 4])[-1]
            return f

        def c(i):
            def f(rep):
                buf.combine(eo, st[i])
            return f

        # STAMPS_NO_COMBINE=1: dispatches only, back to back (the combine stamps are then stale): does the
        # dispatch run faster when no other kernel ran on the SMs in between (instruction cache warm)?
        no_c = os.environ.get("STAMPS_NO_COMBINE", "0") == "1"
        fns = [d(i) for i in range(4)] if no_c else [g for i in range(4) for g in (d(i), c(i))]
        dist.barrier()
        tt = time_cuda_sequence(fns, warmup=3, reps=10)
        torch.cuda.synchronize()
        buf.check_errors()
        s = buf.raw[off:off + 12 * 8].view(torch.int64).cpu().tolist()
        t0 = s[0]
        rel = " ".join(f"{n}={(v - t0) / 1e3:.1f}" for n, v in zip(NAMES, s[:10]))
        dt = sorted(t for rep in tt for t in (rep if no_c else rep[0::2]))
        med = lambda v: f"{v[len(v) // 2] * 1e6:.1f}"  # noqa: E731
        if no_c:  # no combine ran: its stamps are stale, so only the dispatch is reported
            print(f"rank {rank} T={T}: {rel} | in-kernel d {(s[5] - s[0]) / 1e3:.1f} | events median d "
                  f"{med(dt)} us", flush=True)
        else:
            ct = sorted(t for rep in tt for t in rep[1::2])
            print(f"rank {rank} T={T}: {rel} | in-kernel d {(s[5] - s[0]) / 1e3:.1f} c {(s[9] - s[6]) / 1e3:.1f} "
                  f"gap d->c {(s[6] - s[5]) / 1e3:.1f} | events median d {med(dt)} c {med(ct)} us", flush=True)
        dist.barrier()
    buf.destroy()
    dist.barrier()
    dist.destroy_process_group()


def main():
    spawn_ranks(_worker, [int(t) for t in (sys.argv[1:] or ["1", "128", "4096"])])


if __name__ == "__main__":
    main()
