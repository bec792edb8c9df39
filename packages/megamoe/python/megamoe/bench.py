"""megamoe benchmark CLI: time one MoE layer per tokens-per-rank setting against its floor.

    python -m megamoe.bench --preset tiny --tokens 1,16,128 --ranks 2

Each setting reports time, TFLOPS, HBM and NVLink bytes and the FLOOR = max(FLOPs / FP8 peak,
HBM bytes / HBM bandwidth, NVLink bytes / peer bandwidth) with the term that binds (DESIGN.md
section 6). The metric functions (count_flops, hbm_bytes, nvlink_bytes, floor_time, rank_costs)
are the ones the GPU benchmarks import.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from .reference import X_GRAN, make_weights, moe_reference_distributed, run_local_ranks

__all__ = ["PRESETS", "DEFAULT_PEAKS", "Shape", "RankCost", "count_flops", "hbm_bytes",
           "nvlink_bytes", "floor_time", "rank_costs", "make_routing", "main"]


@dataclass(frozen=True)
class Shape:
    H: int
    I: int
    E: int
    K: int


PRESETS = {
    "tiny": Shape(H=512, I=256, E=16, K=4),  # seconds on CPU
    "flash": Shape(H=4096, I=2048, E=256, K=6),
    "pro": Shape(H=7168, I=3072, E=384, K=6),
}

# H200 ceilings measured for DESIGN.md section 6 (not by this program): pass --peaks to use
# numbers measured in the same run.
DEFAULT_PEAKS = {"fp8_tflops": 1350.0, "hbm_tbs": 4.2, "nvlink_gbs": 380.0}

MX_GROUP = 32                        # weights per int8 shift
WEIGHT_BITS = 4 + 8 / MX_GROUP       # E2M1 code + its share of the shift byte (row scales ~0)
BF16_BYTES, FP32_BYTES = 2, 4
MATMULS = 3                          # gate, up (2I rows of W1 = two H x I matmuls) and down
BACKENDS = ("reference", "staged", "fused")


# --- metrics --------------------------------------------------------------------------------------

def count_flops(pairs: int, H: int, I: int) -> int:
    """Multiply-adds x 2 of the expert MLPs over routed (token, expert) pairs."""
    return MATMULS * 2 * pairs * H * I


def hbm_bytes(touched_experts: int, tokens: int, H: int, I: int) -> float:
    """Bytes one rank must move through HBM at least: its touched experts' MXFP4 weights (each read
    once) plus the layer's BF16 input and output rows. The dispatch pool and L1/L2 intermediates are
    left out (they may stay on chip), so this is a lower bound."""
    return touched_experts * MATMULS * H * I * WEIGHT_BITS / 8 + tokens * H * 2 * BF16_BYTES


def nvlink_bytes(dispatched: int, combined: int, H: int) -> int:
    """Bytes over NVLink in one direction: dispatched pairs carry an FP8 row, its FP32 scales and the
    FP32 top-k weight; combined pairs carry a BF16 output row."""
    return dispatched * (H + H // X_GRAN * FP32_BYTES + FP32_BYTES) + combined * H * BF16_BYTES


def floor_time(flops: float, hbm: float, nvlink: float, peaks: dict) -> tuple[float, str]:
    """(seconds, binding term) = max(FLOPs / FP8 peak, HBM bytes / HBM bw, NVLink bytes / peer bw)."""
    terms = {"fp8": flops / (peaks["fp8_tflops"] * 1e12),
             "hbm": hbm / (peaks["hbm_tbs"] * 1e12),
             "nvlink": nvlink / (peaks["nvlink_gbs"] * 1e9)}
    bound = max(terms, key=terms.get)
    return terms[bound], bound


@dataclass
class RankCost:
    pairs: int      # pairs whose expert this rank owns (its GEMM work)
    flops: int
    hbm: float
    nvlink: int     # max of bytes sent and received (links are per direction)


def rank_costs(topk_idx: torch.Tensor, ranks: int, shape: Shape) -> list[RankCost]:
    """Per-rank work for global routing topk_idx [ranks * T, K] (rank r holds tokens [rT, (r+1)T)
    and experts [r E/R, (r+1) E/R))."""
    T = topk_idx.shape[0] // ranks
    valid = topk_idx >= 0
    src = (torch.arange(topk_idx.shape[0]) // T).unsqueeze(1).expand_as(topk_idx)[valid]
    expert = topk_idx[valid]
    dst = expert // (shape.E // ranks)
    costs = []
    for r in range(ranks):
        mine, local = dst == r, src == r
        pairs = int(mine.sum())
        sent = nvlink_bytes(int((local & ~mine).sum()), int((mine & ~local).sum()), shape.H)
        received = nvlink_bytes(int((mine & ~local).sum()), int((local & ~mine).sum()), shape.H)
        costs.append(RankCost(pairs, count_flops(pairs, shape.H, shape.I),
                              hbm_bytes(len(torch.unique(expert[mine])), T, shape.H, shape.I),
                              max(sent, received)))
    return costs


# --- inputs ---------------------------------------------------------------------------------------

def make_routing(tokens: int, shape: Shape, seed: int):
    """Global top-k over `tokens` tokens: K distinct uniform experts per token, softmax weights."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.rand(tokens, shape.E, generator=gen).topk(shape.K, dim=1).indices
    w = torch.randn(tokens, shape.K, generator=gen).softmax(dim=1)
    return idx, w


