"""megamoe.MegaMoE on one GPU (single-process mode: all experts local) against megamoe.reference.

Inputs are fresh each run; the seed is printed and in every failure message (replay with
MEGAMOE_TEST_SEED=<seed>). Metric per case (layer_cases.py says why two): against the stage reference (float64 L2 + combine on the
layer's own L1 output) >= 97 % of output elements within one BF16 step and relative Frobenius error
<= 5e-3; against moe_reference end to end >= 70 % and <= 1e-2. Intermediates are poisoned with NaN first."""
from __future__ import annotations

import importlib.util
import math
import os
import sys
import zlib

import pytest
import torch

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.dirname(__file__))
from layer_cases import (L1_CODES_EQUAL, check_metric, fresh_seed, generator, graph_replays, l1_codes_equal,  # noqa: E402
                         make_inputs, metric, poison, stage_reference_y, why)

SEED = fresh_seed()
print(f"test_layer_gpu: {why(SEED)}")

# (E, H, I, K, activation_clamp, pow2_scales)
CONFIGS = {"E16_H512_I256_K4": (16, 512, 256, 4, math.inf, False),
           "E8_H384_I384_K3_clamp_pow2": (8, 384, 384, 3, 2.0, True)}
T_MAX = 129


def _libs_ok() -> bool:
    from fp4_gemm._lib import LIB as F
    from symm_comm._lib import LIB as S
    return F.available() and S.available()


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def setup(request):
    if not _libs_ok():
        pytest.skip("libfp4_gemm.so / libsymm_comm.so not built")
    import megamoe
    from megamoe.reference import make_weights
    E, H, I, K, clamp, pow2 = CONFIGS[request.param]
    weights = make_weights(E, H, I, seed=SEED)
    layer = megamoe.MegaMoE(weights, max_tokens_per_rank=T_MAX, topk=K, activation_clamp=clamp, pow2_scales=pow2,
                            verbose=True)
    yield layer, weights, CONFIGS[request.param], request.param
    torch.cuda.synchronize()
    layer.destroy()


def _reference(weights, cfg, x, idx, w, intermediates=False):
    from megamoe.reference import moe_reference
    _, _, _, _, clamp, pow2 = cfg
    return moe_reference(x, idx, w, weights, activation_clamp=clamp, pow2_scales=pow2,
                         return_intermediates=intermediates)


def _run_checked(layer, weights, cfg, x, idx, w, what):
    poison(layer)
    y = layer(x.cuda(), idx.cuda(), w.cuda())
    torch.cuda.synchronize()
    layer.check_errors()
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.device == layer.device, what
    ref, inter = _reference(weights, cfg, x, idx, w, intermediates=True)
    m = metric(y, ref)
    ms = metric(y, *stage_reference_y(layer, weights, idx))
    eq = l1_codes_equal(layer, inter.l1_q)
    print(f"{what}: stage within-1-ulp {ms['within']:.5f}, rel-fro {ms['rel']:.3e}; L1 codes equal {eq:.5f}; "
          f"end-to-end within-1-ulp {m['within']:.5f}, rel-fro {m['rel']:.3e}; {m['n']} elements")
    check_metric(ms, what, stage=True)
    assert eq >= L1_CODES_EQUAL, f"{what}: only {eq:.4f} of the L1 codes equal the float64 recipe's"
    check_metric(m, what)
    return y


CASES = [("random", 1), ("random", 7), ("random", 33), ("random", 129), ("hot", 33), ("hot", 129),
         ("all_missing", 7), ("zero", 0), ("int32", 33), ("no_missing", T_MAX)]


@pytest.mark.parametrize("kind,T", CASES, ids=[f"{k}-{t}" for k, t in CASES])
def test_layer_vs_reference(setup, kind, T):
    layer, weights, cfg, name = setup
    E, H, I, K = cfg[:4]
    for rep in range(2):  # two fresh draws per case
        gen = generator(SEED, T, rep, zlib.crc32(kind.encode()))
        kw = dict(hot=E - 1) if kind == "hot" else dict(all_missing=True) if kind == "all_missing" else \
            dict(idx_dtype=torch.int32) if kind == "int32" else dict(p_missing=0.0) if kind == "no_missing" else {}
        x, idx, w = make_inputs(gen, T, H, E, K, **kw)
        y = _run_checked(layer, weights, cfg, x, idx, w, f"{name} {kind} T={T} rep {rep}, {why(SEED)}")
        if kind in ("all_missing", "zero"):
            assert not bool(y.float().abs().sum()), f"{kind}: expected an all-zero output"


