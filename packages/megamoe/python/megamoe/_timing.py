"""CUDA timing and the ceilings measured in the same run (DESIGN.md section 6).

One implementation for the benchmark CLI (megamoe.bench) and the scripts under bench/ (bench/common.py
re-exports these). Every function here needs a CUDA GPU; importing the module does not.
"""
from __future__ import annotations

import torch

__all__ = ["time_cuda_graph", "time_best", "time_cuda", "measure_hbm_copy", "measure_fp8_peak",
           "measure_bf16_peak", "time_cuda_sequence_total", "kernel_times_sequence", "time_cuda_sequence"]


def _hold_stream(ms: float) -> None:
    """Parks the current stream on a GPU sleep of ~ms so the host enqueues what follows ahead of
    the GPU (time_cuda_sequence: per-call times of a back-to-back sequence, host cost excluded)."""
    clk = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "clock_rate", 0) or 1_980_000  # kHz
    torch.cuda._sleep(int(ms * clk))


def _calls(fn) -> list:
    """fn: one callable, or a list of callables that rotate among input sets (call i runs fns[i % n])."""
    return list(fn) if isinstance(fn, (list, tuple)) else [fn]


def time_cuda_graph(fn, *, warmup=3, reps=20, batch=4) -> float | None:
    """Median seconds per fn() call with `batch` calls captured in one CUDA graph and the graph
    replayed between two events: GPU time with no host work in between and no idle GPU (what a
    serving loop that replays graphs sees). `fn` may be a list of callables (one per input set):
    the graph then holds calls fns[0], fns[1], ... in turn. None if fn cannot be captured (e.g. it
    syncs)."""
    fns = _calls(fn)
    g = None
    try:
        for f in fns:
            f()  # first call outside the capture (one-time setup such as function attributes)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(max(batch, len(fns))):
                fns[i % len(fns)]()
        batch = max(batch, len(fns))
    except Exception:
        try:
            torch.cuda.synchronize()
        except Exception:  # pragma: no cover - a broken capture may leave an error behind
            pass
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
    inside the time; batch > 1 overlaps the others'). `fn` may be a list of callables (input sets,
    called in turn). `setup(i)` (untimed, synchronised; forces batch=1) may rotate inputs."""
    fns = _calls(fn)
    if setup is not None:
        batch = 1
    n = 0
    for i in range(warmup):
        if setup:
            setup(i)
        fns[n % len(fns)]()
        n += 1
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        if setup:
            setup(i)
            torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(batch):
            fns[n % len(fns)]()
            n += 1
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


def measure_peer_copy(nbytes=1 << 28, reps=10) -> float:
    """Peer copy bandwidth between GPUs 0 and 1 in bytes/s, one direction (the slower of 0 -> 1 and 1 -> 0;
    device-to-device copies over NVLink, wall clock around `reps` copies with both devices synchronised)."""
    import time
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0").random_()
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1").random_()
    rates = []
    for src, dst in ((a, b), (b, a)):
        for _ in range(2):
            dst.copy_(src)
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        t0 = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        rates.append(reps * nbytes / (time.perf_counter() - t0))
    return min(rates)


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


def _warm_sequence(fns, warmup):
    for r in range(warmup):
        for f in fns:
            f(r)
    torch.cuda.synchronize()


def time_cuda_sequence_total(fns, *, warmup=3, reps=20, hold_ms=5.0, skip=0) -> list[float]:
    """Seconds of a back-to-back sequence per rep with events only after its first `skip` calls and after
    the last one (time_cuda_sequence's event after every call costs ~3 us of GPU time per call on an
    H200: experiments/launch_gap_probe.py, 4.6 vs 1.6 us between two kernels). Multi-rank calls: skip the first
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
