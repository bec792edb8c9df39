"""A few calls of the MoE layer on a small shape, for compute-sanitizer / ncu (no timing).
Usage: python bench/profile_layer.py [E H I K T [backend]]   (default 16 512 256 4 33 staged)"""
from __future__ import annotations

import sys

import torch

import megamoe
from megamoe.reference import make_weights


def main():
    E, H, I, K, T = (int(v) for v in sys.argv[1:6]) if len(sys.argv) > 5 else (16, 512, 256, 4, 33)
    backend = sys.argv[6] if len(sys.argv) > 6 else "staged"
    layer = megamoe.MegaMoE(make_weights(E, H, I, seed=1), max_tokens_per_rank=T, topk=K, backend=backend)
    gen = torch.Generator().manual_seed(2)
    for t in (T, 1, 0, T):
        x = torch.randn(t, H, generator=gen).bfloat16().cuda()
        idx = torch.rand(t, E, generator=gen).argsort(dim=1)[:, :K].contiguous().cuda()
        idx[::3, -1] = -1
        w = torch.rand(t, K, generator=gen).cuda()
        y = layer(x, idx, w)
        torch.cuda.synchronize()
        layer.check_errors()
        assert y.shape == (t, H) and bool(torch.isfinite(y.float()).all())
    layer.destroy()
    print(f"profile_layer ok ({backend}, E {E} H {H} I {I} K {K} T {T})")


if __name__ == "__main__":
    main()
