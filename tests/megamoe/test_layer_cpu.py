"""megamoe.MegaMoE pieces that need no GPU: argument checks (constructor, weights, forward), the id
check, the layer registry, and the custom op `megamoe::moe_forward` (fake impl under FakeTensorMode,
opcheck, torch.compile(fullgraph=True) tracing) with a stand-in layer."""
from __future__ import annotations

import math

import pytest
import torch

import megamoe
from megamoe import _ops
from megamoe._validate import LayerConfig, check_forward, check_ids, check_layer_args
from megamoe.reference import make_weights
from megamoe.weights import ExpertWeights, check_weights, local_experts

E, H, I, K, TMAX = 4, 256, 128, 2, 16


@pytest.fixture(scope="module")
def weights():
    return make_weights(E, H, I, seed=3)


def _cfg(device="cpu"):
    return LayerConfig(E, H, I, K, TMAX, torch.device(device))


def _inputs(T=5, device="cpu"):
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, H, generator=g).bfloat16().to(device)
    idx = torch.randint(-1, E, (T, K), generator=g).to(device)
    w = torch.rand(T, K, generator=g).to(device)
    return x, idx, w


# ---- constructor ------------------------------------------------------------------------------
def _layer_args(**kw):
    a = dict(max_tokens_per_rank=TMAX, topk=K, activation_clamp=math.inf, backend="staged", timeout_s=10.0)
    a.update(kw)
    return a


def test_layer_args():
    check_layer_args(**_layer_args())
    for b in ("staged", "fused", "auto"):
        check_layer_args(**_layer_args(backend=b))
    with pytest.raises(ValueError, match="backend"):
        check_layer_args(**_layer_args(backend="cuda"))
    for bad, name in ((dict(max_tokens_per_rank=0), "max_tokens_per_rank"), (dict(max_tokens_per_rank=2.0), "max_tokens"),
                      (dict(topk=0), "topk"), (dict(topk=33), "topk"), (dict(activation_clamp=-1.0), "activation_clamp"),
                      (dict(activation_clamp=float("nan")), "activation_clamp"), (dict(timeout_s=0), "timeout_s")):
        with pytest.raises(ValueError, match=name):
            check_layer_args(**_layer_args(**bad))


def test_constructor_checks_before_the_gpu(weights):
    """Argument and weight errors come before any CUDA use (so they are the same on a CPU machine)."""
    with pytest.raises(ValueError, match="backend"):
        megamoe.MegaMoE(weights, max_tokens_per_rank=TMAX, topk=K, backend="fusd")
    bad = ExpertWeights(E, range(E), weights.w1, weights.w1)
    with pytest.raises(ValueError, match="w2"):
        megamoe.MegaMoE(bad, max_tokens_per_rank=TMAX, topk=K)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_constructor_without_cuda(weights):
    from symm_comm import NoCudaDeviceError as CudaUnavailableError
    with pytest.raises(CudaUnavailableError, match="no CUDA device"):
        megamoe.MegaMoE(weights, max_tokens_per_rank=TMAX, topk=K)


# ---- weights ----------------------------------------------------------------------------------
def _tw(tw, **kw):
    from fp4_gemm.numerics import TransformedWeights
    f = dict(codes=tw.codes, shift=tw.shift, row_scale=tw.row_scale, n_clamped=tw.n_clamped,
             gate_up_interleave=tw.gate_up_interleave)
    f.update(kw)
    return TransformedWeights(**f)


def test_weights_ok(weights):
    s = check_weights(weights, 1, 0)
    assert (s.num_experts, s.num_local, s.hidden, s.intermediate) == (E, E, H, I)
    for r in range(2):
        loc = local_experts(weights, r, 2)
        assert loc.experts == range(2 * r, 2 * r + 2)
        assert check_weights(loc, 2, r).num_local == 2
        ref = make_weights(E, H, I, seed=3, experts=range(2 * r, 2 * r + 2))
        for f in ("codes", "shift", "row_scale"):
            assert torch.equal(getattr(loc.w1, f), getattr(ref.w1, f)) and torch.equal(getattr(loc.w2, f), getattr(ref.w2, f))


