"""megamoe benchmark CLI: time the MoE layer per tokens-per-rank setting against its floor.

    megamoe-bench                                   # GPU + built kernels: the staged layer, flash and pro
    megamoe-bench --backend staged,torch-fp8,torch-bf16 --preset flash,pro --ranks 1
    megamoe-bench --preset tiny --tokens 1,16,128 --ranks 2     # no GPU: the reference on 2 CPU ranks

Each setting reports time, TFLOPS, HBM and NVLink bytes and the FLOOR = max(FLOPs / FP8 peak,
HBM bytes / HBM bandwidth, NVLink bytes / peer bandwidth) with the term that binds (DESIGN.md
section 6). On a GPU the time is CUDA-graph replay of whole layer calls (and, beside it, eager
host-inclusive calls), the FP8 peak and HBM copy bandwidth are measured in the same run, the torch
baselines (torch-fp8: torch._scaled_grouped_mm, torch-bf16: torch._grouped_mm; megamoe.baselines)
run beside the layer, and JSON, markdown and a plot go to bench/results/. On CPU the floors are
H200 ceilings, not this machine's, so floor columns read "n/a (no GPU)". The metric functions
(count_flops, hbm_bytes, nvlink_bytes, floor_time, rank_costs) are the ones the GPU benchmarks import.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict

try:
    import torch
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch is a required dependency; say so instead of a traceback
    raise SystemExit("megamoe-bench needs PyTorch: pip install torch (any build >= 2.4; a CPU build runs "
                     "the reference, a CUDA build the GPU layer)") from None
from tqdm import tqdm

from ._report import (CPU_COLUMNS, GPU_COLUMNS, format_table, plot_results, results_name,  # noqa: F401
                      run_header, write_markdown, write_results)
from ._costs import (BACKENDS, BF16_BYTES, DEFAULT_PEAKS, FP32_BYTES, MATMULS, MX_GROUP, PRESETS, SLICED_BACKENDS,  # noqa: F401
                     TARGET_FACTOR, TARGET_SLACK_US, TARGET_TOKENS, TORCH_BASELINES, WEIGHT_BITS, RankCost, Shape,
                     _rank_tokens, count_flops, floor_time, hbm_bytes, make_routing, nvlink_bytes, rank_costs)
from ._runs import (GPU_DEVICE_TYPE, GRAPH_BATCH, INPUT_SETS, _build, _gpu_rank, _inputs, _sync,  # noqa: F401
                    _log, _parse_peaks, activation_bytes, add_speedups, make_row, weight_bytes)
from .reference import make_weights, moe_reference_distributed, run_local_ranks

__all__ = ["PRESETS", "DEFAULT_PEAKS", "Shape", "RankCost", "count_flops", "hbm_bytes",
           "nvlink_bytes", "floor_time", "rank_costs", "make_routing", "main"]

# --- backends -------------------------------------------------------------------------------------

LAYER_BACKENDS = ("staged", "fused", "auto")  # megamoe.MegaMoE(backend=...)
GPU_TOKENS, CPU_TOKENS = (1, 16, 128, 512, 2048, 8192), (1, 16, 128)
NO_GPU = "n/a (no GPU)"


def kernels_available() -> bool:
    try:
        from fp4_gemm._lib import LIB
        return LIB.available()
    except Exception:
        return False


def fused_available() -> bool:
    try:
        from ._lib import LIB
        return LIB.available()
    except Exception:
        return False


def layer_available() -> bool:
    try:
        from . import MegaMoE, ExpertWeights  # noqa: F401
        return True
    except Exception:  # ImportError, or whatever the layer's import raised: then it is not usable here
        return False


def default_backend(cuda: bool) -> tuple[str, str]:
    """(backend, why): staged where a CUDA GPU, the built kernels and the layer are all here."""
    if not cuda:
        return "reference", "no CUDA GPU: the reference layer runs on CPU ranks"
    if not kernels_available():
        return "reference", ("CUDA GPU found but the kernels are not built or not found "
                             "(fp4_gemm._lib.LIB.available() is False): the reference layer runs instead")
    if not layer_available():
        return "reference", "CUDA GPU and kernels found but megamoe.MegaMoE is not in this checkout: the reference runs"
    return "staged", "CUDA GPU with the built kernels: the staged layer runs on the GPU"


def check_backends(backends: list[str], cuda: bool) -> dict[str, str]:
    """ValueError with a clear reason for a backend that cannot run here. The staged layer missing
    its kernels or its module while torch baselines were asked for too is not an error: returns
    {backend: why it is left out} so the baselines still run (and the output says so)."""
    left_out = {}
    for b in backends:
        if b not in BACKENDS:
            raise ValueError(f"--backend: unknown backend {b!r} (choose from {', '.join(BACKENDS)})")
        if b in LAYER_BACKENDS:
            if not cuda:
                raise ValueError(f"--backend {b} needs a CUDA GPU")
            if not kernels_available():
                left_out[b] = ("the CUDA kernels are not built or not found (set MEGAMOE_LIB_DIR=<build>/lib or "
                               "pip install . with nvcc)")
            elif not layer_available():
                left_out[b] = "megamoe.MegaMoE is not in this checkout"
            elif b != "staged" and not fused_available():
                left_out[b] = "libmegamoe.so (the fused kernel) is not built or not found"
        if b in TORCH_BASELINES and not cuda:
            raise ValueError(f"--backend {b} needs a CUDA GPU (torch grouped GEMMs)")
    if "reference" in backends and len(backends) > 1:
        raise ValueError("--backend reference runs alone (wall-clock timing of the FP64 reference)")
    if left_out and not [b for b in backends if b not in left_out]:
        raise ValueError("; ".join(f"--backend {b}: {why}" for b, why in left_out.items()))
    return left_out


# --- reference timing (CPU or GPU ranks, wall clock) ----------------------------------------------

def _bench_rank(rank: int, world: int, cfg: dict) -> list[float]:
    """Reference backend: median wall time per tokens setting; a barrier before and after each call
    makes rank 0's clock cover the slowest rank."""
    shape = Shape(**cfg["shape"])
    device = torch.device("cuda", rank) if cfg["device_type"] == "cuda" else torch.device("cpu")
    per_rank = shape.E // world
    weights = make_weights(shape.E, shape.H, shape.I, seed=cfg["seed"], device=device,
                           experts=range(rank * per_rank, (rank + 1) * per_rank))
    calls = cfg["warmup"] + cfg["reps"]
    medians = []
    with tqdm(total=len(cfg["tokens"]) * calls, desc="megamoe-bench", disable=rank != 0,
              file=sys.stderr, leave=False) as bar:
        for T in cfg["tokens"]:
            idx, w = make_routing(world * T, shape, cfg["seed"] + T)
            rows = slice(rank * T, (rank + 1) * T)
            x = _rank_tokens(T, shape.H, cfg["seed"] + T, rank).to(device)
            idx, w = idx[rows].to(device), w[rows].to(device)
            times = []
            for _ in range(calls):
                _sync(device)
                dist.barrier()
                t0 = time.perf_counter()
                moe_reference_distributed(x, idx, w, weights)
                _sync(device)
                dist.barrier()
                times.append(time.perf_counter() - t0)
                bar.update()
            medians.append(statistics.median(times[cfg["warmup"]:]))
    return medians




