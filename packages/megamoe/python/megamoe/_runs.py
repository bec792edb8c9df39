"""megamoe-bench's GPU runs: build each backend's layer, time whole calls (CUDA-graph replay and eager,
host-inclusive) per tokens-per-rank setting, and turn the times into rows against the cost model's
floors (_costs). bench.py is the CLI around it."""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from ._costs import (DEFAULT_PEAKS, TARGET_FACTOR, TARGET_SLACK_US, TARGET_TOKENS, TORCH_BASELINES, Shape,
                     _rank_tokens, floor_time, hbm_bytes, make_routing, nvlink_bytes, rank_costs)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)



# --- GPU timing (staged layer and torch baselines) ------------------------------------------------

INPUT_SETS = 2      # inputs rotated inside the graph and between eager calls
GPU_DEVICE_TYPE = "cuda"  # the tests run the GPU flow on CPU tensors by setting "cpu"
GRAPH_BATCH = 2     # calls per graph (>= INPUT_SETS)


def activation_bytes(backend: str, T: int, ranks: int, shape: Shape) -> int:
    """Rough upper bound on one call's temporaries (HBM), per rank, for the memory check."""
    P = T * shape.K * (ranks if ranks > 1 else 1)  # a rank may receive every rank's pairs at worst
    rows = P + 15 * min(P, shape.E // ranks)
    per = rows * (2 * shape.I * 2 + 4 * shape.I * 4 + 3 * shape.H) + P * shape.H * 6 + T * shape.H * 8
    return INPUT_SETS * per


def weight_bytes(backend: str, experts: int, shape: Shape) -> int:
    from .baselines import dense_weight_bytes, fp4_weight_bytes
    if backend in TORCH_BASELINES:
        return dense_weight_bytes(TORCH_BASELINES[backend], experts, shape.H, shape.I)
    return 2 * fp4_weight_bytes(experts, shape.H, shape.I)  # ours + the layer's packed copy


def _log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[megamoe-bench] {msg}", file=sys.stderr, flush=True)


def _inputs(T: int, world: int, rank: int, shape: Shape, seed: int, device, cache: dict | None = None):
    """INPUT_SETS (x, topk_idx, topk_w) draws of this rank's tokens; set 0 is what the costs use.
    Host-side draws are kept in `cache` (reused by every backend)."""
    key = (shape, T)
    if cache is None or key not in cache:
        sets = []
        for s in range(INPUT_SETS):
            sd = seed + T + 7919 * s
            idx, w = make_routing(world * T, shape, sd)
            rows = slice(rank * T, (rank + 1) * T)
            sets.append((_rank_tokens(T, shape.H, sd, rank), idx[rows].contiguous(), w[rows].float().contiguous()))
        if cache is None:
            return [tuple(t.to(device) for t in st) for st in sets]
        cache[key] = sets
    return [tuple(t.to(device) for t in st) for st in cache[key]]


def _build(backend: str, shape: Shape, world: int, rank: int, group, max_tokens: int, seed: int, device,
           comm_backend: str = "torch"):
    """(call, capturable, check_errors, close) for one backend, its weights on `device` (comm_backend: the layer's
    symm_comm backend, "ipc" for time-sliced ranks sharing a GPU): call(x, topk_idx,
    topk_w) -> y; check_errors() raises a device-side error the layer recorded; close() frees it
    (the layer stays registered for its custom op until destroyed). The last two may be None."""
    per_rank = shape.E // world
    experts = range(rank * per_rank, (rank + 1) * per_rank)
    if backend in ("staged", "fused", "auto"):
        from . import ExpertWeights, MegaMoE
        from .baselines import make_fp4_experts
        tw1, tw2 = make_fp4_experts(per_rank, shape.H, shape.I, device=device, seed=seed)
        kwargs = dict(group=group, max_tokens_per_rank=max_tokens, topk=shape.K, backend=backend)
        if comm_backend != "torch":
            kwargs["comm_backend"] = comm_backend
        layer = MegaMoE(ExpertWeights(num_experts=shape.E, experts=experts, w1=tw1, w2=tw2), **kwargs)
        del tw1, tw2
        layer.check_ids = False  # the host-side id check syncs; a serving loop validates upstream
        return layer, True, getattr(layer, "check_errors", None), getattr(layer, "destroy", None)
    from .baselines import make_dense_experts, torch_moe, torch_moe_distributed
    W = make_dense_experts(TORCH_BASELINES[backend], shape.E, experts, shape.H, shape.I, device=device, seed=seed)
    if world == 1:
        return (lambda x, i, w: torch_moe(x, i, w, W)), True, None, None
    return (lambda x, i, w: torch_moe_distributed(x, i, w, W, group)), False, None, None  # host splits: eager only


def _gpu_rank(rank: int, world: int, cfg: dict, progress=None) -> list[dict]:
    """Every (backend, preset, tokens) case on this rank: {preset, backend, T, graph_s, eager_s, note}.
    Backends run in the order given, each over all presets (so a backend listed last cannot spoil the
    ones before it, e.g. by a sticky CUDA error); progress(cases so far) after each (backend, preset)."""
    from . import _timing
    if cfg.get("device_type", "cuda") == "cuda":
        # rank r on GPU r, or time-sliced on GPU r % #GPUs with the "ipc" comm backend (bench.py checks the
        # backends allow it): the placement run_local_ranks' rank process set up
        from symm_comm.testing import placement
        pl = placement(rank, world)
        device, comm_backend = pl.device, pl.backend
        torch.cuda.set_device(device)
        # the memory check's share: the ranks placed on this GPU split it
        total = torch.cuda.get_device_properties(device).total_memory // -(-world // torch.cuda.device_count())
    else:  # CPU: only the tests run this path (torch-bf16 and a stand-in layer, fake timers)
        device, comm_backend = torch.device("cpu"), "torch"
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    group = dist.group.WORLD if world > 1 else None
    out, cache = [], {}
    for backend in cfg["backends"]:
        for preset in cfg["presets"]:
            shape = Shape(**cfg["shapes"][preset])
            wbytes = weight_bytes(backend, shape.E // world, shape)
            tokens, skipped = [], []
            for T in cfg["tokens"]:
                fits = wbytes + activation_bytes(backend, T, world, shape) < 0.9 * total
                (tokens if fits else skipped).append(T)
            for T in skipped:
                out.append(dict(preset=preset, backend=backend, T=T, graph_s=None, eager_s=None,
                                note=f"skipped: needs ~{(wbytes + activation_bytes(backend, T, world, shape)) / 2**30:.0f} "
                                     f"GiB of {total / 2**30:.0f} GiB"))
            t0 = time.perf_counter()
            call = check = close = None
            try:
                if tokens:
                    call, capturable, check, close = _build(backend, shape, world, rank, group, max(tokens),
                                                            cfg["seed"], device, comm_backend=comm_backend)
                    _sync(device)
                    _log(rank, f"{preset} {backend}: weights built in {time.perf_counter() - t0:.1f} s")
            except Exception as e:  # report, don't hide: every row of this backend says what failed
                note = f"build failed: {type(e).__name__}: {str(e)[:200]}"
                _log(rank, f"{preset} {backend}: {note}")
                out += [dict(preset=preset, backend=backend, T=T, graph_s=None, eager_s=None, note=note) for T in tokens]
                tokens = []
            for T in tokens:
                row = dict(preset=preset, backend=backend, T=T, graph_s=None, eager_s=None, note="")
                try:
                    sets = _inputs(T, world, rank, shape, cfg["seed"], device, cache)
                    fns = [(lambda s=s: call(*s)) for s in sets]
                    y = fns[0]()
                    if not bool(torch.isfinite(y).all()):
                        row["note"] = "non-finite output; "
                    del y
                    row["eager_s"] = _timing.time_cuda(fns, warmup=cfg["warmup"], reps=cfg["reps"], batch=GRAPH_BATCH)
                    if capturable and not cfg["no_graph"]:
                        row["graph_s"] = _timing.time_cuda_graph(fns, warmup=cfg["warmup"], reps=cfg["reps"], batch=GRAPH_BATCH)
                        if row["graph_s"] is None:
                            row["note"] += "graph capture failed: eager time only"
                    elif not capturable:
                        row["note"] += "eager only (host-known all_to_all splits)"
                    del sets, fns
                    if backend in ("staged", "fused", "auto") and capturable and not cfg["no_graph"]:
                        # the same two expert GEMMs alone, on the pool the last call left (same tiles, same
                        # rows): what the layer's quantise + dispatch + combine cost on top of them
                        row["gemm_s"] = _timing.time_cuda_graph([lambda: call._expert_gemms(T)], warmup=cfg["warmup"],
                                                                reps=cfg["reps"], batch=GRAPH_BATCH)
                    if check is not None:
                        check()
                except Exception as e:
                    row["note"] += f"failed: {type(e).__name__}: {str(e)[:200]}"
                out.append(row)
                g, e = row["graph_s"], row["eager_s"]
                _log(rank, f"{preset} {backend} T={T}: graph {'-' if g is None else f'{g * 1e6:.1f}'} us, "
                           f"eager {'-' if e is None else f'{e * 1e6:.1f}'} us {row['note']}")
            if call is not None and close is not None:
                try:
                    close()
                except Exception as e:
                    _log(rank, f"{preset} {backend}: close failed: {type(e).__name__}: {str(e)[:200]}")
            call = check = close = None
            _sync(device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if progress is not None:
                progress(out)
    return out


# --- rows, tables, files --------------------------------------------------------------------------

def _parse_peaks(text: str | None) -> tuple[dict, dict]:
    """'fp8_tflops=1290,hbm_tbs=4.1' -> (peaks, {key: value} given)."""
    given = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        if key not in DEFAULT_PEAKS or not value:
            raise ValueError(f"--peaks: expected KEY=VALUE with KEY in {sorted(DEFAULT_PEAKS)}, got {item!r}")
        given[key] = float(value)
    return {**DEFAULT_PEAKS, **given}, given


def make_row(preset: str, backend: str, T: int, ranks: int, shape: Shape, seed: int, peaks: dict | None,
             time_s: float | None, eager_s: float | None = None, note: str = "") -> dict:
    """One result row. time_s is the primary time (CUDA-graph replay; eager when no graph), eager_s
    the host-inclusive one. peaks None (no GPU): floor and ratio columns are None."""
    idx, _ = make_routing(ranks * T, shape, seed + T)
    costs = rank_costs(idx, ranks, shape)
    row = {"preset": preset, "backend": backend, "tokens_per_rank": T, "pairs": sum(c.pairs for c in costs),
           "time_us": None if time_s is None else time_s * 1e6,
           "eager_us": None if eager_s is None else eager_s * 1e6,
           "tflops_per_rank": None, "hbm_bytes": max(c.hbm for c in costs),
           "nvlink_bytes": max(c.nvlink for c in costs), "floor_us": None, "bound": None,
           "time_over_floor": None, "hbm_floor_us": None, "target_ok": None, "speedup_vs_torch_fp8": None,
           "note": note}
    if time_s:
        row["tflops_per_rank"] = sum(c.flops for c in costs) / ranks / time_s / 1e12
    if peaks is not None:
        floor, bound = max(floor_time(c.flops, c.hbm, c.nvlink, peaks) for c in costs)
        row.update(floor_us=floor * 1e6, bound=bound,
                   hbm_floor_us=max(c.hbm for c in costs) / (peaks["hbm_tbs"] * 1e12) * 1e6)
        if time_s:
            row["time_over_floor"] = time_s / floor
            if TARGET_TOKENS[0] <= T <= TARGET_TOKENS[1]:
                row["target_ok"] = row["time_us"] <= TARGET_FACTOR * row["hbm_floor_us"] + TARGET_SLACK_US
    return row


def add_speedups(rows: list[dict]) -> None:
    """speedup_vs_torch_fp8 = torch-fp8 time / this row's time, for non-baseline rows: like for like
    (graph vs graph; eager vs eager where either row has no graph time)."""
    base = {(r["preset"], r["tokens_per_rank"]): r for r in rows if r["backend"] == "torch-fp8"}
    for r in rows:
        b = base.get((r["preset"], r["tokens_per_rank"]))
        if r["backend"] == "torch-fp8" or b is None:
            continue
        key = "time_us" if r.get("timing", "graph") == b.get("timing", "graph") else "eager_us"
        if b.get(key) and r.get(key):
            r["speedup_vs_torch_fp8"] = b[key] / r[key]
