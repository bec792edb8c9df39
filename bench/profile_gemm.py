"""One grouped-GEMM launch of a chosen case, for ncu / compute-sanitizer (no timing loop).
Usage: python bench/profile_gemm.py <contiguous|masked|l1> G m N K [block_n [uniform]]
(l1: contiguous layout with the SwiGLU -> FP8 epilogue, N = 2I)"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import gaussian_packed, gemm_call, random_packed  # noqa: E402

from fp4_gemm import ops, quantize_fp8  # noqa: E402


def main():
    lay, G, m, N, K = sys.argv[1], *map(int, sys.argv[2:6])
    block_n = int(sys.argv[6]) if len(sys.argv) > 6 else None
    w = (random_packed if len(sys.argv) > 7 and sys.argv[7] == 'uniform' else gaussian_packed)(G, N, K)
    xq, xs = quantize_fp8(torch.randn(G * m, K, device="cuda").to(torch.bfloat16))
    fn = gemm_call(lay, G, m, K, w, xq, xs, block_n)
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ops.check_errors()


if __name__ == "__main__":
    main()
