"""Inputs and the accuracy metric shared by the MegaMoE GPU tests (one process and R processes).

Everything is generated on the CPU from (seed, case, rank), so every rank can rebuild every other
rank's inputs and the global reference bit for bit."""
from __future__ import annotations

import os

import numpy as np
import torch

WITHIN_ONE_ULP = 0.97  # fraction of output elements within one BF16 step of the reference
REL_FRO = 5e-3         # relative Frobenius error bound
FP8_NAN = 0x7F         # E4M3 (fn) NaN byte: poison for FP8 intermediates


def fresh_seed() -> int:
    return int(os.environ.get("MEGAMOE_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def why(seed: int) -> str:
    return f"seed {seed} (replay: MEGAMOE_TEST_SEED={seed})"


def generator(seed: int, *key: int) -> torch.Generator:
    state = np.random.SeedSequence((seed, *key)).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def make_inputs(gen: torch.Generator, T: int, H: int, E: int, K: int, *, p_missing: float = 0.2,
                hot: int | None = None, all_missing: bool = False, idx_dtype=torch.int64):
    """CPU (x BF16 [T, H], topk_idx [T, K], topk_w FP32 [T, K]). Distinct experts per token; a fraction
    p_missing of the slots is -1; hot: slot 0 of every token on that expert (its other slots elsewhere)."""
    x = (torch.randn(T, H, generator=gen) * 2.0 ** torch.randint(-3, 4, (T, 1), generator=gen)).bfloat16()
    idx = torch.rand(T, E, generator=gen).argsort(dim=1)[:, :K].contiguous()
    if hot is not None and T:  # swap `hot` into slot 0 where the token has it, else put it there
        rows = torch.arange(T)
        has = (idx == hot).any(dim=1)
        pos = (idx == hot).int().argmax(dim=1)
        slot0 = idx[:, 0].clone()
        idx[rows[has], pos[has]] = slot0[has]
        idx[:, 0] = hot
    if p_missing > 0 and T:
        drop = torch.rand(T, K, generator=gen) < p_missing
        if hot is not None:
            drop[:, 0] = False
        idx[drop] = -1
    if all_missing:
        idx.fill_(-1)
    w = (torch.rand(T, K, generator=gen) + 0.05).float()
    return x.contiguous(), idx.to(idx_dtype).contiguous(), w.contiguous()


def bf16_ulp(r: torch.Tensor) -> torch.Tensor:
    """One BF16 step at |r|: 2^(floor(log2 |r|) - 7) (normal range; tiny values get the smallest normal's)."""
    _, e = torch.frexp(r.abs().clamp_min(2.0 ** -126))
    return torch.ldexp(torch.ones_like(r), (e - 8).to(torch.int32))


def metric(y: torch.Tensor, ref: torch.Tensor) -> dict:
    """{'within': fraction within one BF16 step, 'rel': relative Frobenius error, 'finite': all finite}."""
    y, r = y.detach().float().cpu(), ref.detach().float().cpu()
    assert y.shape == r.shape, f"shape {tuple(y.shape)} != reference {tuple(r.shape)}"
    finite = bool(torch.isfinite(y).all())
    if y.numel() == 0:
        return {"within": 1.0, "rel": 0.0, "finite": True, "n": 0}
    d = (y.double() - r.double())
    within = float(((d.abs() <= bf16_ulp(r).double())).double().mean())
    nr = float(r.double().norm())
    rel = float(d.norm()) / nr if nr > 0 else (0.0 if float(d.norm()) == 0 else float("inf"))
    return {"within": within, "rel": rel, "finite": finite, "n": y.numel()}


def check_metric(m: dict, what: str) -> None:
    assert m["finite"], f"{what}: output has NaN/inf ({m})"
    assert m["within"] >= WITHIN_ONE_ULP, f"{what}: only {m['within']:.4f} of elements within one BF16 step ({m})"
    assert m["rel"] <= REL_FRO, f"{what}: relative Frobenius error {m['rel']:.3e} > {REL_FRO} ({m})"


def poison(layer) -> None:
    """NaN into every intermediate the staged pipeline writes (pool, L1 output, combine input)."""
    b = layer.buffer
    b.pool_x.view(torch.uint8).fill_(FP8_NAN)
    b.pool_s.fill_(float("nan"))
    b.pool_w.fill_(float("nan"))
    layer._aq.view(torch.uint8).fill_(FP8_NAN)
    layer._a_s.fill_(float("nan"))
    b.combine_input().fill_(float("nan"))
