"""Quick A/B probe: times a few grouped-GEMM cases with the library in $MEGAMOE_LIB_DIR (one
process per build variant; no ceilings, no results file: bench/gemm.py is the benchmark).
Usage: python experiments/probe_gemm.py [case ...]   (names as in bench/gemm.py CASES; default: all)
env PROBE_BLOCK_N: force a token-tile size (default: the library's choice)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))  # bench/gemm.py, bench/common.py
from common import time_best  # noqa: E402
from gemm import CASES, gaussian_packed, gemm_call  # noqa: E402

from fp4_gemm import quantize_fp8  # noqa: E402


def main():
    names = sys.argv[1:] or [c[0] for c in CASES]
    bn = int(os.environ["PROBE_BLOCK_N"]) if os.environ.get("PROBE_BLOCK_N") else None
    tag = os.environ.get("MEGAMOE_LIB_DIR", "build/lib")[-12:] + f" bn={bn}"
    for name, lay, G, m, N, K in CASES:
        if name not in names:
            continue
        torch.manual_seed(0)
        w = gaussian_packed(G, N, K)
        xq, xs = quantize_fp8(torch.randn(G * m, K, device="cuda").to(torch.bfloat16))
        t, _ = time_best(gemm_call(lay, G, m, K, w, xq, xs, bn))  # the same rule as bench/gemm.py
        wb = w.packed.numel() + w.row_scale.numel() * 4
        print(f"{tag:28s} {name:22s} {t * 1e6:9.1f} us  {2.0 * G * m * N * K / t / 1e12:7.1f} TFLOPS  "
              f"{wb / t / 1e9:7.1f} GB/s weights", flush=True)


if __name__ == "__main__":
    main()