# --- CLI ------------------------------------------------------------------------------------------

def _check_memory(shape: Shape, ranks: int, device_type: str) -> None:
    """The reference keeps every expert's FP64 dequantised weights: refuse what cannot fit."""
    per_rank = shape.E // ranks * MATMULS * shape.H * shape.I * torch.float64.itemsize
    if device_type == "cuda":
        have, need, where = torch.cuda.get_device_properties(0).total_memory, per_rank, "per GPU"
    else:
        have, need, where = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), per_rank * ranks, "in RAM"
    if need > 0.8 * have:  # leave room for activations and the process itself
        raise SystemExit(f"megamoe-bench: the reference needs {need / 2**30:.1f} GiB of FP64 weights {where}, "
                         f"{have / 2**30:.1f} GiB available; use a smaller preset or more ranks/GPUs")


def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return parse


def _list(text: str, what: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{what}: empty list")
    return list(dict.fromkeys(items))


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def time_sliced_error(backends: list[str], ranks: int, gpus: int) -> str | None:
    """With fewer GPUs than ranks only the symm_comm layers run (time-sliced, CUDA IPC): why not, or None."""
    other = [b for b in backends if b not in SLICED_BACKENDS]
    if ranks <= gpus or not other:
        return None
    return (f"--ranks {ranks}: only {_gpus(gpus)}; with fewer GPUs than ranks only "
            f"{', '.join(SLICED_BACKENDS)} run (ranks time-sliced on the GPUs through CUDA IPC, as the tests do); "
            f"{', '.join(other)} need one GPU per rank")


def build_parser(cuda: bool, gpus: int) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="megamoe-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None,
                   help=f"comma list of {', '.join(PRESETS)} (default: flash,pro with the staged layer, else tiny)")
    p.add_argument("--tokens", default=None, help="tokens per rank, comma-separated (default: "
                   f"{','.join(map(str, GPU_TOKENS))} on a GPU, {','.join(map(str, CPU_TOKENS))} on CPU)")
    p.add_argument("--ranks", type=_int_at_least(1), default=gpus if cuda else 2,
                   help="EP ranks (default: the number of GPUs, else 2 CPU processes)")
    p.add_argument("--backend", default=None,
                   help=f"comma list of {', '.join(BACKENDS)} (default: staged on a machine with a CUDA GPU "
                        "and the built kernels, else reference)")
    p.add_argument("--reps", type=_int_at_least(1), default=None,
                   help="timed repetitions per setting, median reported (default 5 reference, 10 GPU)")
    p.add_argument("--warmup", type=_int_at_least(0), default=None, help="warm-up calls (default 1 reference, 3 GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit", help="commit to record in the results (default: git's; for a copy without .git)")
    p.add_argument("--no-graph", action="store_true", help="GPU: eager timing only (no CUDA-graph capture)")
    p.add_argument("--peaks", help="ceilings to use instead of measuring them, e.g. fp8_tflops=1290,hbm_tbs=4.1,"
                                   f"nvlink_gbs=370 (defaults {DEFAULT_PEAKS})")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--results", metavar="DIR", help="write moe-<presets>-<ranks>r-<date>-<commit>.{json,md,png} "
                   "here (default on a GPU: bench/results if ./bench exists, else ./megamoe-results)")
    return p


