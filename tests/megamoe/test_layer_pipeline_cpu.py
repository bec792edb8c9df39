"""The staged pipeline of MegaMoE._forward_impl on the CPU, with the kernels replaced by exact torch
models that have the kernels' Python signatures (fp4_gemm.ops grouped GEMMs with group_counts= and out=,
symm_comm.Buffer dispatch / combine_input / pull combine). Checks the plumbing (which tensor goes where,
top-k weights applied once in L1, combine unweighted, padding rows skipped, T = 0, int32 ids) bitwise
against megamoe.reference.moe_reference, and the custom op path through torch.ops.megamoe.moe_forward."""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import pytest
import torch

from fp4_gemm import ops as real_ops
from fp4_gemm.numerics import quantize_fp8
from megamoe import MegaMoE, _ops
from megamoe._validate import LayerConfig
from megamoe.reference import _scaled_matmul, _silu, _to_bf16, make_weights, moe_reference

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from layer_cases import generator, make_inputs, poison  # noqa: E402

BM = 128


class _SplitK:  # the layer's split-K workspace as FakeOps sees it passed (the layer's own, to both GEMMs)
    resets = 0

    def reset(self):  # the layer zeroes it when a call raises
        _SplitK.resets += 1


SPLITK = _SplitK()


class FakeOps:
    """fp4_gemm.ops as the layer calls it; math exactly the reference's (so results are bitwise equal)."""
    SCALE_GROUP = 128
    pick_block_n = staticmethod(real_ops.pick_block_n)
    pick_block_n_spread = staticmethod(real_ops.pick_block_n_spread)

    def __init__(self):
        self.calls = []

    @staticmethod
    def quantize_fp8_cuda(x, gran=128, pow2=False, out=None):
        q, s = quantize_fp8(x, gran=gran, pow2=pow2)
        if out is None:
            return q, s
        out[0].copy_(q)
        out[1].copy_(s)
        return out

    @staticmethod
    def error_word(device):
        return None

    @staticmethod
    def _rows(group_offsets, group_counts):
        offs, cnt = group_offsets.tolist(), group_counts.tolist()
        for g in range(len(cnt)):
            n = min(cnt[g], offs[g + 1] - offs[g])
            yield g, slice(offs[g], offs[g] + n)

    def grouped_gemm_l1(self, x, x_scales, w, topk_w, *, group_offsets=None, group_counts=None, masked_m=None,
                        activation_clamp=float("inf"), pow2=False, block_n=None, out=None, splitk=None):
        assert masked_m is None and out is not None and block_n in real_ops.BLOCK_NS and splitk is SPLITK
        q, s = out
        I = w.deq.shape[1] // 2
        assert q.shape == (x.shape[0], I) and s.shape == (x.shape[0], I // 128) and topk_w.shape == (x.shape[0],)
        self.calls.append(("l1", block_n))
        for g, r in self._rows(group_offsets, group_counts):
            if r.stop == r.start:
                continue
            gu = _to_bf16(_scaled_matmul(x[r], x_scales[r], w.deq[g], 128)).float()
            gate = gu[:, :I].clamp(max=activation_clamp)
            up = gu[:, I:].clamp(-activation_clamp, activation_clamp)
            a = _silu(gate) * up * topk_w[r].unsqueeze(1)
            q[r], s[r] = quantize_fp8(a, gran=128, pow2=pow2)
        return q, s

    def grouped_gemm(self, x, x_scales, w, *, group_offsets=None, group_counts=None, masked_m=None, block_n=None,
                     out=None, splitk=None):
        assert masked_m is None and out is not None and block_n in real_ops.BLOCK_NS and splitk is SPLITK
        self.calls.append(("l2", block_n))
        for g, r in self._rows(group_offsets, group_counts):
            if r.stop > r.start:
                out[r] = _to_bf16(_scaled_matmul(x[r], x_scales[r], w.deq[g], 128))
        return out

    def check_errors(self):
        pass


class FakeBuffer:
    """symm_comm.Buffer, one rank, contiguous layout, pull combine: pool order (expert, token, k)."""

    def __init__(self, E, H, K, T_max):
        self.E, self.H, self.K = E, H, K
        self.pool_rows = P = -(-T_max * K // BM) * BM + E * BM
        self.pool_x = torch.zeros(P, H, dtype=torch.float8_e4m3fn)
        self.pool_s = torch.zeros(P, H // 128)
        self.pool_w = torch.zeros(P)
        self._cin = torch.zeros(P, H, dtype=torch.bfloat16)
        self.seq = 0

    def dispatch(self, xq, xs, idx, w, check=None):
        assert check is False and xq.dtype == torch.float8_e4m3fn and xs.shape == (xq.shape[0], self.H // 128)
        valid = idx >= 0
        t, k = valid.nonzero(as_tuple=True)
        e = idx[t, k].long()
        order = torch.argsort(e, stable=True)
        t, k, e = t[order], k[order], e[order]
        counts = torch.bincount(e, minlength=self.E)
        offs = torch.zeros(self.E + 1, dtype=torch.int64)
        offs[1:] = torch.cumsum(-(-counts // BM) * BM, 0)
        first = torch.zeros(self.E + 1, dtype=torch.int64)
        first[1:] = torch.cumsum(counts, 0)
        rows = offs[e] + torch.arange(e.numel()) - first[e]
        self.pool_x[rows] = xq[t]
        self.pool_s[rows] = xs[t]
        self.pool_w[rows] = w[t, k]
        self.seq += 1
        h = SimpleNamespace(seq=self.seq, num_tokens=idx.shape[0], expert_offsets=offs.int(), rows=(t, k, rows))
        return self.pool_x, self.pool_s, self.pool_w, counts.int(), h

    def combine_input(self):
        return self._cin

    def combine(self, cin, h, check=None):
        assert cin is self._cin and check is False and h.seq == self.seq
        t, k, rows = h.rows
        acc = torch.zeros(h.num_tokens, self.H)
        for kk in range(self.K):  # FP32 sum over k in slot order
            sel = k == kk
            acc[t[sel]] += cin[rows[sel]].float()
        return acc.bfloat16()

    def memory_report(self):
        return {"total": 0}

    def check_errors(self):
        pass


def _stand_in_layer(weights, K, T_max, clamp, pow2):
    """A MegaMoE whose kernels are FakeOps / FakeBuffer (attributes as MegaMoE.__init__ sets them)."""
    E, H, I = weights.num_experts, weights.hidden, weights.intermediate
    layer = MegaMoE.__new__(MegaMoE)
    torch.nn.Module.__init__(layer)
    layer.device = torch.device("cpu")
    layer.num_ranks, layer.rank, layer.group = 1, 0, None
    layer.num_experts, layer.num_local_experts, layer.hidden, layer.intermediate, layer.topk = E, E, H, I, K
    layer.max_tokens, layer.activation_clamp, layer.pow2_scales = T_max, clamp, pow2
    layer.backend, layer.check_ids = "staged", True
    layer.config = LayerConfig(E, H, I, K, T_max, layer.device)
    layer._ops = FakeOps()
    layer.w1 = SimpleNamespace(deq=weights.w1_deq)  # gate rows then up rows, as the reference uses them
    layer.w2 = SimpleNamespace(deq=weights.w2_deq)
    layer.buffer = FakeBuffer(E, H, K, T_max)
    P = layer.buffer.pool_rows
    layer._aq = torch.zeros(P, I, dtype=torch.float8_e4m3fn)
    layer._a_s = torch.zeros(P, I // 128)
    layer._xq, layer._xs = torch.empty(T_max, H, dtype=torch.float8_e4m3fn), torch.empty(T_max, H // 128)
    layer._splitk = SPLITK
    layer._closed = False
    layer._layer_id = _ops.register(layer)
    return layer


@pytest.fixture
def no_cuda_contexts(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


@pytest.mark.parametrize("E,H,I,K,clamp,pow2", [(8, 256, 128, 3, math.inf, False), (4, 256, 256, 2, 1.5, True)])
def test_staged_pipeline_bitwise(no_cuda_contexts, E, H, I, K, clamp, pow2):
    weights = make_weights(E, H, I, seed=11)
    T_max = 40
    layer = _stand_in_layer(weights, K, T_max, clamp, pow2)
    # NaN poison needs the real fp8 NaN byte in the pools and L1 output (padding rows then hold NaN)
    for i, (T, kw) in enumerate([(7, {}), (1, {}), (T_max, dict(hot=E - 1)), (0, {}), (13, dict(idx_dtype=torch.int32)),
                                 (5, dict(all_missing=True)), (T_max, dict(p_missing=0.0))]):
        x, idx, w = make_inputs(generator(5, i), T, H, E, K, **kw)
        poison(layer)
        y = layer(x, idx, w)
        ref = moe_reference(x, idx.long(), w, weights, activation_clamp=clamp, pow2_scales=pow2)
        assert y.shape == (T, H) and y.dtype == torch.bfloat16
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16)), f"case {i} (T={T}, {kw}) differs"
    # block_n follows the mean rows per expert, T * R * K / E (T >= 1), and their spread
    want = [real_ops.pick_block_n_spread(max(T, 1) * K / E) for T in (7, 1, T_max, 0, 13, 5, T_max)]
    assert [b for what, b in layer._ops.calls if what == "l1"] == want
    resets = _SplitK.resets
    with pytest.raises(ValueError, match="topk_idx: expert id"):
        layer(*make_inputs(generator(5, 99), 3, H, E + 1, K, p_missing=0.0, hot=E))
    assert _SplitK.resets == resets + 1, "a call that raised must zero the split-K workspace"
