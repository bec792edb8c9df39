"""Shared benchmark plumbing: ceilings measured in the same run, CUDA-event timing, result files."""
from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str:
    if os.environ.get("MEGAMOE_COMMIT"):
        return os.environ["MEGAMOE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=RESULTS.parent,
                                       stderr=subprocess.DEVNULL, text=True).strip()
    except Exception:
        return "unknown"


def _hold_stream(ms: float) -> None:
    """Parks the current stream on a GPU sleep of ~ms so the host enqueues what follows ahead of
    the GPU (time_cuda_sequence: per-call times of a back-to-back sequence, host cost excluded)."""
    clk = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) or 1_980_000  # kHz
    torch.cuda._sleep(int(ms * clk))


def time_cuda_graph(fn, *, warmup=3, reps=20, batch=4) -> float | None:
    """Median seconds per fn() call with `batch` calls captured in one CUDA graph and the graph
    replayed between two events: GPU time with no host work in between and no idle GPU (what a
    serving loop that replays graphs sees). None if fn cannot be captured (e.g. it syncs)."""
    try:
        fn()  # first call outside the capture (one-time setup such as function attributes)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(batch):
                fn()
    except Exception:
        torch.cuda.synchronize()
        return None
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / batch)
    del g
    times.sort()
    return times[len(times) // 2]


def time_best(fn, **kw) -> tuple[float, float]:
    """(best, host_inclusive): the faster of CUDA-graph replay (time_cuda_graph; skipped if fn cannot
    be captured) and host-inclusive back-to-back calls (time_cuda), and the latter. One rule for our kernels, the torch baselines and
    the ceilings: a graph's memcpy node runs on a copy engine (~2.7 TB/s on H200 vs ~4.2 for the
    stream copy), and graph replay measured slower than stream launches for some cases, so neither
    method alone is fair to every callable."""
    th = time_cuda(fn, **kw)
    tg = time_cuda_graph(fn, **kw)
    return (th if tg is None else min(tg, th)), th


def time_cuda(fn, *, warmup=5, reps=30, batch=4, setup=None) -> float:
    """Median seconds per fn() call, from CUDA events around `batch` back-to-back calls, over `reps`
    batches after `warmup` calls: host-inclusive (the host's launch of the first call of a batch is
    inside the time; batch > 1 overlaps the others'). `setup(i)` (untimed, synchronised; forces
    batch=1) may rotate inputs."""
    if setup is not None:
        batch = 1
    for i in range(warmup):
        if setup:
            setup(i)
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        if setup:
            setup(i)
            torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / batch)
    times.sort()
    return times[len(times) // 2]


def measure_hbm_copy(nbytes=4 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    t, _ = time_best(lambda: dst.copy_(src), warmup=3, reps=10)
    return 2 * src.numel() / t


def measure_fp8_peak(n=8192) -> float:
    """torch._scaled_mm FP8 dense GEMM n^3 FLOP/s on random data."""
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    t, _ = time_best(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), warmup=5, reps=20)
    return 2 * n ** 3 / t


def measure_bf16_peak(n=8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t, _ = time_best(lambda: a @ b, warmup=5, reps=20)
    return 2 * n ** 3 / t


def header(extra: dict | None = None) -> dict:
    p = torch.cuda.get_device_properties(0)
    h = {"gpu": p.name, "sms": p.multi_processor_count, "gpus": torch.cuda.device_count(),
         "commit": commit(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
         "torch": torch.__version__}
    h.update(extra or {})
    return h


def write_results(name: str, head: dict, rows: list[dict], columns: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = head["date"][:10]
    base = RESULTS / f"{name}-{stamp}-{head['commit']}"
    base.with_suffix(".json").write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    lines = [f"# {name} — {head['gpu']} x{head['gpus']}, commit {head['commit']}, {head['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in head.items() if k not in ("gpu", "commit", "date")]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return base


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _warm_sequence(fns, warmup):
    for r in range(warmup):
        for f in fns:
            f(r)
    torch.cuda.synchronize()


def time_cuda_sequence_total(fns, *, warmup=3, reps=20, hold_ms=5.0, skip=0) -> list[float]:
    """Seconds of a back-to-back sequence per rep with events only after its first `skip` calls and after
    the last one (time_cuda_sequence's event after every call costs ~3 us of GPU time per call on an
    H200: bench/launch_gap_probe.py, 4.6 vs 1.6 us between two kernels). Multi-rank calls: skip the first
    call(s), which absorb the ranks' start skew."""
    _warm_sequence(fns, warmup)
    out = []
    for r in range(reps):
        _hold_stream(hold_ms)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if not skip:
            a.record()
        for i, f in enumerate(fns):
            f(r)
            if i + 1 == skip:
                a.record()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return out


def kernel_times_sequence(fns, patterns, *, warmup=3, reps=10, hold_ms=5.0) -> dict[str, list[float]]:
    """GPU durations (seconds) of the kernels whose names contain each pattern, from the CUDA profiler
    (torch.profiler / CUPTI timestamps) while `fns` run back to back `reps` times: the kernel alone,
    without launch gaps or events (how DeepEP's benchmarks time their kernels, bench_kineto). Kernels
    of coupled ranks include their waits for each other. {pattern: [durations]}; empty lists if the
    profiler recorded nothing."""
    from torch.profiler import ProfilerActivity, profile
    _warm_sequence(fns, warmup)
    out: dict[str, list[float]] = {p: [] for p in patterns}
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            _hold_stream(hold_ms)
            for f in fns:
                f(r)
        torch.cuda.synchronize()
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        for p in patterns:
            if p in ev.name:
                out[p].append(ev.time_range.elapsed_us() * 1e-6)
    return out


def time_cuda_sequence(fns, *, warmup=3, reps=20, hold_ms=5.0) -> list[list[float]]:
    """Seconds of each callable in `fns` when they run BACK TO BACK on the current stream, per rep:
    returns times[rep][i]. Every rep first parks the stream on a `torch.cuda._sleep` of ~hold_ms so
    the host enqueues the whole sequence ahead of the GPU (host launch overhead stays out of the
    numbers; what a CUDA graph would see). fns[i](rep) may rotate inputs; nothing syncs in between."""
    _warm_sequence(fns, warmup)
    out = []
    for r in range(reps):
        _hold_stream(hold_ms)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(fns) + 1)]
        ev[0].record()
        for i, f in enumerate(fns):
            f(r)
            ev[i + 1].record()
        ev[-1].synchronize()
        out.append([ev[i].elapsed_time(ev[i + 1]) * 1e-3 for i in range(len(fns))])
    return out