def test_weights_errors(weights):
    w = weights
    with pytest.raises(ValueError, match="weights.experts"):
        check_weights(w, 2, 1)  # all experts given to rank 1 of 2
    with pytest.raises(ValueError, match="split evenly"):
        check_weights(w, 3, 0)
    nan = w.w1.row_scale.clone()
    nan[1, 5] = float("nan")
    with pytest.raises(ValueError, match=r"w1\.row_scale.*non-finite"):
        check_weights(ExpertWeights(E, range(E), _tw(w.w1, row_scale=nan), w.w2), 1, 0)
    inf = w.w2.row_scale.clone()
    inf[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"w2\.row_scale.*non-finite"):
        check_weights(ExpertWeights(E, range(E), w.w1, _tw(w.w2, row_scale=inf)), 1, 0)
    with pytest.raises(ValueError, match="gate_up_interleave"):
        check_weights(ExpertWeights(E, range(E), _tw(w.w1, gate_up_interleave=False), w.w2), 1, 0)
    with pytest.raises(TypeError, match=r"w2\.codes"):
        check_weights(ExpertWeights(E, range(E), w.w1, _tw(w.w2, codes=w.w2.codes.to(torch.int16))), 1, 0)
    with pytest.raises(ValueError, match=r"w2\.shift"):
        check_weights(ExpertWeights(E, range(E), w.w1, _tw(w.w2, shift=w.w2.shift[:, :, :-1])), 1, 0)
    with pytest.raises(ValueError, match=r"w1\.codes"):  # one expert missing
        check_weights(ExpertWeights(E, range(E), _tw(w.w1, codes=w.w1.codes[:-1]), w.w2), 1, 0)
    with pytest.raises(TypeError, match="weights"):
        check_weights(object(), 1, 0)


def test_weights_sizes_multiple_of_128():
    w = make_weights(2, 256, 64, seed=1)  # I = 64
    with pytest.raises(ValueError, match="intermediate size I=64"):
        check_weights(w, 1, 0)
    w = make_weights(2, 192, 128, seed=1)  # H = 192
    with pytest.raises(ValueError, match="hidden size H=192"):
        check_weights(w, 1, 0)


# ---- forward arguments ------------------------------------------------------------------------
def test_forward_args_ok():
    x, idx, w = _inputs()
    assert check_forward(_cfg(), x, idx, w) == 5
    assert check_forward(_cfg(), x, idx.int(), w) == 5
    x0, i0, w0 = _inputs(0)
    assert check_forward(_cfg(), x0, i0, w0) == 0
    xm, im, wm = _inputs(TMAX)
    assert check_forward(_cfg(), xm, im, wm) == TMAX


@pytest.mark.parametrize("case,exc,words", [
    ("x_dtype", TypeError, ["x:", "bfloat16"]),
    ("x_shape", ValueError, ["x:", "[T, 256]"]),
    ("x_1d", ValueError, ["x:"]),
    ("too_many", ValueError, ["x:", "17 tokens", "max_tokens_per_rank 16"]),
    ("idx_dtype", TypeError, ["topk_idx", "int32"]),
    ("idx_rows", ValueError, ["topk_idx", "T=5"]),
    ("idx_k", ValueError, ["topk_idx", "topk 2"]),
    ("w_dtype", TypeError, ["topk_w", "float32"]),
    ("w_shape", ValueError, ["topk_w"]),
    ("x_device", ValueError, ["x:", "meta"]),
    ("idx_device", ValueError, ["topk_idx", "meta"]),
    ("x_noncontig", ValueError, ["x:", "contiguous"]),
    ("idx_noncontig", ValueError, ["topk_idx", "contiguous"]),
    ("w_noncontig", ValueError, ["topk_w", "contiguous"]),
    ("not_tensor", TypeError, ["topk_w"]),
])
def test_forward_arg_errors(case, exc, words):
    x, idx, w = _inputs()
    if case == "x_dtype":
        x = x.float()
    elif case == "x_shape":
        x = x[:, :128]
    elif case == "x_1d":
        x = x.flatten()
    elif case == "too_many":
        x, idx, w = _inputs(TMAX + 1)
    elif case == "idx_dtype":
        idx = idx.float()
    elif case == "idx_rows":
        idx = idx[:4]
    elif case == "idx_k":
        idx = torch.zeros(5, 3, dtype=torch.int64)
    elif case == "w_dtype":
        w = w.double()
    elif case == "w_shape":
        w = w[:, :1]
    elif case == "x_device":
        x = x.to("meta")
    elif case == "idx_device":
        idx = idx.to("meta")
    elif case == "x_noncontig":
        x = torch.randn(H, 5).bfloat16().t()
    elif case == "idx_noncontig":
        idx = torch.zeros(K, 5, dtype=torch.int64).t()
    elif case == "w_noncontig":
        w = torch.rand(K, 5).t()
    elif case == "not_tensor":
        w = w.tolist()
    with pytest.raises(exc) as e:
        check_forward(_cfg(), x, idx, w)
    for word in words:
        assert word in str(e.value), (str(e.value), word)


