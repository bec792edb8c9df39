"""Probe (GPU): which persistent state differs between a fused and a staged layer after a pool overflow.
Both layers (same weights, same pool_rows) run the same calls: overflow, good A, good B, good C. After each
call: outputs vs each other and vs the float64 stage reference; the symm buffers diffed region by region."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "megamoe"))
from layer_cases import generator, make_inputs, stage_reference_y  # noqa: E402

import megamoe  # noqa: E402
from megamoe.reference import make_weights  # noqa: E402
from symm_comm import SymmCommError  # noqa: E402
from symm_comm.layout import REGIONS, region_bytes  # noqa: E402

SEED = 1234
E, H, I, K = 8, 256, 128, 2
weights = make_weights(E, H, I, seed=SEED)
kw = dict(max_tokens_per_rank=64, topk=K, pool_rows=256, timeout_s=2.0)
fused = megamoe.MegaMoE(weights, backend="fused", **kw)
staged = megamoe.MegaMoE(weights, backend="staged", **kw)


def regions(layer):
    L = layer.buffer.layout
    rb = region_bytes(L)
    raw = layer.buffer.raw
    return {r: raw[getattr(L, "off_" + r):getattr(L, "off_" + r) + rb[r]].clone() for r in REGIONS}


def diff(tag):
    torch.cuda.synchronize()
    a, b = regions(fused), regions(staged)
    out = []
    for r in REGIONS:
        d = (a[r] != b[r])
        n = int(d.sum())
        if n:
            i = int(d.nonzero()[0])
            out.append(f"{r}: {n}/{d.numel()} bytes differ (first at +{i}: fused {a[r][i:i+8].tolist()} "
                       f"staged {b[r][i:i+8].tolist()})")
    print(f"[{tag}] buffers: " + ("identical" if not out else "\n   " + "\n   ".join(out)), flush=True)


def call(tag, x, idx, w, expect_err):
    ys = {}
    for name, layer in (("fused", fused), ("staged", staged)):
        try:
            y = layer(x, idx, w)
            torch.cuda.synchronize()
            layer.check_errors()
            ys[name] = y.clone()
            print(f"[{tag}] {name}: no error", flush=True)
        except SymmCommError as e:
            print(f"[{tag}] {name}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            ys[name] = None
    if not expect_err:
        for name, y in ys.items():
            if y is None:
                continue
            ref = stage_reference_y(fused if name == "fused" else staged, weights, idx).to(y.device).double()
            err = (y.double() - ref).abs().max().item()
            fin = bool(torch.isfinite(y).all())
            print(f"[{tag}] {name}: max|y-ref| {err:.3e} max|ref| {ref.abs().max().item():.3e} finite {fin} "
                  f"zeros {int((y == 0).sum())}/{y.numel()}", flush=True)
        if ys["fused"] is not None and ys["staged"] is not None:
            ne = int((ys["fused"].view(torch.int16) != ys["staged"].view(torch.int16)).sum())
            print(f"[{tag}] fused vs staged: {ne}/{ys['fused'].numel()} elements differ", flush=True)
    diff(tag)


diff("created")
x, idx, w = (t.cuda() for t in make_inputs(generator(SEED, 61), 64, H, E, K, p_missing=0.0))
call("overflow", x, idx, w, True)
for j, tag in enumerate(("goodA", "goodB", "goodC")):
    xs, is_, ws = (t.cuda() for t in make_inputs(generator(SEED, 62 + j), 5, H, E, K))
    call(tag, xs, is_, ws, False)
fused.destroy()
staged.destroy()
