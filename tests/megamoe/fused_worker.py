"""Multi-process checks of megamoe.MegaMoE(backend="fused") against backend="staged" (one process per rank;
ranks sharing a GPU go through symm_comm's "ipc" backend, as layer_worker.py). Used by
test_fused_ranks_gpu.py; runnable directly:  python3 tests/megamoe/fused_worker.py --world 2 [--seed N]

Every rank builds both layers from its local experts and compares the fused output with the staged one
BITWISE on every call: the cases (random routing with -1 ids, a rank with zero tokens, every token on one
expert, one token, T = max_tokens_per_rank), 1000 back-to-back calls with fresh routing, 100 CUDA-graph
replays, and a timeout (rank 1 skips a call: rank 0 must raise SymmTimeoutError naming rank and phase,
then every rank resyncs and the next call is equal again)."""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import layer_worker  # noqa: E402
from layer_cases import (assert_fused_equals_staged, check_metric, generator, graph_replays, make_inputs, metric,  # noqa: E402
                         why)

E, H, I, K, T_MAX = 16, 512, 256, 4, 64
SCENARIOS = ("cases", "back_to_back", "graph", "timeout")




def _barrier():
    if dist.is_initialized():
        dist.barrier()


def run_all(rank, world, comm, seed, scenarios, res):
    import megamoe
    from megamoe.reference import make_weights
    full = make_weights(E, H, I, seed=seed)
    local = megamoe.local_experts(full, rank, world)
    tmo = 60.0 if layer_worker.oversubscribed(world) else 20.0
    kw = dict(max_tokens_per_rank=T_MAX, topk=K, comm_backend=comm)
    staged = megamoe.MegaMoE(local, backend="staged", timeout_s=tmo, **kw)
    fused = megamoe.MegaMoE(local, backend="fused", timeout_s=tmo, verbose=True, **kw)
    dev = fused.device

    def inputs(case, Ts, **k):
        return [t.to(dev) for t in make_inputs(generator(seed, case, rank), Ts[rank], H, E, K, **k)]

    def compare(name, case, Ts, **k):
        x, idx, w = inputs(case, Ts, **k)
        ys = staged(x, idx, w)
        yf = fused(x, idx, w)
        torch.cuda.synchronize()
        staged.check_errors()
        fused.check_errors()
        assert_fused_equals_staged(yf, ys, f"rank {rank}/{world} {name} (T per rank {Ts}), {why(seed)}")
        res["cases"][name] = int(x.shape[0])
        return yf, x, idx, w

    def cases():
        R = world
        compare("random", 1, [[33, 1, 64, 7][s % 4] for s in range(R)])
        compare("one_token", 2, [1] * R)
        compare("zero_on_rank0", 3, [0] + [20] * (R - 1))
        compare("all_zero", 4, [0] * R)
        compare("one_expert", 5, [T_MAX] * R, hot=E - 1, p_missing=0.0)
        compare("max_tokens_no_missing", 7, [T_MAX] * R, p_missing=0.0)
        compare("int32_ids", 9, [[5, 64, 0, 31][s % 4] for s in range(R)], idx_dtype=torch.int32)
        # the staged path is checked against the float64 reference by layer_worker; here one sanity bar
        yf, x, idx, w = compare("sanity", 10, [24] * R)
        from layer_worker import _global_inputs, _reference_rows
        ref = _reference_rows(full, _global_inputs(seed, 10, [24] * R), rank)
        check_metric(metric(yf, ref), f"rank {rank}/{world} fused sanity vs moe_reference, {why(seed)}")

    def back_to_back():
        n = 1000
        bad = []
        for i in range(n):
            Ts = [(i * 13 + s * 7) % (T_MAX + 1) for s in range(world)]
            x, idx, w = inputs(1000 + i, Ts)
            yf = fused(x, idx, w)
            ys = staged(x, idx, w)
            if not torch.equal(yf.view(torch.int16), ys.view(torch.int16)):
                bad.append(i)
        torch.cuda.synchronize()
        fused.check_errors()
        staged.check_errors()
        assert not bad, f"rank {rank}/{world}: {len(bad)} of {n} back-to-back calls differ (first {bad[:5]}), {why(seed)}"
        res["cases"]["back_to_back"] = n

    def graph():
        Ts = [[24, 8, 40, 1][s % 4] for s in range(world)]
        sets = [inputs(200 + j, Ts) for j in range(3)]
        want = [staged(*s) for s in sets]
        fused(*sets[0])
        torch.cuda.synchronize()
        graph_replays(fused, sets, 100, lambda i: (i + 1) % 3,
                      lambda ys, i, j: assert_fused_equals_staged(ys, want[j], f"rank {rank}/{world} graph replay {i}, "
                                                                               f"{why(seed)}"),
                      barrier=_barrier)
        fused.check_errors()
        compare("eager_after_graph", 300, [[3, 30, 0, 64][s % 4] for s in range(world)])

    def timeout():
        if world < 2:
            return
        from symm_comm import SymmTimeoutError
        short = megamoe.MegaMoE(local, backend="fused", timeout_s=2.0, **kw)
        x, idx, w = inputs(400, [16] * world)
        _barrier()
        if rank == 0:
            try:
                short(x, idx, w)
                torch.cuda.synchronize()
                short.check_errors()
                raise AssertionError("rank 0: a call that rank 1 never entered did not time out")
            except SymmTimeoutError as e:
                msg = str(e)
                # names the rank and the phase ("symm_comm: rank 0: timed out in dispatch cross-rank barrier ...")
                assert "rank 0" in msg and "dispatch" in msg and "timed out" in msg, msg
                res["timeout_error"] = msg
                print(f"rank 0 timeout report: {msg}", flush=True)
        torch.cuda.synchronize()
        _barrier()
        short.resync()
        y1 = short(x, idx, w)
        y2 = staged(x, idx, w)
        torch.cuda.synchronize()
        short.check_errors()
        assert_fused_equals_staged(y1, y2, f"rank {rank}/{world} call after timeout + resync, {why(seed)}")
        torch.cuda.synchronize()
        _barrier()
        short.destroy()
        res["cases"]["after_timeout"] = 16

    failed = False
    try:
        for name, fn in (("cases", cases), ("back_to_back", back_to_back), ("graph", graph), ("timeout", timeout)):
            if name in scenarios:
                t0 = time.perf_counter()
                fn()
                res["done"].append(name)
                res.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 1)
                print(f"rank {rank}/{world}: {name} passed in {res['seconds'][name]} s", flush=True)
    except BaseException:
        failed = True
        print(f"rank {rank}/{world} FAILED:\n{traceback.format_exc()}", flush=True)
        raise
    finally:
        if not failed:  # destroy is collective: after a failure the other ranks may never reach it
            torch.cuda.synchronize()
            fused.destroy()
            staged.destroy()


def _worker(rank, world, port, seed, scenarios, backend, outdir):
    layer_worker.run_worker(run_all, rank, world, port, seed, scenarios, outdir, backend)


def launch(world: int, seed: int, scenarios=SCENARIOS, timeout_s: float = 900, backend: str = "torch") -> list[dict]:
    from symm_comm.testing import spawn_ranks
    return spawn_ranks(_worker, world, (seed, list(scenarios), backend), timeout_s, "megamoe fused test")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    a = ap.parse_args()
    from layer_cases import fresh_seed
    seed = a.seed if a.seed is not None else fresh_seed()
    print(f"world {a.world}, {why(seed)}", flush=True)
    res = launch(a.world, seed, a.scenarios.split(","))
    ok = all(r["ok"] for r in res)
    for r in res:
        print(r["rank"], r["ok"], r.get("error", ""), r.get("done"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