def main(argv=None) -> None:
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    p = build_parser(cuda, gpus)
    args = p.parse_args(argv)
    try:
        if args.backend is None:
            backend, why = default_backend(cuda)
            backends = [backend]
        else:
            backends = _list(args.backend, "--backend")
            why = "chosen with --backend"
        left_out = check_backends(backends, cuda)
        backends = [b for b in backends if b not in left_out]
        gpu_mode = backends != ["reference"]
        presets = _list(args.preset, "--preset") if args.preset else (["flash", "pro"] if gpu_mode else ["tiny"])
        for name in presets:
            if name not in PRESETS:
                raise ValueError(f"--preset: unknown preset {name!r} (choose from {', '.join(PRESETS)})")
        tokens = [int(t) for t in _list(args.tokens, "--tokens")] if args.tokens else \
            list(GPU_TOKENS if gpu_mode else CPU_TOKENS)
        if min(tokens) < 1:
            raise ValueError(f"--tokens: every entry must be >= 1, got {args.tokens}")
        peaks, given = _parse_peaks(args.peaks)
    except ValueError as e:
        p.error(str(e))
    for name in presets:
        if PRESETS[name].E % args.ranks:
            p.error(f"--ranks {args.ranks} must divide preset {name}'s {PRESETS[name].E} experts")
    time_sliced = cuda and args.ranks > gpus  # the reference too: refused (time_sliced_error), as before
    if time_sliced and (why_not := time_sliced_error(backends, args.ranks, gpus)):
        p.error(why_not)
    reps = args.reps or (10 if gpu_mode else 5)
    warmup = args.warmup if args.warmup is not None else (3 if gpu_mode else 1)
    head = run_header(cuda, args.commit)
    if time_sliced:
        head["time_sliced"] = (f"{args.ranks} ranks on {_gpus(gpus)} (rank r on GPU r % {gpus}, "
                               "gloo + CUDA IPC): a correctness-and-overhead run, NOT a speed measurement")
    print(f"megamoe-bench: backend {','.join(backends)} ({why}); presets {','.join(presets)}; {args.ranks} ranks "
          f"({'gloo + CUDA IPC, time-sliced on ' + _gpus(gpus) if time_sliced else 'nccl, cuda' if cuda else 'gloo, cpu'})")
    for b, reason in left_out.items():
        print(f"megamoe-bench: WARNING: backend {b} left out: {reason}")
        print(f"megamoe-bench: WARNING: backend {b} left out: {reason}", file=sys.stderr)
    head["left_out"] = {b: reason for b, reason in left_out.items()}
    if gpu_mode:
        rows, notes = _main_gpu(args, backends, presets, tokens, reps, warmup, peaks, given, head)
    else:
        rows, notes = _main_reference(args, presets, tokens, reps, warmup, peaks, given, cuda, head)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": head, "presets": {n: asdict(PRESETS[n]) for n in presets}, "ranks": args.ranks,
                       "backends": backends, "backend_reason": why,
                       "peaks": head.get("peaks") or (peaks if (cuda or given) else None),
                       "reps": reps, "warmup": warmup, "seed": args.seed, "notes": notes, "rows": rows}, f, indent=2)