def _rank_tokens(tokens: int, H: int, seed: int, rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)  # distinct stream per rank
    return torch.randn(tokens, H, generator=gen).bfloat16()


# --- timing (runs inside each rank) ---------------------------------------------------------------

def _layer(backend: str):
    if backend != "reference":
        raise NotImplementedError(f"backend '{backend}' is not built yet (available: reference)")
    return moe_reference_distributed


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _bench_rank(rank: int, world: int, cfg: dict) -> list[float]:
    """Median wall time per tokens setting; a barrier before and after each call makes rank 0's
    clock cover the slowest rank."""
    shape = Shape(**cfg["shape"])
    device = torch.device("cuda", rank) if cfg["device_type"] == "cuda" else torch.device("cpu")
    per_rank = shape.E // world
    weights = make_weights(shape.E, shape.H, shape.I, seed=cfg["seed"], device=device,
                           experts=range(rank * per_rank, (rank + 1) * per_rank))
    layer = _layer(cfg["backend"])
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
                layer(x, idx, w, weights)
                _sync(device)
                dist.barrier()
                times.append(time.perf_counter() - t0)
                bar.update()
            medians.append(statistics.median(times[cfg["warmup"]:]))
    return medians


# --- CLI ------------------------------------------------------------------------------------------

def _parse_peaks(text: str | None) -> tuple[dict, list]:
    """'fp8_tflops=1290,hbm_tbs=4.1' -> (peaks, names of the peaks left at their defaults)."""
    peaks = dict(DEFAULT_PEAKS)
    given = {}
    for item in filter(None, (text or "").split(",")):
        key, _, value = item.partition("=")
        if key not in DEFAULT_PEAKS or not value:
            raise ValueError(f"--peaks: expected KEY=VALUE with KEY in {sorted(DEFAULT_PEAKS)}, got {item!r}")
        given[key] = float(value)
    peaks.update(given)
    return peaks, [k for k in DEFAULT_PEAKS if k not in given]


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


COLUMNS = (  # header, row key, format
    ("tokens/rank", "tokens_per_rank", "{:d}"), ("pairs", "pairs", "{:d}"),
    ("time us", "time_us", "{:.1f}"), ("TFLOPS/rank", "tflops_per_rank", "{:.4f}"),
    ("HBM MB", "hbm_bytes", "{:.3f}"), ("NVLink MB", "nvlink_bytes", "{:.3f}"),
    ("floor us", "floor_us", "{:.2f}"), ("bound", "bound", "{}"), ("time/floor", "time_over_floor", "{:.1f}"),
)
MB_KEYS = ("hbm_bytes", "nvlink_bytes")


