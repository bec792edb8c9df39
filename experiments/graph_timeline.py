"""Where a few-token layer call's time goes as a serving loop sees it: the kernels of ONE CUDA-graph replay
(torch.profiler over replays of a captured call), each kernel's start offset from the replay's first kernel,
its duration and the gap before it; per backend, preset and token count (1 rank).
Usage: python experiments/graph_timeline.py [presets] [tokens] [backends]   (default flash,pro 1,16 staged,fused)"""
from __future__ import annotations

import sys
from collections import defaultdict

import torch

sys.path.insert(0, "bench")
from megamoe._costs import PRESETS  # noqa: E402
from megamoe._runs import _build, _inputs  # noqa: E402


def timeline(fn, reps=20):
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    per_replay = start.elapsed_time(end) * 1e3 / reps
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            g.replay()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    n = len(evs) // reps
    rows = defaultdict(lambda: [0.0, 0.0, 0.0])
    names = []
    for r in range(reps):
        chunk = evs[r * n:(r + 1) * n]
        t0 = chunk[0].time_range.start
        prev_end = t0
        for i, e in enumerate(chunk):
            key = (i, e.name[:60])
            if r == 0:
                names.append(key)
            rows[key][0] += (e.time_range.start - t0) / reps
            rows[key][1] += (e.time_range.end - e.time_range.start) / reps
            rows[key][2] += (e.time_range.start - prev_end) / reps
            prev_end = e.time_range.end
    return per_replay, [(k[1], *rows[k]) for k in names]


def main():
    presets = (sys.argv[1] if len(sys.argv) > 1 else "flash,pro").split(",")
    tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1,16").split(",")]
    backends = (sys.argv[3] if len(sys.argv) > 3 else "staged,fused").split(",")
    dev = torch.device("cuda", 0)
    for preset in presets:
        shape = PRESETS[preset]
        for b in backends:
            layer, _, check, close = _build(b, shape, 1, 0, None, max(tokens), 1, dev)
            for T in tokens:
                x, idx, w = _inputs(T, 1, 0, shape, 1, dev)[0]
                per, rows = timeline(lambda: layer(x, idx, w))
                check()
                print(f"== {preset} {b} T {T}: graph replay {per:.1f} us (events); kernels:")
                for name, st, du, gap in rows:
                    print(f"   start {st:7.1f}  dur {du:7.1f}  gap {gap:5.1f}  {name}")
            close()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
