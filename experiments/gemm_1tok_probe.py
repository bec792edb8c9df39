"""Where a 1-token expert GEMM's time goes (issue 22): the layer's L1 / L2 GEMMs at one token per expert
(6 experts, flash / pro shapes, split-K workspace as the layer uses it), CUDA-graph replay:
  warm   the same weights every call (flash L2's 25 MB stay in the 50 MB L2 cache between calls)
  cold   4 weight sets in turn (each call's weights were evicted by the 3 others)
  empty  the same launch with no token rows (launch, unit table, exit: the fixed cost)
  k1     one K block per tile (K = 128): per-tile fixed cost with almost no bytes
  g1     one expert instead of 6 (a sixth of the units and bytes)
Bytes / time against the HBM copy bandwidth measured in the same run. No results file (a probe).
Usage: python experiments/gemm_1tok_probe.py"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import measure_hbm_copy, time_cuda_graph  # noqa: E402
from gemm import gaussian_packed  # noqa: E402

from fp4_gemm import ops, quantize_fp8  # noqa: E402

SHAPES = {"flash": (4096, 2048), "pro": (7168, 3072)}


def case(gemm, N, K, G, sets, tokens=True, ws=None):
    ws = ws or ops.SplitKWorkspace("cuda")
    calls, wbytes = [], 0
    for _ in range(sets):
        w = gaussian_packed(G, N, K)
        w.gate_up_interleave = gemm == "L1"
        wbytes = w.packed.numel() + w.row_scale.numel() * 4
        xq, xs = quantize_fp8(torch.randn(G, K, device="cuda").to(torch.bfloat16))
        offs = torch.arange(0, G + 1, dtype=torch.int32, device="cuda") if tokens else \
            torch.zeros(G + 1, dtype=torch.int32, device="cuda")
        tw = torch.rand(G, device="cuda")
        if gemm == "L1":
            calls.append(lambda w=w, xq=xq, xs=xs, o=offs, tw=tw:
                         ops.grouped_gemm_l1(xq, xs, w, tw, group_offsets=o, block_n=8, splitk=ws))
        else:
            calls.append(lambda w=w, xq=xq, xs=xs, o=offs:
                         ops.grouped_gemm(xq, xs, w, group_offsets=o, block_n=8, splitk=ws))
    t = time_cuda_graph(calls, reps=30)
    ops.check_errors()
    return t, wbytes


def main():
    hbm = measure_hbm_copy()
    print(f"hbm copy {hbm / 1e12:.2f} TB/s")
    for preset, (H, I) in SHAPES.items():
        for gemm, (N, K) in (("L1", (2 * I, H)), ("L2", (H, I))):
            out = []
            for name, kw in (("warm", dict(G=6, sets=1)), ("cold", dict(G=6, sets=4)),
                             ("empty", dict(G=6, sets=1, tokens=False)), ("k1", dict(G=6, sets=1, K=128)),
                             ("g1", dict(G=1, sets=4))):
                k = kw.pop("K", K)
                t, b = case(gemm, N, k, **kw)
                out.append(f"{name} {t * 1e6:6.1f} us ({b / 1e6:5.1f} MB, {b / t / hbm:4.2f} of copy)")
                torch.cuda.empty_cache()
            print(f"{preset} {gemm} N={N} K={K}: " + " | ".join(out), flush=True)


if __name__ == "__main__":
    main()