def _row(T: int, seconds: float, ranks: int, shape: Shape, seed: int, peaks: dict) -> dict:
    idx, _ = make_routing(ranks * T, shape, seed + T)
    costs = rank_costs(idx, ranks, shape)
    floors = [floor_time(c.flops, c.hbm, c.nvlink, peaks) for c in costs]
    floor, bound = max(floors)
    return {"tokens_per_rank": T, "pairs": sum(c.pairs for c in costs), "time_us": seconds * 1e6,
            "tflops_per_rank": sum(c.flops for c in costs) / ranks / seconds / 1e12,
            "hbm_bytes": max(c.hbm for c in costs), "nvlink_bytes": max(c.nvlink for c in costs),
            "floor_us": floor * 1e6, "bound": bound, "time_over_floor": seconds / floor}


def _print_table(rows: list) -> None:
    cells = [[h for h, _, _ in COLUMNS]]
    for row in rows:
        cells.append([fmt.format(row[key] / 1e6 if key in MB_KEYS else row[key]) for _, key, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))


def main(argv=None) -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(prog="megamoe-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--tokens", default="1,16,128", help="tokens per rank, comma-separated")
    p.add_argument("--ranks", type=int, default=torch.cuda.device_count() if cuda else 2,
                   help="EP ranks (default: the number of GPUs, else 2 CPU processes)")
    p.add_argument("--backend", choices=BACKENDS, default="reference")
    p.add_argument("--reps", type=int, default=5, help="timed calls per setting (median reported)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peaks", help="measured ceilings, e.g. fp8_tflops=1290,hbm_tbs=4.1,nvlink_gbs=370 "
                                   f"(defaults {DEFAULT_PEAKS}, not measured here)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)

    shape = PRESETS[args.preset]
    try:
        tokens = [int(t) for t in args.tokens.split(",")]
        if min(tokens) < 1:
            raise ValueError(f"--tokens: every entry must be >= 1, got {args.tokens}")
        peaks, defaulted = _parse_peaks(args.peaks)
        _layer(args.backend)
    except (ValueError, NotImplementedError) as e:
        p.error(str(e))
    if args.ranks < 1 or shape.E % args.ranks:
        p.error(f"--ranks {args.ranks} must divide the preset's {shape.E} experts")
    if cuda and args.ranks > torch.cuda.device_count():
        p.error(f"--ranks {args.ranks}: only {torch.cuda.device_count()} GPUs")
    device_type = "cuda" if cuda else "cpu"
    _check_memory(shape, args.ranks, device_type)

    cfg = dict(shape=asdict(shape), tokens=tokens, backend=args.backend, seed=args.seed,
               reps=args.reps, warmup=args.warmup, device_type=device_type)
    medians = run_local_ranks(_bench_rank, args.ranks, cfg, device_type=device_type)[0]
    rows = [_row(T, s, args.ranks, shape, args.seed, peaks) for T, s in zip(tokens, medians)]

    print(f"megamoe-bench: preset {args.preset} (H {shape.H}, I {shape.I}, E {shape.E}, top-{shape.K}), "
          f"{args.ranks} ranks ({'nccl, cuda' if cuda else 'gloo, cpu'}), backend {args.backend}")
    print(f"peaks: FP8 {peaks['fp8_tflops']} TFLOPS, HBM {peaks['hbm_tbs']} TB/s, NVLink {peaks['nvlink_gbs']} "
          "GB/s per direction" + (f"; DEFAULTS (DESIGN.md section 6), not measured in this run: "
                                  f"{', '.join(defaulted)}" if defaulted else ""))
    print(f"time: wall clock, median of {args.reps} calls after {args.warmup} warm-up, barrier before and "
          "after each; HBM and NVLink: the busiest rank; floor: the slowest rank's")
    _print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "shape": asdict(shape), "ranks": args.ranks,
                       "backend": args.backend, "device": device_type, "peaks": peaks,
                       "peaks_defaulted": defaulted, "reps": args.reps, "warmup": args.warmup,
                       "seed": args.seed, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
