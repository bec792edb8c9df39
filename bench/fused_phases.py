"""Where the fused kernel's time goes, next to the staged pipeline's kernels (1 rank, one GPU).

Fused: the kernel's phase stamps (csrc/fused.cu kStamps, %globaltimer by thread 0 of every CTA) of one
call after warm-up: dispatch (start -> grid barrier 0 left by the last CTA), L1 (-> barrier 1), L2 (->
barrier 2), combine (-> the last CTA done), plus the launch skew and the spread of the CTAs' own ends.
Staged: device time per kernel (torch.profiler, mean over a few calls). Both layers' whole calls as CUDA-
graph replays (what megamoe-bench reports). Results: bench/results/fused-phases-<date>-<commit>.{json,md}.
Usage: python bench/fused_phases.py [--preset flash,pro] [--tokens 1,16,128,512,2048,8192]"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch

from common import header, time_cuda_graph, write_results

from megamoe._costs import PRESETS
from megamoe._runs import _build, _inputs

def _category(name: str, grouped_seen: int) -> str:
    n = name.lower()
    if "fused_moe" in n:
        return "fused"
    if "grouped_gemm" in n:  # the staged call runs L1 then L2 (both grouped_gemm_kernel)
        return "L1" if grouped_seen % 2 == 0 else "L2"
    for key, cat in (("quantize", "quantise"), ("dispatch", "dispatch"), ("combine", "combine")):
        if key in n:
            return cat
    return "other"


def kernel_times(fn, calls: int = 5) -> dict:
    """Mean device microseconds per call by kernel (torch.profiler, kernels in launch order)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "mem" not in e.name.lower()]
    evs.sort(key=lambda e: e.time_range.start)
    out, grouped = defaultdict(float), 0
    for e in evs:
        cat = _category(e.name, grouped)
        grouped += "grouped_gemm" in e.name.lower()
        out[cat] += (e.time_range.end - e.time_range.start) / calls
    return dict(out)


def phases(layer, call, sms: int) -> dict:
    st = torch.zeros(2 * sms, 9, dtype=torch.int64, device="cuda")
    layer._phase_stamps = st
    try:
        call()
        torch.cuda.synchronize()
    finally:
        layer._phase_stamps = None
    raw = st[st[:, 0] != 0].cpu()
    sm_of = raw[:, 8]
    s = raw[:, :8].double()
    t0 = s[:, 0].min()
    us = (s - t0) / 1e3
    # CTA placement: SMs that host two CTAs that both spent > half the longest L1 production time
    l1p = us[:, 3] - us[:, 2]
    busy = l1p > 0.5 * l1p.max()
    shared_busy = int(sum(1 for m in sm_of[busy].unique().tolist() if int((sm_of[busy] == m).sum()) > 1))
    mx = us.max(dim=0).values
    return {"ctas": int(s.shape[0]), "skew": float(mx[0]),
            "D": float(mx[2]), "D_cta_spread": float(mx[1] - us[:, 1].min()),
            "L1": float(mx[4] - mx[2]), "L1_prod_spread": float(mx[3] - us[:, 3].min()),
            "L2": float(mx[6] - mx[4]), "L2_prod_spread": float(mx[5] - us[:, 5].min()),
            "C": float(mx[7] - mx[6]), "total": float(mx[7]), "busy_ctas": int(busy.sum()),
            "sms_2busy": shared_busy, "sms": int(sm_of.unique().numel())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="flash,pro")
    ap.add_argument("--tokens", default="1,16,128,512,2048,8192")
    ap.add_argument("--no-splitk", action="store_true",
                    help="both layers' GEMMs unsplit (their split-K workspace handed to the kernels as none)")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for preset in args.preset.split(","):
        shape = PRESETS[preset]
        built = {b: _build(b, shape, 1, 0, None, max(tokens), 1, dev) for b in ("fused", "staged")}
        if args.no_splitk:  # the layers pass their workspace to every GEMM: make it pass none
            for layer, *_ in built.values():
                layer._splitk.args_ptrs = lambda: (None, 0, None, 0)
        for T in tokens:
            sets = _inputs(T, 1, 0, shape, 1, dev)
            row = {"preset": preset, "T": T}
            for b, (layer, _, check, _) in built.items():
                fn = lambda layer=layer: layer(*sets[0])  # noqa: E731
                row[f"{b}_us"] = (time_cuda_graph([lambda s=s, layer=layer: layer(*s) for s in sets],
                                                  warmup=3, reps=10) or float("nan")) * 1e6
                try:
                    for cat, t in kernel_times(fn).items():
                        row[f"{b}:{cat}"] = t
                except Exception as e:  # the profiler is a convenience here, not the measurement
                    print(f"profiler failed: {type(e).__name__}: {e}", file=sys.stderr)
                if b == "fused":
                    row.update({f"ph:{k}": v for k, v in phases(layer, fn, sms).items()})
                check()
            rows.append(row)
            print(f"[fused_phases] {preset} T={T}: " + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                               for k, v in row.items()), flush=True)
        for layer, *_ in built.values():
            layer.destroy()
        del built
        torch.cuda.empty_cache()
    cols = ["preset", "T", "staged_us", "fused_us", "staged:quantise", "staged:dispatch", "staged:L1", "staged:L2",
            "staged:combine", "fused:quantise", "fused:fused", "ph:skew", "ph:D", "ph:D_cta_spread", "ph:L1",
            "ph:L1_prod_spread", "ph:L2", "ph:L2_prod_spread", "ph:C", "ph:total", "ph:ctas", "ph:busy_ctas", "ph:sms_2busy"]
    write_results("fused-phases" + ("-nosplitk" if args.no_splitk else ""),
                  header({"stamps": "us from the first CTA's start; D/L1/L2/C end at the last "
                          "CTA's exit of grid barriers 0/1/2 and its combine end", "splitk": not args.no_splitk}),
                  rows, cols)


if __name__ == "__main__":
    main()