def _main_reference(args, presets, tokens, reps, warmup, peaks, given, cuda, head):
    """The reference layer over CPU (gloo) or GPU (NCCL) ranks, wall clock."""
    device_type = "cuda" if cuda else "cpu"
    rows, notes = [], []
    for name in presets:
        shape = PRESETS[name]
        _check_memory(shape, args.ranks, device_type)
        cfg = dict(shape=asdict(shape), tokens=tokens, seed=args.seed, reps=reps, warmup=warmup,
                   device_type=device_type)
        medians = run_local_ranks(_bench_rank, args.ranks, cfg, device_type=device_type)[0]
        use_peaks = peaks if cuda or given else None
        mine = [make_row(name, "reference", T, args.ranks, shape, args.seed, use_peaks, s) for T, s in zip(tokens, medians)]
        rows += mine
        print(f"preset {name} (H {shape.H}, I {shape.I}, E {shape.E}, top-{shape.K}), backend reference")
        print(f"time: wall clock, median of {reps} calls after {warmup} warm-up, barrier before and after each; "
              "HBM and NVLink: the busiest rank")
        if use_peaks is None:
            notes.append(f"floor, time/floor: {NO_GPU}: the floors use H200 ceilings (DESIGN.md section 6), "
                         "not this machine's; pass --peaks to compute them anyway")
            print(notes[-1])
            cols = CPU_COLUMNS
        else:
            notes.append(f"peaks: {peaks}" + ("" if set(given) == set(DEFAULT_PEAKS) else
                                              f"; DEFAULTS (DESIGN.md section 6), not measured in this run: "
                                              f"{', '.join(k for k in DEFAULT_PEAKS if k not in given)}"))
            print(notes[-1])
            cols = CPU_COLUMNS + (("floor us", "floor_us", "{:.2f}"), ("bound", "bound", "{}"),
                                  ("time/floor", "time_over_floor", "{:.1f}"))
        print(format_table(mine, cols, markdown=False))
    if args.results:
        for path in write_results(args.results, results_name(presets, args.ranks, head), head, rows, notes):
            print(f"wrote {path}")
    return rows, notes


