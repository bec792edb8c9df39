"""A small symm_comm workload for compute-sanitizer and ncu: on every GPU of the machine (one rank
each), a few dispatch (contiguous and masked) + combine calls at small shapes, fresh routing each call,
then a check of the combine against the local sum of what was dispatched (catches a run that silently
did nothing) and the buffer's error word; then the pull combine of the same rows (bitwise equal). Run it under the tool, e.g.
  compute-sanitizer --tool memcheck python3 bench/profile_comm.py [tokens ...]
SYMM_PROFILE_SHAPE="E,H,K"
(default "8 * ranks,512,4") sets the experts, hidden size and top-k, e.g. the bench's "256,7168,8" for ncu:
  CUDA_VISIBLE_DEVICES=0 SYMM_PROFILE_SHAPE=256,7168,8 ncu --clock-control none -k regex:symm_dispatch \
      --launch-skip 2 --launch-count 1 --set full --import-source yes -o dispatch128 \
      python3 bench/profile_comm.py 128"""
from __future__ import annotations

import os
import sys
from pathlib import Path

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from comm import _routing, init_rank, spawn_ranks  # noqa: E402


def _worker(rank, world, port, tokens):
    init_rank(rank, world, port)
    import symm_comm
    shape = os.environ.get("SYMM_PROFILE_SHAPE")
    E, H, K = (int(v) for v in shape.split(",")) if shape else (8 * world, 512, 4)
    buf = symm_comm.Buffer(None, E, H, K, max(tokens), timeout_s=300.0, max_m=max(tokens) * world,
                           combine_input_rows=-1)
    dev = torch.device("cuda", rank)
    gen = torch.Generator(device=dev)
    gen.manual_seed(11 + rank)
    for T in tokens:
        for layout in ("contiguous", "masked"):
            x, s, idx, w = _routing(rank, T, H, E, K, gen, dev)
            idx[::3, 1] = -1  # some slots send nothing
            pool, ps, pw, counts, h = buf.dispatch(x, s, idx, w, layout=layout)
            # expert output = the received row (FP8 -> BF16, exact), so y[t] = sum over sent k of x[t]
            eo = pool.float().to(torch.bfloat16)
            y = buf.combine(eo, h)
            buf.check_errors()
            sent = (idx >= 0).sum(1, keepdim=True).float()
            ref = (x.float() * sent).to(torch.bfloat16)
            bad = (y.float() - ref.float()).abs() > 1e-2 * ref.float().abs() + 1e-3
            if bad.any():
                raise RuntimeError(f"rank {rank} T={T} {layout}: {int(bad.sum())} wrong elements")
            # the pull combine of the same rows (written into the buffer's input region): the same bits
            ci = buf.combine_input(masked=layout == "masked")
            ci.copy_(eo)
            y2 = buf.combine(ci, h)
            buf.check_errors()
            if not torch.equal(y2.view(torch.int16), y.view(torch.int16)):
                raise RuntimeError(f"rank {rank} T={T} {layout}: pull combine differs from the push combine")
            print(f"rank {rank} T={T} {layout}: ok", flush=True)
    dist.barrier()
    buf.destroy()
    dist.barrier()
    dist.destroy_process_group()


def main():
    spawn_ranks(_worker, [int(t) for t in (sys.argv[1:] or ["1", "37", "600"])])


if __name__ == "__main__":
    main()
