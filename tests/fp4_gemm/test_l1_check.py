"""The L1 comparison (gemm_cases.check_l1) accepts GEMM-rounding-level differences and rejects real
bugs (wrong channel order, wrong scale, lost sign); checked on the CPU with synthetic outputs."""
from __future__ import annotations


import pytest
import torch

from fp4_gemm import numerics as nm
from gemm_cases import check_l1, fresh_generator


def _a(gen):
    return torch.randn(64, 256, generator=gen) * torch.exp(torch.randn(64, 1, generator=gen))


def _q(a, pow2=False):
    q, s = nm.quantize_fp8(a.float(), gran=64, pow2=pow2)
    return q.view(torch.uint8), s


@pytest.mark.parametrize("pow2", [False, True])
def test_accepts_gemm_rounding(pow2):
    gen = fresh_generator()
    a = _a(gen)
    noisy = a * (1 + 2.0 ** -12 * torch.randn(a.shape, generator=gen))  # FP8-MMA-level relative error
    check_l1(*_q(noisy, pow2), *_q(a, pow2), "noise")


@pytest.mark.parametrize("bug", ["swap", "scale", "sign"])
def test_rejects_bugs(bug):
    gen = fresh_generator()
    a = _a(gen)
    q_ref, s_ref = _q(a)
    if bug == "swap":  # two channels exchanged
        q, s = _q(a[:, torch.arange(256).roll(1)])
    elif bug == "scale":
        q, s = q_ref, s_ref * 1.01
    else:
        q, s = q_ref ^ 0x80, s_ref
    with pytest.raises(AssertionError):
        check_l1(q, s, q_ref, s_ref, bug)
