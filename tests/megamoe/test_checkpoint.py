"""megamoe.load_experts: small checkpoints written here in each layout, loaded, compared bitwise
with fp4_gemm's own quantise/transform; every rejected checkpoint names its tensor (CPU only)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

pytest.importorskip("safetensors")
from safetensors.torch import save_file  # noqa: E402

import megamoe.checkpoint as ckpt  # noqa: E402
from fp4_gemm.numerics import (deinterleave_rows, dequantize_mxfp4, dequantize_transformed,  # noqa: E402
                               quantize_mxfp4, transform_weights)
from megamoe.checkpoint import CheckpointError, load_experts  # noqa: E402

E, H, I = 4, 256, 128
P = "model.layers.0.mlp.experts"
KW = dict(num_experts=E, hidden=H, intermediate=I)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _float_tensors(seed=0, names=("gate_proj", "up_proj", "down_proj"), prefix=P, dtype=torch.bfloat16):
    g = _gen(seed)
    t = {}
    for e in range(E):
        t[f"{prefix}.{e}.{names[0]}.weight"] = (torch.randn(I, H, generator=g) / 16).to(dtype)
        t[f"{prefix}.{e}.{names[1]}.weight"] = (torch.randn(I, H, generator=g) / 16).to(dtype)
        t[f"{prefix}.{e}.{names[2]}.weight"] = (torch.randn(H, I, generator=g) / 11).to(dtype)
    return t


def _mx(rows, k, lead=(), seed=0, lo=120, hi=134):
    """Random MXFP4 (codes uint8 [..., rows, k/2], exps uint8 [..., rows, k/32]); exponent spread
    within a row <= 14, so the transform clamps nothing."""
    g = _gen(seed)
    codes = torch.randint(0, 256, lead + (rows, k // 2), generator=g, dtype=torch.uint8)
    exps = torch.randint(lo, hi + 1, lead + (rows, k // 32), generator=g, dtype=torch.uint8)
    return codes, exps


def _blocks(codes):
    return codes.unflatten(-1, (-1, 16)).contiguous()


def _stacked_tensors(seed=0):
    c1, x1 = _mx(2 * I, H, (E,), seed)
    c2, x2 = _mx(H, I, (E,), seed + 1)
    t = {f"{P}.gate_up_proj_blocks": _blocks(c1), f"{P}.gate_up_proj_scales": x1,
         f"{P}.down_proj_blocks": _blocks(c2), f"{P}.down_proj_scales": x2}
    return t, (c1, x1, c2, x2)


def _expert_mx_tensors(seed=0):
    c1, x1 = _mx(2 * I, H, (E,), seed)
    c2, x2 = _mx(H, I, (E,), seed + 1)
    t = {}
    for e in range(E):
        for name, c, x in (("gate_proj", c1[e, :I], x1[e, :I]), ("up_proj", c1[e, I:], x1[e, I:]),
                           ("down_proj", c2[e], x2[e])):
            t[f"{P}.{e}.{name}.weight_blocks"] = _blocks(c)
            t[f"{P}.{e}.{name}.weight_scales"] = x.contiguous()
    return t, (c1, x1, c2, x2)


def _save(path, tensors):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def _assert_tw_equal(got, want):
    assert torch.equal(got.codes, want.codes)
    assert torch.equal(got.shift, want.shift)
    assert torch.equal(got.row_scale, want.row_scale)
    assert got.n_clamped == want.n_clamped
    assert got.gate_up_interleave == want.gate_up_interleave


def _assert_expert_equal(got, i, want):
    """Expert i of a stacked result equals a single-expert TransformedWeights."""
    assert torch.equal(got.codes[i], want.codes)
    assert torch.equal(got.shift[i], want.shift)
    assert torch.equal(got.row_scale[i], want.row_scale)
    assert got.gate_up_interleave == want.gate_up_interleave


def _one(tw, i):
    return ckpt.TransformedWeights(tw.codes[i], tw.shift[i], tw.row_scale[i], 0, tw.gate_up_interleave)


def _check_mx_result(w, experts, c1, x1, c2, x2):
    for i, e in enumerate(experts):
        _assert_expert_equal(w.w1, i, transform_weights(c1[e], x1[e], gate_up_interleave=True))
        _assert_expert_equal(w.w2, i, transform_weights(c2[e], x2[e]))
        # nothing clamps: the in-kernel values are the checkpoint's values
        assert torch.equal(deinterleave_rows(dequantize_transformed(_one(w.w1, i))),
                           dequantize_mxfp4(c1[e], x1[e]).double())
        assert torch.equal(dequantize_transformed(_one(w.w2, i)), dequantize_mxfp4(c2[e], x2[e]).double())
    assert w.w1.n_clamped == 0 and w.w2.n_clamped == 0


# --- layout 1: per-expert floating point ----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("experts", [None, range(2, 4)])
def test_float_layout(tmp_path, dtype, experts):
    t = _float_tensors(dtype=dtype)
    _save(tmp_path / "model.safetensors", t)
    w = load_experts(tmp_path / "model.safetensors", experts=experts, **KW)
    experts = range(E) if experts is None else experts
    assert w.experts == experts and w.num_experts == E
    assert w.w1.codes.shape == (len(experts), 2 * I, H // 2) and w.w2.codes.shape == (len(experts), H, I // 2)
    n1 = n2 = 0
    for i, e in enumerate(experts):
        gate, up, down = (t[f"{P}.{e}.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        cg, xg = quantize_mxfp4(gate)
        cu, xu = quantize_mxfp4(up)
        tw1 = transform_weights(torch.cat([cg, cu]), torch.cat([xg, xu]), gate_up_interleave=True)
        tw2 = transform_weights(*quantize_mxfp4(down))
        _assert_expert_equal(w.w1, i, tw1)
        _assert_expert_equal(w.w2, i, tw2)
        n1, n2 = n1 + tw1.n_clamped, n2 + tw2.n_clamped
    assert (w.w1.n_clamped, w.w2.n_clamped) == (n1, n2)
    assert w.w1.gate_up_interleave and not w.w2.gate_up_interleave


def test_float_layout_mixtral_names_other_layer(tmp_path):
    prefix = "model.layers.3.block_sparse_moe.experts"
    t = _float_tensors(names=("w1", "w3", "w2"), prefix=prefix)
    _save(tmp_path / "a.safetensors", t)
    ref = _float_tensors()
    _save(tmp_path / "b.safetensors", ref)
    w = load_experts(tmp_path / "a.safetensors", prefix="model.layers.{layer}.block_sparse_moe.experts",
                     layer=3, **KW)
    w_ref = load_experts(tmp_path / "b.safetensors", **KW)
    for got, want in ((w.w1, w_ref.w1), (w.w2, w_ref.w2)):
        _assert_tw_equal(got, want)


def test_float_layout_file_list_and_directory(tmp_path):
    t = _float_tensors()
    names = sorted(t)
    half = len(names) // 2
    _save(tmp_path / "m-1.safetensors", {k: t[k] for k in names[:half]})
    _save(tmp_path / "m-2.safetensors", {k: t[k] for k in names[half:]})
    a = load_experts([tmp_path / "m-1.safetensors", tmp_path / "m-2.safetensors"], **KW)
    b = load_experts(tmp_path, **KW)
    _assert_tw_equal(a.w1, b.w1)
    _assert_tw_equal(a.w2, b.w2)


# --- layout 2: MXFP4 blocks + scales --------------------------------------------------------------

@pytest.mark.parametrize("experts", [None, range(2, 4)])
def test_stacked_mxfp4(tmp_path, experts):
    t, src = _stacked_tensors()
    _save(tmp_path / "m.safetensors", t)
    w = load_experts(tmp_path / "m.safetensors", experts=experts, **KW)
    _check_mx_result(w, range(E) if experts is None else experts, *src)


def test_stacked_mxfp4_interleaved_gate_up(tmp_path):
    t, (c1, x1, c2, x2) = _stacked_tensors()
    inter = lambda a: torch.stack([a[:, :I], a[:, I:]], dim=2).flatten(1, 2)  # gate0, up0, gate1, ...
    t[f"{P}.gate_up_proj_blocks"] = _blocks(inter(c1))
    t[f"{P}.gate_up_proj_scales"] = inter(x1)
    _save(tmp_path / "m.safetensors", t)
    w = load_experts(tmp_path / "m.safetensors", gate_up_order="interleaved", **KW)
    _check_mx_result(w, range(E), c1, x1, c2, x2)


@pytest.mark.parametrize("experts", [None, range(2, 4)])
def test_per_expert_mxfp4(tmp_path, experts):
    t, src = _expert_mx_tensors()
    _save(tmp_path / "m.safetensors", t)
    w = load_experts(tmp_path / "m.safetensors", experts=experts, **KW)
    _check_mx_result(w, range(E) if experts is None else experts, *src)


def test_mxfp4_clamped_groups_reported(tmp_path):
    t, (c1, x1, c2, x2) = _stacked_tensors()
    x1[1, 5, 0] = 100  # 34 binades below the row's max: shift clamped
    x2[3, 7, 1] = 100
    t[f"{P}.gate_up_proj_scales"], t[f"{P}.down_proj_scales"] = x1, x2
    _save(tmp_path / "m.safetensors", t)
    with pytest.warns(UserWarning, match="clamped 1 W1 and 1 W2 groups"):
        w = load_experts(tmp_path / "m.safetensors", **KW)
    assert (w.w1.n_clamped, w.w2.n_clamped, w.n_clamped) == (1, 1, 2)
    _assert_tw_equal(w.w1, transform_weights(c1, x1, gate_up_interleave=True))
    _assert_tw_equal(w.w2, transform_weights(c2, x2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_experts(tmp_path / "m.safetensors", warn_clamped=False, **KW)


# --- index.json: a rank opens only its files ------------------------------------------------------

def test_index_opens_only_needed_file(tmp_path, monkeypatch):
    t = _float_tensors()
    a = {k: v for k, v in t.items() if int(k.split(".")[5]) < 2}
    b = {k: v for k, v in t.items() if int(k.split(".")[5]) >= 2}
    _save(tmp_path / "model-00001-of-00002.safetensors", a)
    _save(tmp_path / "model-00002-of-00002.safetensors", b)
    full = load_experts([tmp_path / "model-00001-of-00002.safetensors",
                         tmp_path / "model-00002-of-00002.safetensors"], **KW)
    weight_map = {k: "model-00001-of-00002.safetensors" for k in a}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in b})
    weight_map["lm_head.weight"] = "model-00001-of-00002.safetensors"
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"not a safetensors file")  # unreadable

    opened = []
    real = ckpt.safe_open

    def spy(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(ckpt, "safe_open", spy)
    for src in (index, tmp_path):  # the index file, or the directory holding it
        opened.clear()
        w = load_experts(src, experts=range(2, 4), **KW)  # rank 1 of 2
        assert opened == [str(tmp_path / "model-00002-of-00002.safetensors")]
        for got, want in ((w.w1, full.w1), (w.w2, full.w2)):
            assert torch.equal(got.codes, want.codes[2:4])
            assert torch.equal(got.shift, want.shift[2:4])
            assert torch.equal(got.row_scale, want.row_scale[2:4])
    with pytest.raises(CheckpointError, match="model-00001-of-00002"):
        load_experts(index, experts=range(0, 2), **KW)  # rank 0 needs the unreadable file


# --- errors ---------------------------------------------------------------------------------------

def _raises(path, match, **kw):
    with pytest.raises(CheckpointError, match=match):
        load_experts(path, **{**KW, **kw})


def test_missing_tensor(tmp_path):
    t = _float_tensors()
    del t[f"{P}.2.up_proj.weight"]
    f = _save(tmp_path / "m.safetensors", t)
    _raises(f, rf"missing tensor {P}\.2\.up_proj\.weight")
    load_experts(f, experts=range(0, 2), **KW)  # rank 0 does not need it
    t, _ = _stacked_tensors()
    del t[f"{P}.down_proj_scales"]
    _raises(_save(tmp_path / "s.safetensors", t), rf"missing tensor {P}\.down_proj_scales")
    t, _ = _expert_mx_tensors()
    del t[f"{P}.3.gate_proj.weight_scales"]
    _raises(_save(tmp_path / "e.safetensors", t), rf"missing tensor {P}\.3\.gate_proj\.weight_scales")
    _raises(tmp_path / "m.safetensors", "no expert tensors under 'model.layers.1.mlp.experts'", layer=1)


def test_wrong_shape(tmp_path):
    t = _float_tensors()
    t[f"{P}.1.down_proj.weight"] = t[f"{P}.1.down_proj.weight"][:, : I // 2]
    _raises(_save(tmp_path / "m.safetensors", t), rf"tensor {P}\.1\.down_proj\.weight in .*m\.safetensors: shape")
    t, _ = _stacked_tensors()
    t[f"{P}.gate_up_proj_scales"] = t[f"{P}.gate_up_proj_scales"][:, :I]
    _raises(_save(tmp_path / "s.safetensors", t), rf"tensor {P}\.gate_up_proj_scales in .*: shape")
    t, _ = _expert_mx_tensors()
    t[f"{P}.0.up_proj.weight_blocks"] = t[f"{P}.0.up_proj.weight_blocks"].flatten(-2)
    _raises(_save(tmp_path / "e.safetensors", t), rf"tensor {P}\.0\.up_proj\.weight_blocks in .*: shape")


def test_wrong_dtype(tmp_path):
    t = _float_tensors()
    t[f"{P}.0.gate_proj.weight"] = t[f"{P}.0.gate_proj.weight"].to(torch.float8_e4m3fn)  # FP8 checkpoint
    _raises(_save(tmp_path / "m.safetensors", t), rf"tensor {P}\.0\.gate_proj\.weight in .*: dtype F8_E4M3")
    t, _ = _stacked_tensors()
    t[f"{P}.down_proj_blocks"] = t[f"{P}.down_proj_blocks"].to(torch.int16)
    _raises(_save(tmp_path / "s.safetensors", t), rf"tensor {P}\.down_proj_blocks in .*: dtype I16")


@pytest.mark.parametrize("bias", [f"{P}.1.gate_proj.bias", f"{P}.gate_up_proj_bias", f"{P}.down_proj_bias"])
def test_bias_rejected(tmp_path, bias):
    t = _float_tensors() if ".1." in bias else _stacked_tensors()[0]
    t[bias] = torch.zeros(2 * I)
    _raises(_save(tmp_path / "m.safetensors", t), rf"tensor {bias} in .* is a bias")


@pytest.mark.parametrize("cfg,match", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"text_config": {"hidden_act": "relu"}}, "hidden_act='relu'"),
    ({"hidden_act": "silu", "swiglu_limit": 7.0}, "swiglu_limit=7.0"),
    ({"hidden_act": "silu", "alpha": 1.702}, "alpha=1.702"),
    ({"hidden_act": "silu", "num_local_experts": 8}, "num_local_experts=8, but num_experts=4"),
    ({"n_routed_experts": 2}, "n_routed_experts=2"),
])
def test_config_rejected(tmp_path, cfg, match):
    f = _save(tmp_path / "m.safetensors", _float_tensors())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _raises(f, match)
    load_experts(f, check_config=False, **KW)


def test_config_accepted(tmp_path):
    f = _save(tmp_path / "m.safetensors", _float_tensors())
    (tmp_path / "config.json").write_text(json.dumps({"hidden_act": "silu", "n_routed_experts": E,
                                                      "swiglu_limit": None}))
    load_experts(f, **KW)


def test_expert_count_mismatch(tmp_path):
    f = _save(tmp_path / "m.safetensors", _float_tensors())
    _raises(f, rf"experts up to id 3 \(e\.g\. tensor {P}\.3\..*\), but num_experts=8", num_experts=8)
    _raises(f, rf"experts up to id 3 \(e\.g\. tensor {P}\.3\..*\), but num_experts=3", num_experts=3,
            experts=range(0, 3))
    t, _ = _stacked_tensors()
    f = _save(tmp_path / "s.safetensors", t)
    _raises(f, rf"tensor {P}\.gate_up_proj_blocks in .*: \[4\] experts .* but num_experts=8", num_experts=8)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nonfinite_float_weights(tmp_path, bad):
    t = _float_tensors()
    t[f"{P}.3.down_proj.weight"][10, 20] = bad
    f = _save(tmp_path / "m.safetensors", t)
    _raises(f, rf"tensor {P}\.3\.down_proj\.weight in .*: 1 non-finite values \(first at \[10, 20\]\)")


def test_nan_scale_bytes(tmp_path):
    t, _ = _stacked_tensors()
    t[f"{P}.gate_up_proj_scales"][2, 3, 4] = 0xFF
    _raises(_save(tmp_path / "s.safetensors", t), rf"tensor {P}\.gate_up_proj_scales in .*0xFF")
    load_experts(tmp_path / "s.safetensors", experts=range(0, 2), **KW)  # rank 0 never reads expert 2
    t, _ = _expert_mx_tensors()
    t[f"{P}.1.down_proj.weight_scales"][0, 0] = 0xFF
    _raises(_save(tmp_path / "e.safetensors", t), rf"tensor {P}\.1\.down_proj\.weight_scales in .*0xFF")


def test_mixed_layouts_rejected(tmp_path):
    t = _float_tensors()
    t.update(_stacked_tensors()[0])
    _raises(_save(tmp_path / "m.safetensors", t), "mix several layouts")


def test_bad_arguments(tmp_path):
    f = _save(tmp_path / "m.safetensors", _float_tensors())
    with pytest.raises(ValueError, match="sub-range"):
        load_experts(f, experts=range(3, 5), **KW)
    with pytest.raises(ValueError, match="gate_up_order"):
        load_experts(f, gate_up_order="odd", **KW)
    _raises(tmp_path / "nope.safetensors", "does not exist")
