"""Does the dispatch / combine kernels' grid size move a few-token layer call? The staged layer (1 rank)
with the symm_comm Buffer's num_sms set to each value in turn: one CUDA-graph replay's kernels
(graph_timeline.timeline) and the output compared bitwise with the full-grid run.
Usage: python experiments/comm_grid_probe.py [presets] [tokens] [grids]   (default flash,pro 1,16 0,64,32,16,8,4)"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, "experiments")
from graph_timeline import timeline  # noqa: E402
from megamoe._costs import PRESETS  # noqa: E402
from megamoe._runs import _build, _inputs  # noqa: E402


def main():
    presets = (sys.argv[1] if len(sys.argv) > 1 else "flash,pro").split(",")
    tokens = [int(t) for t in (sys.argv[2] if len(sys.argv) > 2 else "1,16").split(",")]
    grids = [int(g) for g in (sys.argv[3] if len(sys.argv) > 3 else "0,64,32,16,8,4").split(",")]
    dev = torch.device("cuda", 0)
    for preset in presets:
        shape = PRESETS[preset]
        layer, _, check, close = _build("staged", shape, 1, 0, None, max(tokens), 1, dev)
        for T in tokens:
            x, idx, w = _inputs(T, 1, 0, shape, 1, dev)[0]
            ref = None
            for g in grids:
                layer.buffer.num_sms = g
                y = layer(x, idx, w).clone()
                check()
                ref = y if ref is None else ref
                same = torch.equal(y, ref)
                per, rows = timeline(lambda: layer(x, idx, w))
                comm = {n[:20]: du for n, st, du, gap in rows if "symm" in n}
                print(f"{preset} T {T} num_sms {g:3d}: replay {per:6.1f} us  bitwise-equal {same}  " +
                      "  ".join(f"{k} {v:.1f}" for k, v in comm.items()), flush=True)
        close()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