def test_back_to_back_calls(setup):
    """Several calls without a host sync between them (outputs kept), then checked."""
    layer, weights, cfg, name = setup
    E, H, I, K = cfg[:4]
    outs = []
    for i, T in enumerate((5, 129, 0, 64, 1, 17)):
        x, idx, w = make_inputs(generator(SEED, 77, i), T, H, E, K)
        outs.append((layer(x.cuda(), idx.cuda(), w.cuda()), x, idx, w))
    torch.cuda.synchronize()
    layer.check_errors()
    for i, (y, x, idx, w) in enumerate(outs):
        m = metric(y, _reference(weights, cfg, x, idx, w))
        check_metric(m, f"{name} back-to-back call {i}, {why(SEED)}")


def test_cuda_graph_replays(setup):
    """100 replays of a captured call, fresh routing copied into the static inputs before each, bitwise
    equal to the eager result of the same inputs; the layer still works eagerly afterwards."""
    layer, weights, cfg, name = setup
    E, H, I, K = cfg[:4]
    T = 33
    sets = [tuple(t.cuda() for t in make_inputs(generator(SEED, 900, j), T, H, E, K, hot=(j if j % 2 else None)))
            for j in range(5)]
    eager = [layer(*s) for s in sets]
    again = layer(*sets[0])
    torch.cuda.synchronize()
    layer.check_errors()
    assert torch.equal(eager[0].view(torch.int16), again.view(torch.int16)), "eager calls are not deterministic"
    check_metric(metric(eager[1], _reference(weights, cfg, *(t.cpu() for t in sets[1]))), f"{name} graph eager")
    def same_as_eager(ys, i, j):
        assert torch.equal(ys.view(torch.int16), eager[j].view(torch.int16)), \
            f"{name}: replay {i} (input set {j}) differs from eager at {int((ys != eager[j]).sum())} elements, {why(SEED)}"
    graph_replays(layer, sets, 100, lambda i: (i * 3 + 1) % 5, same_as_eager)
    layer.check_errors()
    x, idx, w = make_inputs(generator(SEED, 901), 40, H, E, K)
    _run_checked(layer, weights, cfg, x, idx, w, f"{name} eager after graph replays, {why(SEED)}")


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="inductor needs triton"))])
def test_torch_compile_fullgraph(setup, backend):
    layer, weights, cfg, name = setup
    E, H, I, K = cfg[:4]

    class Block(torch.nn.Module):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def forward(self, x, idx, w):
            return self.moe(x, idx, w)

    torch._dynamo.reset()
    blk = Block(layer)
    cm = torch.compile(blk, fullgraph=True, backend=backend)
    for T in (7, 33):
        x, idx, w = (t.cuda() for t in make_inputs(generator(SEED, 500, T), T, H, E, K))
        y_c = cm(x, idx, w)
        y_e = blk(x, idx, w)
        torch.cuda.synchronize()
        assert torch.equal(y_c.view(torch.int16), y_e.view(torch.int16)), f"{name} compiled ({backend}) != eager, T={T}"
    check_metric(metric(y_c, _reference(weights, cfg, x.cpu(), idx.cpu(), w.cpu())), f"{name} compiled")


def _bad_calls(layer, x, idx, w):
    E, Tm = layer.num_experts, layer.max_tokens
    big = torch.zeros(Tm + 1, x.shape[1], dtype=torch.bfloat16, device=x.device)
    big_i = torch.zeros(Tm + 1, idx.shape[1], dtype=idx.dtype, device=x.device)
    big_w = torch.zeros(Tm + 1, idx.shape[1], device=x.device)
    hi, lo = idx.clone(), idx.clone()
    hi[2, 1] = E
    lo[3, 0] = -2
    return [
        ("x float32", (x.float(), idx, w), TypeError, "x"),
        ("x wrong hidden", (x[:, :128].contiguous(), idx, w), ValueError, "x"),
        ("x on cpu", (x.cpu(), idx, w), ValueError, "x"),
        ("x non-contiguous", (torch.cat([x, x], 1)[:, ::2], idx, w), ValueError, "x"),
        ("idx float", (x, idx.float(), w), TypeError, "topk_idx"),
        ("idx wrong K", (x, torch.cat([idx, idx], 1), torch.cat([w, w], 1)), ValueError, "topk_idx"),
        ("idx >= E", (x, hi, w), ValueError, "topk_idx"),
        ("idx < -1", (x, lo, w), ValueError, "topk_idx"),
        ("idx non-contiguous", (x, idx.t().contiguous().t(), w), ValueError, "topk_idx"),
        ("w float64", (x, idx, w.double()), TypeError, "topk_w"),
        ("w wrong shape", (x, idx, w[:-1]), ValueError, "topk_w"),
        ("T > max", (big, big_i, big_w), ValueError, "max_tokens_per_rank"),
    ]


