"""Is a few-token dispatch / combine slower in the layer because its code and state are cold in L2 (the
expert GEMMs stream 80+ MB of weights between two calls)? One single-rank symm_comm Buffer (flash / pro
shapes, pull combine), CUDA-graph replays of [dispatch, combine] with and without a 256 MB write before
them (which evicts the 50 MB L2); kernel durations from graph_timeline.timeline.
Usage: python experiments/comm_cold_probe.py [tokens]   (default 1,16)"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, "experiments")
sys.path.insert(0, "bench")
from comm import _routing  # noqa: E402
from graph_timeline import timeline  # noqa: E402


def main():
    import symm_comm
    tokens = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "1,16").split(",")]
    dev = torch.device("cuda", 0)
    gen = torch.Generator(device=dev)
    gen.manual_seed(11)
    junk = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    for name, (E, H, K) in {"flash": (256, 4096, 6), "pro": (384, 7168, 6)}.items():
        buf = symm_comm.Buffer(None, E, H, K, max(tokens), block_m=128, check=False, timeout_s=10.0,
                               combine_input_rows=-1)
        cin = buf.combine_input()
        cin.copy_(torch.randn(cin.shape, generator=gen, device=dev).to(cin.dtype))
        for T in tokens:
            args = _routing(0, T, H, E, K, gen, dev)

            def call():
                h = buf.dispatch(*args, check=False)[-1]
                return buf.combine(cin, h, check=False)

            def cold():
                junk.add_(1)
                return call()

            for tag, fn in (("warm", call), ("cold", cold)):
                per, rows = timeline(fn)
                ks = " ".join(f"{n[:28]} {du:.1f}" for n, st, du, gap in rows if "symm" in n)
                print(f"{name} T {T} {tag}: replay {per:.1f} us | {ks}", flush=True)
            buf.check_errors()
        buf.destroy()


if __name__ == "__main__":
    main()
