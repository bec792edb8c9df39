"""Multi-process GPU checks of megamoe.MegaMoE (one process per rank), used by test_layer_ranks_gpu.py and
runnable directly:  python3 tests/megamoe/layer_worker.py --world 2 [--seed N]

Rank r runs on GPU r % #GPUs. world 1: no torch.distributed at all (single-process mode). world <= #GPUs:
NCCL (+ gloo for CPU objects) and comm_backend "torch". world > #GPUs (ranks sharing a GPU): a gloo group
and comm_backend "ipc" (CUDA IPC mappings; torch symmetric memory refuses two ranks on one GPU), placed by
symm_comm.testing.init_rank.
Every rank builds every rank's inputs from the seed, computes the global reference itself (the full
make_weights set) and checks its own rows (fraction within one BF16 step >= 0.97, rel. Frobenius <= 5e-3)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from layer_cases import check_metric, generator, graph_replays, make_inputs, metric, poison, stage_rows, why  # noqa: E402

E, H, I, K, T_MAX = 16, 512, 256, 4, 64


# ---- process plumbing: symm_comm.testing places the ranks (one GPU each, or several on one GPU) ------
from symm_comm.testing import init_rank  # noqa: E402


def oversubscribed(world: int) -> bool:
    return world > torch.cuda.device_count()


def can_oversubscribe() -> bool:
    return True  # symm_comm's "ipc" backend maps the buffers of ranks sharing a GPU


def _setup(rank: int, world: int, port: int, backend: str = "torch") -> str:
    """Process group for `world` ranks (none for one); returns the comm_backend to pass to MegaMoE
    (`backend` with a GPU per rank, "ipc" for ranks sharing a GPU: symm_comm.testing.placement)."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(world, 1) // 2))
    if world == 1:
        torch.cuda.set_device(0)
        return "torch"  # single-process mode: no process group at all
    return init_rank(rank, world, f"tcp://127.0.0.1:{port}", backend).backend


def backend_skip(world: int, backend: str) -> str | None:
    """Why a (world, comm backend) case cannot run here, or None. NVSHMEM: one PE per GPU, nvshmem4py; 8 ranks:
    8 GPUs (time-sliced on fewer, 8 ranks check nothing 4 do not, and take minutes)."""
    if world >= 8 and world > torch.cuda.device_count():
        return f"{world} ranks need {world} GPUs ({torch.cuda.device_count()} here; fewer ranks cover the time-sliced case)"
    if backend != "nvshmem":
        return None
    if world < 2 or world > torch.cuda.device_count():
        return f"NVSHMEM needs one GPU per rank ({world} ranks, {torch.cuda.device_count()} GPUs)"
    import symm_comm
    return None if symm_comm.nvshmem_available() else "no nvshmem4py"


def _nvshmem_finalize_all(ran: bool, res: dict) -> None:
    """After run and the result file (every layer's collective destroy done, or an exception caught on its
    way out): NVSHMEM's finalize is collective, so the ranks first agree (a gloo all_reduce every rank that
    got out of run reaches, failed ones too) and finalize only if every rank got through; otherwise none
    does (the processes exit anyway). A rank stuck inside run leaves the others here until spawn_ranks'
    limit kills them, their result files already written."""
    import symm_comm
    every = torch.tensor([1 if ran else 0], dtype=torch.int32)
    try:
        dist.all_reduce(every, op=dist.ReduceOp.MIN)  # a CPU tensor: the group's gloo part
        if int(every.item()) == 1:
            dist.barrier()
            symm_comm.nvshmem_finalize()
    except Exception as e:  # noqa: BLE001  (the run's own result stands)
        print(f"rank {res['rank']}: nvshmem finalize: {type(e).__name__}: {e}", flush=True)


def run_worker(run, rank, world, port, seed, scenarios, outdir, backend: str = "torch"):
    """One rank's process: placement / process group, run(rank, world, comm, seed, scenarios, res), the
    result file. Shared with fused_worker.py."""
    res = {"rank": rank, "ok": False, "done": [], "cases": {}, "seed": seed}
    comm = None
    try:
        comm = _setup(rank, world, port, backend)
        res["comm_backend"] = comm
        run(rank, world, comm, seed, scenarios, res)
        res["ok"] = True
    except BaseException as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    finally:
        with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:  # first: a hang below loses nothing
            json.dump(res, f)
        if comm == "nvshmem":
            _nvshmem_finalize_all(res["ok"], res)
        try:
            if res["ok"] and dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
    os._exit(0 if res["ok"] else 1)


def _worker(rank, world, port, seed, scenarios, backend, outdir):
    run_worker(run_all, rank, world, port, seed, scenarios, outdir, backend)


def launch(world: int, seed: int, scenarios=("cases", "back_to_back", "graph"), timeout_s: float = 600,
           backend: str = "torch") -> list[dict]:
    """Spawn `world` processes (comm backend `backend` where each rank has its GPU); returns their result
    dicts (raises on a hang)."""
    from symm_comm.testing import spawn_ranks
    return spawn_ranks(_worker, world, (seed, list(scenarios), backend), timeout_s, "megamoe layer test")


# ---- the checks ----------------------------------------------------------------------------------
def _global_inputs(seed: int, case: int, Ts: list, rank_kw: dict | None = None, **kw):
    """Every rank's CPU inputs of one call (rank s: generator(seed, case, s), make_inputs(**kw, **rank_kw[s]))."""
    rank_kw = rank_kw or {}
    return [make_inputs(generator(seed, case, s), Ts[s], H, E, K, **{**kw, **rank_kw.get(s, {})})
            for s in range(len(Ts))]


