"""Diagnostic: per-CTA L1 / L2 production times of the fused kernel (its phase stamps) against the work
each CTA was given (units of the round-robin schedule: with the dynamic tile order of the 8- / 16- / 32-token
tiles a CTA's count is not known, so its "us/unit" is an estimate) and against its SM partner's, to see whether
the fused L1 phase's length is the busiest CTA's work or a per-CTA rate; and the phase D / C stamps per CTA.
Prints a summary per case.
Usage (GPU machine): python3 experiments/fused_cta_times.py [preset] [T ...]"""
from __future__ import annotations

import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, "bench")
from megamoe._costs import PRESETS  # noqa: E402
from megamoe._runs import _build, _inputs  # noqa: E402


def choose_k_splits(units: int, workers: int, k_blocks: int, slots: int = 1 << 30) -> int:  # scheduler.cuh
    if units <= 0:
        return 1
    best, best_num = 1, (units + workers - 1) // workers * k_blocks
    for s in range(2, 9):
        if units * s > slots or k_blocks // s < 4:
            break
        num = (units * s + workers - 1) // workers * (k_blocks + 8 * s)
        if num * best * 32 < best_num * s * 31:
            best, best_num = s, num
    return best


def main():
    preset = sys.argv[1] if len(sys.argv) > 1 else "flash"
    tokens = [int(t) for t in sys.argv[2:]] or [16, 128]
    shape = PRESETS[preset]
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layer, _, check, _ = _build("fused", shape, 1, 0, None, max(tokens), 1, dev)
    for T in tokens:
        x, idx, w = _inputs(T, 1, 0, shape, 1, dev)[0]
        for _ in range(3):
            layer(x, idx, w)
        for variant in (["full", "skip_dc"] if os.environ.get("CTA_SKIP_DC") else ["full"]):
            run_case(layer, check, x, idx, w, T, shape, sms, preset, variant)
    layer.destroy()


def run_case(layer, check, x, idx, w, T, shape, sms, preset, variant):
        """variant skip_dc: a build with FUSED_SKIP_DC support (experiments only) runs the kernel without its
        dispatch / combine code; the pool and tables are the previous full call's (same inputs)."""
        dev = x.device
        layer(x, idx, w)
        torch.cuda.synchronize()
        if variant == "skip_dc":
            os.environ["FUSED_SKIP_DC"] = "1"
        st = torch.zeros(2 * sms, 9, dtype=torch.int64, device=dev)
        layer._phase_stamps = st
        layer(x, idx, w)
        torch.cuda.synchronize()
        layer._phase_stamps = None
        os.environ.pop("FUSED_SKIP_DC", None)
        check()
        raw = st.cpu()
        grid = int((raw[:, 0] != 0).sum())
        s = raw[:grid, :8].double() / 1e3
        smid = raw[:grid, 8].tolist()
        counts = layer.buffer.exp_counts.cpu().tolist()
        bn = layer._block_n(T)
        workers = 2 * sms
        # Phases D and C per CTA, from the first CTA's start: where the fixed costs go at few tokens.
        t0 = s[:, 0].min()
        q = lambda v: f"{v.min():.1f} / {v.median():.1f} / {v.max():.1f}"  # noqa: E731
        print(f"[cta] {variant} {preset} T={T} D: CTA starts {q(s[:, 0] - t0)} | dispatch done {q(s[:, 1] - t0)} | "
              f"out of grid barrier 0 {q(s[:, 2] - t0)} | C: out of grid barrier 2 {q(s[:, 6] - t0)} | combine done "
              f"{q(s[:, 7] - t0)} | combine per CTA {q(s[:, 7] - s[:, 6])} us (min / median / max)")
        for name, v in (("dispatch done", s[:, 1] - t0), ("combine per CTA", s[:, 7] - s[:, 6])):
            top = sorted(range(grid), key=lambda b: -float(v[b]))[:4]
            print(f"   slowest {name}: " + ", ".join(f"b{b}/sm{smid[b]} {float(v[b]):.1f}" for b in top))
        for name, n, k, c2, c3 in (("L1", 2 * shape.I, shape.H, 2, 3), ("L2", shape.H, shape.I, 4, 5)):
            pair = 2 if bn <= 16 else 1
            n_units = (n // 128 + pair - 1) // pair
            units = sum((c + bn - 1) // bn for c in counts) * n_units
            S = choose_k_splits(units, workers, k // 128) if bn <= 16 else 1
            per_cta = [0] * grid
            for u in range(units * S):
                per_cta[u % grid] += 1
            prod = (s[:, c3] - s[:, c2]).tolist()
            by_sm = defaultdict(list)
            for b in range(grid):
                by_sm[smid[b]].append(b)
            # per-CTA time per unit, and whether the SM partner's work explains the slow ones
            rate = [prod[b] / per_cta[b] for b in range(grid) if per_cta[b]]
            slow = sorted(range(grid), key=lambda b: -prod[b])[:6]
            fast = sorted((b for b in range(grid) if per_cta[b]), key=lambda b: prod[b])[:6]
            def desc(b):
                p = [q for q in by_sm[smid[b]] if q != b]
                pp = p[0] if p else None
                return (f"b{b}/sm{smid[b]} units {per_cta[b]} prod {prod[b]:.1f} us"
                        + (f" | partner b{pp} units {per_cta[pp]} prod {prod[pp]:.1f}" if pp is not None else ""))
            sm_units = sorted(sum(per_cta[b] for b in v) for v in by_sm.values())
            partners = sorted({tuple(sorted(v)) for v in by_sm.values()})[:4]
            print(f"[cta] {variant} {preset} T={T} {name}: phase {s[:, c3 + 1].max() - s[:, c2].max():.1f} us"
                  f" (to the last CTA out of the next grid barrier); bn {bn} units {units} S {S} grid {grid} units/CTA "
                  f"{min(per_cta)}..{max(per_cta)} units/SM {sm_units[0]}..{sm_units[-1]} | prod us min "
                  f"{min(prod):.1f} max {max(prod):.1f} | us/unit min {min(rate):.2f} med "
                  f"{sorted(rate)[len(rate) // 2]:.2f} max {max(rate):.2f} | SM pairs e.g. {partners}")
            for b in slow[:3]:
                print("   slow", desc(b))
            for b in fast[:3]:
                print("   fast", desc(b))


if __name__ == "__main__":
    main()
