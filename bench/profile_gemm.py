"""One grouped-GEMM launch of a chosen case, for ncu / compute-sanitizer (no timing loop).
Usage: python bench/profile_gemm.py <contiguous|masked|l1> G m N K [block_n [uniform]]
(l1: contiguous layout with the SwiGLU -> FP8 epilogue, N = 2I)"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import gaussian_packed, random_packed  # noqa: E402

from fp4_gemm import ops, quantize_fp8  # noqa: E402


def main():
    lay, G, m, N, K = sys.argv[1], *map(int, sys.argv[2:6])
    block_n = int(sys.argv[6]) if len(sys.argv) > 6 else None
    w = (random_packed if len(sys.argv) > 7 and sys.argv[7] == 'uniform' else gaussian_packed)(G, N, K)
    w.gate_up_interleave = lay == "l1"  # layout-wise any packed weights are valid L1 weights
    xq, xs = quantize_fp8(torch.randn(G * m, K, device="cuda").to(torch.bfloat16))
    for _ in range(2):
        if lay == "l1":
            offs = torch.arange(0, G + 1, dtype=torch.int32, device="cuda") * m
            ops.grouped_gemm_l1(xq, xs, w, torch.rand(G * m, device="cuda"), group_offsets=offs, block_n=block_n)
        elif lay == "contiguous":
            offs = torch.arange(0, G + 1, dtype=torch.int32, device="cuda") * m
            ops.grouped_gemm(xq, xs, w, group_offsets=offs, block_n=block_n)
        else:
            mm = torch.full((G,), m, dtype=torch.int32, device="cuda")
            ops.grouped_gemm(xq.view(G, m, K), xs.view(G, m, K // 128), w, masked_m=mm, block_n=block_n)
    torch.cuda.synchronize()
    ops.check_errors()


if __name__ == "__main__":
    main()
