"""Phase D of the fused kernel against the staged dispatch kernel, stage by stage (1 rank, one GPU).

Both run symm_comm's dispatch_run, which stamps CTA 0's (group 0's) view of its stages into the buffer's
state (d.start .. d.pull(cta0), layout.cuh SYMM_STATE_STAMPS; the combine likewise); the fused kernel adds
its own per-CTA stamps (fused_kernel.cuh kStamps: 0 start, 1 dispatch done, 2 after grid barrier 0, ...).
Prints, per preset and token count, us from the first fused CTA's start: the launch skew, CTA 0's
dispatch stages, the dispatch's end over the CTAs (min / max), grid barrier 0's exit; for staged the same
stages from its dispatch's d.start. Diagnostics only: python3 experiments/fused_d_stamps.py [flash,pro] [1,16,512]
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from comm_stamps import NAMES, STAMPS  # noqa: E402  (the state's stamp offset and the stages' names)
from megamoe._costs import PRESETS  # noqa: E402
from megamoe._runs import _build, _inputs  # noqa: E402


def symm_stamps(layer) -> list[int]:
    buf = layer.buffer
    off = buf.layout.off_state + STAMPS
    return buf.raw[off:off + 10 * 8].view(torch.int64).cpu().tolist()


def main():
    presets = (sys.argv[1] if len(sys.argv) > 1 else "flash,pro").split(",")
    tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1,16,512").split(",")]
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for preset in presets:
        shape = PRESETS[preset]
        built = {b: _build(b, shape, 1, 0, None, max(tokens), 1, dev) for b in ("fused", "staged")}
        for T in tokens:
            sets = _inputs(T, 1, 0, shape, 1, dev)
            for b, (layer, *_rest) in built.items():
                for i in range(6):
                    layer(*sets[i % len(sets)])
                torch.cuda.synchronize()
                st = None
                if b == "fused":
                    st = torch.zeros(2 * sms, 9, dtype=torch.int64, device=dev)
                    layer._phase_stamps = st
                layer(*sets[0])
                torch.cuda.synchronize()
                layer._phase_stamps = None
                s = symm_stamps(layer)
                if b == "fused":
                    raw = st[st[:, 0] != 0].cpu()
                    t0 = int(raw[:, 0].min())
                    us = (raw[:, :8].double() - t0) / 1e3
                    rel = " ".join(f"{n}={(v - t0) / 1e3:.1f}" for n, v in zip(NAMES[:5], s[:5]))
                    crel = " ".join(f"{n}={(v - t0) / 1e3:.1f}" for n, v in zip(NAMES[6:9], s[6:9]))
                    print(f"[fused_d] {preset} T={T} fused: skew={us[:, 0].max():.1f} cta0.start={us[0, 0]:.1f} "
                          f"{rel} | stamp1 min/cta0/max={us[:, 1].min():.1f}/{us[0, 1]:.1f}/{us[:, 1].max():.1f} "
                          f"bar0 exit max={us[:, 2].max():.1f} | L1 end={us[:, 4].max():.1f} L2 end={us[:, 6].max():.1f} "
                          f"| {crel} C end={us[:, 7].max():.1f}", flush=True)
                    # L1 / L2 per CTA: production time (stamp 3 - 2, 5 - 4) of the CTAs that had work, when the
                    # last producer finished and when the last CTA left the phase's barrier.
                    for ph, (a, b_, c) in (("L1", (2, 3, 4)), ("L2", (4, 5, 6))):
                        prod = us[:, b_] - us[:, a]
                        busy = prod > 0.3 * prod.max()
                        q = prod[busy].sort().values
                        print(f"[fused_d] {preset} T={T} {ph}: start max {us[:, a].max():.1f} | busy {int(busy.sum())} "
                              f"prod min/med/max {q[0]:.1f}/{q[len(q) // 2]:.1f}/{q[-1]:.1f} | idle prod max "
                              f"{prod[~busy].max() if (~busy).any() else 0:.1f} | last producer {us[:, b_].max():.1f} "
                              f"barrier exit {us[:, c].max():.1f} (min {us[:, c].min():.1f})", flush=True)
                else:
                    t0 = s[0]
                    rel = " ".join(f"{n}={(v - t0) / 1e3:.1f}" for n, v in zip(NAMES, s))
                    print(f"[fused_d] {preset} T={T} staged: {rel}", flush=True)
        for layer, *_ in built.values():
            layer.destroy()
        del built
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