def _main_gpu(args, backends, presets, tokens, reps, warmup, peaks, given, head):
    from ._timing import measure_fp8_peak, measure_hbm_copy, measure_peer_copy
    notes = []
    measured = {}
    ceilings = [("fp8_tflops", measure_fp8_peak, 1e12), ("hbm_tbs", measure_hbm_copy, 1e12)]
    if args.ranks > 1 and torch.cuda.device_count() >= 2:  # ranks on 2+ GPUs: the NVLink floor's ceiling (one pair)
        ceilings.append(("nvlink_gbs", measure_peer_copy, 1e9))
    for key, measure, scale in ceilings:
        if key not in given:
            try:
                measured[key] = measure() / scale
            except Exception as e:  # a ceiling that cannot be measured falls back to its default, and says so
                notes.append(f"could not measure {key} ({type(e).__name__}: {str(e)[:160]}): default used")
    torch.cuda.empty_cache()
    peaks = {**peaks, **measured}
    head.update(peaks=peaks, peaks_measured=sorted(measured), peaks_given=sorted(given),
                peaks_defaulted=sorted(k for k in DEFAULT_PEAKS if k not in measured and k not in given))
    notes.append(f"peaks: FP8 {peaks['fp8_tflops']:.0f} TFLOPS (torch._scaled_mm 8192^3), HBM {peaks['hbm_tbs']:.2f} "
                 f"TB/s (device copy), NVLink {peaks['nvlink_gbs']:.0f} GB/s (peer copy GPU 0 <-> 1 where measured); measured in this run: "
                 f"{', '.join(sorted(measured)) or 'none'}; given: {', '.join(sorted(given)) or 'none'}; "
                 f"defaults (DESIGN.md section 6): {', '.join(head['peaks_defaulted']) or 'none'}")
    notes.append(f"time: CUDA-graph replay of {GRAPH_BATCH} layer calls rotating {INPUT_SETS} input sets, between "
                 f"CUDA events, median of {reps} replays after {warmup} warm-up; eager: CUDA events around "
                 f"{GRAPH_BATCH} back-to-back eager calls (host-inclusive), median of {reps}; max over ranks")
    notes.append("floor = max(FLOPs / FP8 peak, HBM bytes of the MXFP4 layer / HBM copy bw, NVLink bytes / peer bw): "
                 "the same floor for every backend (the torch baselines move 2x (FP8) or 4x (BF16) the weight bytes)")
    notes.append(f"target (issue, {'-'.join(map(str, TARGET_TOKENS))} tokens): time <= {TARGET_FACTOR} x HBM floor + "
                 f"{TARGET_SLACK_US:.0f} us")
    if head.get("time_sliced"):
        notes.append(f"time-sliced: {head['time_sliced']}; the ranks' kernels wait for each other's time slices, "
                     "so times measure the protocol's overhead under time-slicing, not NVLink or the layer's speed")
    for n in notes:
        print(n)
    cfg = dict(presets=presets, shapes={n: asdict(PRESETS[n]) for n in presets}, backends=backends, tokens=tokens,
               seed=args.seed, reps=reps, warmup=warmup, no_graph=args.no_graph, device_type=GPU_DEVICE_TYPE)
    out_dir = args.results or ("bench/results" if os.path.isdir("bench") else "megamoe-results")
    name = results_name(presets, args.ranks, head)

    def rows_of(per_rank):
        rows = sort_rows(merge_ranks(per_rank, args.ranks, args.seed, peaks), backends, presets)
        add_speedups(rows)
        return rows

    def partial(cases):
        try:
            write_results(out_dir, name, head, rows_of([cases]), notes + ["PARTIAL: the run did not finish"], plot=False)
        except Exception as e:  # never lose the run to a results file
            _log(0, f"could not write partial results: {type(e).__name__}: {e}")

    if args.ranks == 1:  # in this process: partial results are on disk after every (backend, preset)
        per_rank = [_gpu_rank(0, 1, cfg, progress=partial)]
    else:
        per_rank = run_local_ranks(_gpu_rank, args.ranks, cfg, device_type="cuda")
    rows = rows_of(per_rank)
    print(format_table(rows))
    for path in write_results(out_dir, name, head, rows, notes):
        print(f"wrote {path}")
    return rows, notes


def sort_rows(rows: list[dict], backends: list[str], presets: list[str]) -> list[dict]:
    """Rows by preset, tokens, then backend in the order given."""
    return sorted(rows, key=lambda r: (presets.index(r["preset"]), r["tokens_per_rank"], backends.index(r["backend"])))


def merge_ranks(per_rank: list[list[dict]], ranks: int, seed: int, peaks: dict) -> list[dict]:
    """Rank results -> rows: the slowest rank's times (a None anywhere -> None), notes joined."""
    rows = []
    for cases in zip(*per_rank):
        c0 = cases[0]
        def worst(key):
            vals = [c[key] for c in cases]
            return None if any(v is None for v in vals) else max(vals)
        graph, eager = worst("graph_s"), worst("eager_s")
        gemm = None if any(c.get("gemm_s") is None for c in cases) else max(c["gemm_s"] for c in cases)
        note = "; ".join(dict.fromkeys(c["note"] for c in cases if c["note"]))
        shape = PRESETS[c0["preset"]]
        row = make_row(c0["preset"], c0["backend"], c0["T"], ranks, shape, seed, peaks,
                       graph if graph is not None else eager, eager, note)
        row["timing"] = "graph" if graph is not None else ("eager" if eager is not None else "none")
        row["gemms_us"] = None if gemm is None else gemm * 1e6
        # the layer's TFLOPS over its two expert GEMMs' TFLOPS alone (same pool, same run): gemms / layer time
        row["vs_gemms"] = None if gemm is None or not row["time_us"] else gemm * 1e6 / row["time_us"]
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
