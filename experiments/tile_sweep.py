"""The layer's token tile (block_n) forced to each candidate: CUDA-graph time of the whole staged / fused call
and of the two GEMMs alone (the staged layer's last pool), 1 rank, with the library in $MEGAMOE_LIB_DIR.
What the tile rule (megamoe.layer's _block_n) is chosen from: a wider tile than the expected tokens per
expert streams each expert's weights fewer times when the per-expert counts spread (random routing).
Usage: python experiments/tile_sweep.py [presets] [tokens] [block_ns|auto] [backends]
(block_ns outside [auto / 2, 4 x auto] of a token count are skipped)
  e.g. python experiments/tile_sweep.py flash,pro 512,2048 8,16,32,64 staged,fused"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from common import time_cuda_graph  # noqa: E402

from megamoe._costs import PRESETS  # noqa: E402
from megamoe._runs import _build, _inputs  # noqa: E402


def main():
    presets = (sys.argv[1] if len(sys.argv) > 1 else "flash,pro").split(",")
    tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "128,512,2048,8192").split(",")]
    bns = sys.argv[3] if len(sys.argv) > 3 else "8,16,32,64,128"
    backends = (sys.argv[4] if len(sys.argv) > 4 else "staged").split(",")
    tag = os.environ.get("MEGAMOE_LIB_DIR", "build/lib").rstrip("/").split("/")[-2]
    dev = torch.device("cuda", 0)
    print(f"{'lib':14s} {'preset':6s} {'T':>5s} {'backend':7s} {'bn':>4s} {'auto':>4s} {'call us':>9s} {'gemms us':>9s}")
    for preset in presets:
        shape = PRESETS[preset]
        for backend in backends:
            layer, _, check, close = _build(backend, shape, 1, 0, None, max(tokens), 1, dev)
            auto_bn = layer._block_n
            for T in tokens:
                sets = _inputs(T, 1, 0, shape, 1, dev)
                a = auto_bn(T)  # candidates within [auto / 2, 4 x auto] (the others stream weights many times over)
                cands = [a] if bns == "auto" else [int(b) for b in bns.split(",") if a // 2 <= int(b) <= 4 * a]
                for bn in cands:
                    layer._block_n = lambda _T, bn=bn: bn  # noqa: E731 (instance attribute shadows the method)
                    t = time_cuda_graph([lambda s=s: layer(*s) for s in sets], warmup=3, reps=10)
                    g = float("nan")
                    if backend == "staged":  # the GEMMs alone on the pool of a fresh call with input set 0
                        layer(*sets[0])
                        g = (time_cuda_graph(lambda: layer._expert_gemms(T), warmup=3, reps=10) or float("nan")) * 1e6
                    check()
                    print(f"{tag:14s} {preset:6s} {T:5d} {backend:7s} {bn:4d} {auto_bn(T):4d} "
                          f"{(t or float('nan')) * 1e6:9.1f} {g:9.1f}", flush=True)
                del layer._block_n
            close()
            del layer
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