def _reference_rows(weights, inputs, rank):
    """Global reference over all ranks' tokens; this rank's rows."""
    from megamoe.reference import moe_reference
    x = torch.cat([a[0] for a in inputs])
    idx = torch.cat([a[1].long() for a in inputs])
    w = torch.cat([a[2] for a in inputs])
    y = moe_reference(x, idx, w, weights)
    start = sum(a[0].shape[0] for a in inputs[:rank])
    return y[start:start + inputs[rank][0].shape[0]]


def run_all(rank, world, comm, seed, scenarios, res):
    import megamoe
    from megamoe.reference import make_weights
    full = make_weights(E, H, I, seed=seed)  # every rank: the full set (for the global reference)
    local = megamoe.local_experts(full, rank, world)
    layer = megamoe.MegaMoE(local, max_tokens_per_rank=T_MAX, topk=K, comm_backend=comm,
                            timeout_s=60.0 if oversubscribed(world) else 20.0, verbose=True)
    res["memory"] = layer.memory_report()["total"]
    dev = layer.device

    def call_and_check(name, case, Ts, rank_kw=None, **kw):
        inputs = _global_inputs(seed, case, Ts, rank_kw, **kw)
        x, idx, w = (t.to(dev) for t in inputs[rank])
        if dist.is_initialized():
            # peers' pull combines of the previous call read this rank's combine input in place: poison
            # it only after every rank finished (each synchronised its GPU before this barrier)
            dist.barrier()
        poison(layer)
        y = layer(x, idx, w)
        torch.cuda.synchronize()
        layer.check_errors()
        m = metric(y, _reference_rows(full, inputs, rank))
        # this rank's pool rows: the kernel's L2 output vs float64 L2 on its own L1 output (stage reference)
        Lx = E // world
        _, ref_rows, kern_rows = stage_rows(layer, full.w2_deq[rank * Lx:(rank + 1) * Lx])
        ms = metric(kern_rows, ref_rows)
        res["cases"][name] = dict(m, stage_rows=ms)
        print(f"rank {rank}/{world} {name}: end-to-end {m}, stage rows {ms}", flush=True)
        check_metric(ms, f"rank {rank}/{world} {name} pool rows (T per rank {Ts}), {why(seed)}", stage=True)
        check_metric(m, f"rank {rank}/{world} {name} (T per rank {Ts}), {why(seed)}")

    def step(name, fn):
        fn()
        res["done"].append(name)

    def cases():
        R = world
        call_and_check("random", 1, [[33, 1, 64, 7][s % 4] for s in range(R)])
        call_and_check("one_token", 2, [1] * R)
        call_and_check("zero_on_rank0", 3, [0] + [20] * (R - 1))
        call_and_check("all_zero", 4, [0] * R)
        call_and_check("hot_last_expert", 5, [T_MAX] * R, hot=E - 1)
        call_and_check("hot_first_expert", 6, [[17, 64, 3, 40][s % 4] for s in range(R)], hot=0)
        call_and_check("max_tokens_no_missing", 7, [T_MAX] * R, p_missing=0.0)
        call_and_check("all_missing_on_rank1", 8, [9] * R, rank_kw={1: dict(all_missing=True)})
        call_and_check("int32_ids", 9, [[5, 64, 0, 31][s % 4] for s in range(R)], idx_dtype=torch.int32)

    def back_to_back():
        outs = []
        for i in range(8):
            Ts = [(i * 13 + s * 7) % (T_MAX + 1) for s in range(world)]
            inputs = _global_inputs(seed, 100 + i, Ts)
            x, idx, w = (t.to(dev) for t in inputs[rank])
            outs.append((layer(x, idx, w), inputs, Ts))
        torch.cuda.synchronize()
        layer.check_errors()
        for i, (y, inputs, Ts) in enumerate(outs):
            m = metric(y, _reference_rows(full, inputs, rank))
            res["cases"][f"back_to_back_{i}"] = m
            check_metric(m, f"rank {rank}/{world} back-to-back call {i} (T per rank {Ts}), {why(seed)}")

    def graph():
        Ts = [[24, 8, 40, 1][s % 4] for s in range(world)]
        sets = [_global_inputs(seed, 200 + j, Ts) for j in range(3)]
        mine = [tuple(t.to(dev) for t in s_[rank]) for s_ in sets]
        eager = [layer(*m) for m in mine]
        torch.cuda.synchronize()
        layer.check_errors()
        for j in range(3):
            check_metric(metric(eager[j], _reference_rows(full, sets[j], rank)), f"rank {rank} graph eager {j}")
        def same_as_eager(ys, i, j):
            assert torch.equal(ys.view(torch.int16), eager[j].view(torch.int16)), \
                f"rank {rank}/{world}: graph replay {i} differs from eager, {why(seed)}"
        graph_replays(layer, mine, 20, lambda i: (i + 1) % 3, same_as_eager,
                      barrier=dist.barrier if dist.is_initialized() else None)
        layer.check_errors()
        call_and_check("eager_after_graph", 300, [[3, 30, 0, 64][s % 4] for s in range(world)])

    try:
        if "cases" in scenarios:
            step("cases", cases)
        if "back_to_back" in scenarios:
            step("back_to_back", back_to_back)
        if "graph" in scenarios:
            step("graph", graph)
    finally:
        torch.cuda.synchronize()
        layer.destroy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--scenarios", default="cases,back_to_back,graph")
    a = ap.parse_args()
    from layer_cases import fresh_seed
    seed = a.seed if a.seed is not None else fresh_seed()
    world = a.world or torch.cuda.device_count()
    print(f"world {world}, {why(seed)}", flush=True)
    res = launch(world, seed, a.scenarios.split(","))
    ok = all(r["ok"] for r in res)
    for r in res:
        print(json.dumps({k: v for k, v in r.items() if k != "traceback"}))
        if not r["ok"]:
            print(r.get("traceback", ""))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