def test_check_ids():
    idx = torch.tensor([[0, -1], [3, 2]])
    check_ids(idx, E)
    check_ids(idx[:0], E)
    with pytest.raises(ValueError, match=r"topk_idx: expert id 4 at \[1, 0\]"):
        check_ids(torch.tensor([[0, -1], [4, 2]]), E)
    with pytest.raises(ValueError, match=r"expert id -2 at \[0, 1\]"):
        check_ids(torch.tensor([[0, -2], [1, 2]], dtype=torch.int32), E)


# ---- registry and the custom op ---------------------------------------------------------------
class _StandIn:
    """What the op needs from a layer (config, _forward_impl): a CPU function with the layer's shapes."""

    def __init__(self, device="cpu"):
        self.config = _cfg(device)

    def _forward_impl(self, x, idx, w):
        check_forward(self.config, x, idx, w)
        scale = torch.where(idx >= 0, w, torch.zeros_like(w)).sum(1, keepdim=True)
        return (x.float() * scale).bfloat16()


class _Caller(torch.nn.Module):
    def __init__(self, lid):
        super().__init__()
        self.lid = lid

    def forward(self, x, idx, w):
        return torch.ops.megamoe.moe_forward(x, idx, w, self.lid) * 2


def test_registry_weak():
    s = _StandIn()
    lid = _ops.register(s)
    assert _ops.lookup(lid) is s
    del s
    import gc
    gc.collect()
    assert _ops.lookup(lid) is None
    with pytest.raises(RuntimeError, match=f"layer_id {lid}"):
        _ops.get_layer(lid)


def test_op_eager_and_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    s = _StandIn()
    lid = _ops.register(s)
    x, idx, w = _inputs(7)
    y = torch.ops.megamoe.moe_forward(x, idx, w, lid)
    assert y.shape == (7, H) and y.dtype == torch.bfloat16
    with FakeTensorMode():
        fx, fi, fw = torch.empty(7, H, dtype=torch.bfloat16), torch.empty(7, K, dtype=torch.int64), torch.empty(7, K)
        fy = torch.ops.megamoe.moe_forward(fx, fi, fw, lid)
        assert fy.shape == (7, H) and fy.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="topk"):  # the fake impl checks against the layer's config
            torch.ops.megamoe.moe_forward(fx, torch.empty(7, 3, dtype=torch.int64), torch.empty(7, 3), lid)
    # a fake CUDA layer: fake tensors on cuda need no GPU
    sc = _StandIn("cuda:0")
    lc = _ops.register(sc)
    with FakeTensorMode():
        fy = torch.ops.megamoe.moe_forward(torch.empty(3, H, dtype=torch.bfloat16, device="cuda"),
                                           torch.empty(3, K, dtype=torch.int32, device="cuda"),
                                           torch.empty(3, K, device="cuda"), lc)
        assert fy.device.type == "cuda" and fy.shape == (3, H)


def test_opcheck():
    s = _StandIn()
    lid = _ops.register(s)
    x, idx, w = _inputs(6)
    torch.library.opcheck(torch.ops.megamoe.moe_forward.default, (x, idx, w, lid))
    x0, i0, w0 = _inputs(0)
    torch.library.opcheck(torch.ops.megamoe.moe_forward.default, (x0, i0, w0, lid))


def test_compile_fullgraph():
    s = _StandIn()
    lid = _ops.register(s)
    m = _Caller(lid)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    cm = torch.compile(m, fullgraph=True, backend=backend)
    for T in (5, 9, 0):
        x, idx, w = _inputs(T)
        assert torch.equal(cm(x, idx, w), m(x, idx, w))
    targets = [n.target for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    assert torch.ops.megamoe.moe_forward.default in targets or torch.ops.megamoe.moe_forward in targets, targets
    cm2 = torch.compile(m, fullgraph=True, backend="aot_eager")
    x, idx, w = _inputs(4)
    assert torch.equal(cm2(x, idx, w), m(x, idx, w))