def test_bad_inputs_then_good_call(setup):
    layer, weights, cfg, name = setup
    E, H, I, K = cfg[:4]
    x, idx, w = make_inputs(generator(SEED, 31), 9, H, E, K)
    xc, ic, wc = x.cuda(), idx.cuda(), w.cuda()
    for what, args, exc, word in _bad_calls(layer, xc, ic, wc):
        with pytest.raises(exc) as e:
            layer(*args)
        assert word in str(e.value), f"{what}: error {e.value!r} does not name {word!r}"
        _run_checked(layer, weights, cfg, x, idx, w, f"{name} good call after '{what}', {why(SEED)}")


def test_memory_report(setup):
    layer, weights, cfg, name = setup
    m = layer.memory_report()
    assert m["total"] == m["buffer"]["total"] + sum(m["weights"].values()) + sum(m["intermediates"].values())
    assert m["intermediates"]["l1_q"] == layer.buffer.pool_rows * layer.intermediate
    print(layer.describe_memory())


def test_device_side_id_error():
    """check_ids=False: a bad id reaches the dispatch kernel, whose error word names it (raised by
    check_errors / the next call); after buffer.resync() the layer computes correctly again."""
    if not _libs_ok():
        pytest.skip("libraries not built")
    import megamoe
    from megamoe.reference import make_weights, moe_reference
    from symm_comm import SymmCommError
    E, H, I, K = 8, 256, 128, 2
    weights = make_weights(E, H, I, seed=SEED)
    layer = megamoe.MegaMoE(weights, max_tokens_per_rank=16, topk=K, check_ids=False, timeout_s=2.0)
    try:
        x, idx, w = make_inputs(generator(SEED, 41), 12, H, E, K)
        bad = idx.clone()
        bad[4, 1] = E + 3
        try:
            layer(x.cuda(), bad.cuda(), w.cuda())
            torch.cuda.synchronize()
            layer.check_errors()
            raise AssertionError("a bad expert id was not reported")
        except SymmCommError as e:
            assert "expert id" in str(e) or "timed out" in str(e), str(e)
            print("device-side report:", e)
        layer.buffer.resync()
        y = layer(x.cuda(), idx.cuda(), w.cuda())
        torch.cuda.synchronize()
        layer.check_errors()
        check_metric(metric(y, moe_reference(x, idx, w, weights)), f"after a device-side id error, {why(SEED)}")
    finally:
        torch.cuda.synchronize()
        layer.destroy()


def test_single_process_buffer_roundtrip():
    """symm_comm.Buffer(None, ...) without torch.distributed: dispatch + pull combine on one GPU."""
    if not _libs_ok():
        pytest.skip("libraries not built")
    import symm_comm
    from fp4_gemm import ops
    E, H, K, T = 8, 256, 3, 20
    buf = symm_comm.Buffer(None, E, H, K, 32, combine_input_rows=-1)
    try:
        assert buf.num_ranks == 1 and buf.rank == 0 and buf.backend_name == "local"
        assert buf.raw.data_ptr() % 4096 == 0
        x, idx, w = (t.cuda() for t in make_inputs(generator(SEED, 61), T, H, E, K))
        xq, xs = ops.quantize_fp8_cuda(x)
        pool, ps, pw, counts, h = buf.dispatch(xq, xs, idx, w)
        want = torch.bincount(idx[idx >= 0].flatten(), minlength=E)
        assert torch.equal(counts.long().cpu(), want.cpu())
        cin = buf.combine_input()
        cin[: pool.shape[0]] = pool.float().bfloat16()  # each pool row is its token's FP8 row
        y = buf.combine(cin, h)
        n = (idx >= 0).sum(1, keepdim=True).float()
        # sum of n equal BF16-exact rows (FP8 values) from +0: exact; no rows: +0 (not -0 = x * 0)
        ref = torch.where(n > 0, xq.float() * n, torch.zeros_like(n)).bfloat16()
        ne = y.view(torch.int16) != ref.view(torch.int16)
        assert not bool(ne.any()), (f"{int(ne.sum())} of {ne.numel()} elements differ; tokens "
                                    f"{ne.any(1).nonzero().flatten().tolist()[:10]} (rows per token "
                                    f"{n.flatten().int().tolist()}); first: y {y[ne][:4].tolist()} ref {ref[ne][:4].tolist()}, {why(SEED)}")
    finally:
        buf.destroy()
