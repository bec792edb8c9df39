"""Load one rank's experts of one MoE layer from safetensors checkpoints (DESIGN.md section 1).

`load_experts(paths, num_experts=, hidden=, intermediate=, experts=range(...))` reads only the
tensors of the experts `experts` (with a `*.safetensors.index.json`, only the files that hold them),
checks that the checkpoint's MLP is the one the layer computes, and returns them transformed for
the kernel (`fp4_gemm.numerics.transform_weights`, W1 gate/up rows interleaved).

Layouts, detected from the tensor names under `prefix` (default
`model.layers.{layer}.mlp.experts`); E = num_experts, H = hidden, I = intermediate:

1. Per-expert floating point (DeepSeek / Qwen / Mixtral naming), quantised on load with
   `quantize_mxfp4` (OCP MX rule):
       {prefix}.{e}.gate_proj.weight   BF16/FP16/FP32 [I, H]
       {prefix}.{e}.up_proj.weight     BF16/FP16/FP32 [I, H]
       {prefix}.{e}.down_proj.weight   BF16/FP16/FP32 [H, I]
   (Mixtral's names w1 = gate, w3 = up, w2 = down are accepted as well.)
2. Per-expert MXFP4 (bit-exact, no re-quantisation):
       {prefix}.{e}.{gate_proj,up_proj}.weight_blocks   uint8 [I, H/32, 16]
       {prefix}.{e}.{gate_proj,up_proj}.weight_scales   uint8 [I, H/32]
       {prefix}.{e}.down_proj.weight_blocks             uint8 [H, I/32, 16]
       {prefix}.{e}.down_proj.weight_scales             uint8 [H, I/32]
3. Stacked MXFP4 (the gpt-oss layout; bit-exact):
       {prefix}.gate_up_proj_blocks   uint8 [E, 2I, H/32, 16]
       {prefix}.gate_up_proj_scales   uint8 [E, 2I, H/32]
       {prefix}.down_proj_blocks      uint8 [E, H, I/32, 16]
       {prefix}.down_proj_scales      uint8 [E, H, I/32]
   Row order of gate_up: `gate_up_order="halves"` (default: rows 0..I-1 gate, I..2I-1 up) or
   "interleaved" (row 2i gate i, row 2i+1 up i, as gpt-oss stores it).

MXFP4 mapping: a `*_blocks` row [K/32, 16] flattened is [K/2] bytes, two E2M1 codes per byte, the
low nibble the even element, code bit 3 the sign: exactly fp4_gemm's `codes` uint8 [N, K/2].
A `*_scales` byte s is the UE8M0 biased exponent (value = e2m1 * 2^(s-127)): exactly fp4_gemm's
`exps` uint8 [N, K/32]. Both are passed to `transform_weights` unchanged (0xFF, the E8M0 NaN, is
rejected).
"""
from __future__ import annotations

import json
import os
import re
import warnings
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence, Union

import torch
try:  # a dependency of the package; guarded so that `import megamoe` never fails on it
    from safetensors import safe_open
except ImportError:  # pragma: no cover
    safe_open = None

from fp4_gemm.numerics import (E8M0_NAN, MX_GROUP, TransformedWeights, quantize_mxfp4,
                               transform_weights)

__all__ = ["load_experts", "ExpertWeights", "CheckpointError", "SUPPORTED_ACTIVATIONS"]

PathLike = Union[str, Path]

SUPPORTED_ACTIVATIONS = ("silu", "swiglu")
# config.json keys that declare a SwiGLU variant the layer does not compute (gpt-oss: gate clamp +
# up clamp + sigmoid(alpha * gate) + (up + 1)).
_VARIANT_KEYS = ("swiglu_limit", "swiglu_alpha", "glu_alpha", "activation_alpha", "alpha")
_ACT_KEYS = ("hidden_act", "hidden_activation", "activation_function", "mlp_activation")
_EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
_FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
_BLOCK_BYTES = MX_GROUP // 2  # 16 bytes = 32 E2M1 codes per block
# (gate, up, down) per-expert module names
_EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as this layer's experts (the message names the tensor)."""


from .weights import ExpertWeights  # noqa: E402


# --- files ----------------------------------------------------------------------------------------

class _Checkpoint:
    """Tensor name -> file map; files opened lazily (one handle each) and only when read."""

    def __init__(self, paths, stack: ExitStack):
        self._stack = stack
        self._handles: dict[Path, object] = {}
        self.where: dict[str, Path] = {}
        self.dirs: list[Path] = []
        items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        if not items:
            raise CheckpointError("no checkpoint paths given")
        for p in map(Path, items):
            if p.is_dir():
                self._add_dir(p)
            elif p.name.endswith(".json"):
                self._add_index(p)
            elif p.is_file():
                self._add_file(p)
            else:
                raise CheckpointError(f"checkpoint path {p} does not exist")

    def _note_dir(self, d: Path) -> None:
        if d not in self.dirs:
            self.dirs.append(d)

    def _add(self, name: str, path: Path) -> None:
        if name in self.where and self.where[name] != path:
            raise CheckpointError(f"tensor {name} is in two files: {self.where[name]} and {path}")
        self.where[name] = path

    def _add_dir(self, d: Path) -> None:
        indexes = sorted(d.glob("*.safetensors.index.json"))
        if len(indexes) > 1:
            raise CheckpointError(f"{d} holds several index files ({[i.name for i in indexes]}); pass one")
        if indexes:
            self._add_index(indexes[0])
            return
        files = sorted(d.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{d} holds no *.safetensors files")
        for f in files:
            self._add_file(f)

    def _add_index(self, p: Path) -> None:
        try:
            weight_map = json.loads(p.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{p}: not a safetensors index with a weight_map ({exc})") from exc
        self._note_dir(p.parent)
        for name, fname in weight_map.items():
            self._add(name, p.parent / fname)

    def _add_file(self, p: Path) -> None:
        # Without an index the names come from the file's header (safe_open reads only the header).
        self._note_dir(p.parent)
        for name in self._open(p).keys():
            self._add(name, p)

    def _open(self, path: Path):
        if path not in self._handles:
            try:
                if safe_open is None:
                    raise ImportError("megamoe.load_experts needs the `safetensors` package (pip install safetensors)")
                self._handles[path] = self._stack.enter_context(safe_open(str(path), framework="pt", device="cpu"))
            except Exception as exc:  # safetensors raises its own error types
                raise CheckpointError(f"cannot open {path}: {exc}") from exc
        return self._handles[path]

    def file_of(self, name: str) -> Path:
        if name not in self.where:
            raise CheckpointError(f"missing tensor {name} (not in {self._describe_files()})")
        return self.where[name]

    def _describe_files(self) -> str:
        files = sorted({str(p) for p in self.where.values()})
        return ", ".join(files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "") or "any file"

    def slice(self, name: str):
        path = self.file_of(name)
        return self._open(path).get_slice(name), path


# --- checks ---------------------------------------------------------------------------------------

def _check_config(dirs: Sequence[Path], num_experts: int) -> None:
    for d in dirs:
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            continue
        try:
            cfg = json.loads(cfg_path.read_text())
        except ValueError as exc:
            raise CheckpointError(f"{cfg_path}: not valid JSON ({exc})") from exc
        scopes = [cfg] + [cfg[k] for k in ("text_config", "language_config") if isinstance(cfg.get(k), dict)]
        for scope in scopes:
            for key in _ACT_KEYS:
                act = scope.get(key)
                if act is not None and str(act).lower() not in SUPPORTED_ACTIVATIONS:
                    raise CheckpointError(
                        f"{cfg_path}: {key}={act!r}, but the layer computes silu(gate) * up "
                        f"(supported: {', '.join(SUPPORTED_ACTIVATIONS)}); pass check_config=False to override")
            for key in _VARIANT_KEYS:
                if scope.get(key) is not None:
                    raise CheckpointError(
                        f"{cfg_path}: {key}={scope[key]!r} declares a clamped/alpha SwiGLU variant "
                        "(gpt-oss style), not the plain silu(gate) * up the layer computes; "
                        "pass check_config=False to override")
            for key in _EXPERT_COUNT_KEYS:
                n = scope.get(key)
                if isinstance(n, int) and n != num_experts:
                    raise CheckpointError(f"{cfg_path}: {key}={n}, but num_experts={num_experts}")


def _check_no_bias(names: Iterable[str], prefix: str, where: dict) -> None:
    for name in sorted(names):
        if name.startswith(prefix + ".") and (name.endswith("_bias") or name.endswith(".bias")):
            raise CheckpointError(f"tensor {name} in {where[name]} is a bias; the layer's experts have none")


def _check_meta(sl, name: str, path: Path, shape: tuple, dtypes: Iterable[str]) -> None:
    got_dtype = sl.get_dtype()
    if got_dtype not in dtypes:
        raise CheckpointError(f"tensor {name} in {path}: dtype {got_dtype}, expected {' or '.join(dtypes)}")
    got = tuple(sl.get_shape())
    if got != shape:
        raise CheckpointError(f"tensor {name} in {path}: shape {list(got)}, expected {list(shape)}")


def _check_finite(t: torch.Tensor, name: str, path: Path) -> None:
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        first = [int(i) for i in bad.nonzero()[0]]
        raise CheckpointError(f"tensor {name} in {path}: {int(bad.sum())} non-finite values (first at {first})")


def _check_scales(t: torch.Tensor, name: str, path: Path) -> None:
    bad = t == E8M0_NAN
    if bool(bad.any()):
        first = [int(i) for i in bad.nonzero()[0]]
        raise CheckpointError(f"tensor {name} in {path}: {int(bad.sum())} scale bytes are 0xFF "
                              f"(NaN in UE8M0; first at {first})")


# --- layouts --------------------------------------------------------------------------------------

def _detect(names: Iterable[str], prefix: str) -> tuple[str, tuple[str, str, str] | None, set[int]]:
    """-> (layout, (gate, up, down) names or None, expert ids seen)."""
    p = re.escape(prefix)
    per_expert = re.compile(rf"^{p}\.(\d+)\.(\w+)\.(weight|weight_blocks)$")
    found: dict[str, set] = {}
    ids: set[int] = set()
    for name in names:
        if name in (f"{prefix}.gate_up_proj_blocks", f"{prefix}.down_proj_blocks"):
            found.setdefault("stacked_mxfp4", set()).add(None)
            continue
        m = per_expert.match(name)
        if not m:
            continue
        for trio in _EXPERT_NAMES:
            if m.group(2) in trio:
                layout = "expert_mxfp4" if m.group(3) == "weight_blocks" else "expert_float"
                found.setdefault(layout, set()).add(trio)
                ids.add(int(m.group(1)))
    if not found:
        raise CheckpointError(
            f"no expert tensors under {prefix!r}: expected {prefix}.{{e}}.gate_proj.weight (BF16/FP16/FP32), "
            f"{prefix}.{{e}}.gate_proj.weight_blocks (MXFP4) or {prefix}.gate_up_proj_blocks (stacked MXFP4)")
    if len(found) > 1 or any(len(v) > 1 for v in found.values()):
        raise CheckpointError(f"tensors under {prefix!r} mix several layouts ({sorted(found)}); cannot tell which to load")
    layout, trios = next(iter(found.items()))
    return layout, next(iter(trios)), ids


def _load_float(ck: _Checkpoint, name: str, shape: tuple, device) -> tuple[torch.Tensor, torch.Tensor]:
    sl, path = ck.slice(name)
    _check_meta(sl, name, path, shape, tuple(_FLOAT_DTYPES))
    t = sl[:].to(device)
    _check_finite(t, name, path)
    return quantize_mxfp4(t)


def _load_mx(ck: _Checkpoint, blocks_name: str, scales_name: str, rows: int, k: int,
             index=None, lead: tuple = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [..., rows, k/2], exps uint8 [..., rows, k/32]); `index` slices dim 0 of a
    stacked tensor whose leading dims are `lead`."""
    bsl, bpath = ck.slice(blocks_name)
    _check_meta(bsl, blocks_name, bpath, lead + (rows, k // MX_GROUP, _BLOCK_BYTES), ("U8",))
    ssl, spath = ck.slice(scales_name)
    _check_meta(ssl, scales_name, spath, lead + (rows, k // MX_GROUP), ("U8",))
    if index is not None:  # only this expert's bytes are read
        blocks, scales = bsl[index:index + 1][0], ssl[index:index + 1][0]
    else:
        blocks, scales = bsl[:], ssl[:]
    _check_scales(scales, scales_name, spath)
    return blocks.flatten(-2).contiguous(), scales.contiguous()


class _Filler:
    """Preallocated stacked TransformedWeights, filled one expert at a time."""

    def __init__(self):
        self.parts = None
        self.n_clamped = 0

    def put(self, i: int, n: int, tw: TransformedWeights) -> None:
        if self.parts is None:
            self.parts = [torch.empty((n,) + t.shape, dtype=t.dtype, device=t.device)
                          for t in (tw.codes, tw.shift, tw.row_scale)]
            self.interleave = tw.gate_up_interleave
        for dst, src in zip(self.parts, (tw.codes, tw.shift, tw.row_scale)):
            dst[i] = src
        self.n_clamped += tw.n_clamped

    def result(self) -> TransformedWeights:
        return TransformedWeights(*self.parts, self.n_clamped, self.interleave)


def _halves(t: torch.Tensor) -> torch.Tensor:
    """Rows gate0, up0, gate1, up1, ... -> gate rows, then up rows (dim -2)."""
    return torch.cat([t[..., 0::2, :], t[..., 1::2, :]], dim=-2)


# --- entry point ----------------------------------------------------------------------------------

def load_experts(paths: PathLike | Sequence[PathLike], *, num_experts: int, hidden: int, intermediate: int,
                 experts: range | None = None, prefix: str = "model.layers.{layer}.mlp.experts",
                 layer: int = 0, device="cpu", gate_up_order: str = "halves",
                 check_config: bool = True, warn_clamped: bool = True) -> ExpertWeights:
    """Load experts `experts` (global ids, contiguous; default all) of one layer (module docstring
    lists the layouts). `paths`: a .safetensors file, a list of them, a directory (its
    *.safetensors.index.json if it has one, else all its *.safetensors) or an index file.

    Raises CheckpointError (a ValueError, naming the tensor and its file) for a missing tensor, a
    wrong shape or dtype, biases, an activation other than silu/swiglu (or gpt-oss's clamped/alpha
    variant) in a config.json next to the files, an expert count other than `num_experts`, NaN/inf
    in floating-point weights, and 0xFF (NaN) scale bytes. The number of MXFP4 groups the transform
    clamped is `result.w1.n_clamped + result.w2.n_clamped` (warned when > 0 unless warn_clamped=False).
    """
    E, H, I = num_experts, hidden, intermediate
    experts = range(E) if experts is None else experts
    if not isinstance(experts, range) or experts.step != 1 or not 0 <= experts.start < experts.stop <= E:
        raise ValueError(f"experts must be a non-empty contiguous sub-range of range({E}), got {experts}")
    if H % MX_GROUP or I % MX_GROUP:
        raise ValueError(f"hidden ({H}) and intermediate ({I}) must be multiples of {MX_GROUP}")
    if gate_up_order not in ("halves", "interleaved"):
        raise ValueError(f"gate_up_order must be 'halves' or 'interleaved', got {gate_up_order!r}")
    prefix = prefix.format(layer=layer)
    n = len(experts)
    w1, w2 = _Filler(), _Filler()
    with ExitStack() as stack:
        ck = _Checkpoint(paths, stack)
        if check_config:
            _check_config(ck.dirs, E)
        _check_no_bias(ck.where, prefix, ck.where)
        layout, trio, ids = _detect(ck.where, prefix)
        if layout == "stacked_mxfp4":
            for base in ("gate_up_proj", "down_proj"):
                sl, path = ck.slice(f"{prefix}.{base}_blocks")
                if sl.get_shape()[:1] != [E]:
                    raise CheckpointError(f"tensor {prefix}.{base}_blocks in {path}: {sl.get_shape()[:1]} "
                                          f"experts (shape {sl.get_shape()}), but num_experts={E}")
            for i, e in enumerate(experts):
                c1, x1 = _load_mx(ck, f"{prefix}.gate_up_proj_blocks", f"{prefix}.gate_up_proj_scales",
                                  2 * I, H, index=e, lead=(E,))
                if gate_up_order == "interleaved":
                    c1, x1 = _halves(c1), _halves(x1)
                c2, x2 = _load_mx(ck, f"{prefix}.down_proj_blocks", f"{prefix}.down_proj_scales",
                                  H, I, index=e, lead=(E,))
                w1.put(i, n, transform_weights(c1.to(device), x1.to(device), gate_up_interleave=True))
                w2.put(i, n, transform_weights(c2.to(device), x2.to(device)))
        else:
            gate, up, down = trio
            top = max(ids)
            if top + 1 != E:
                some = next(k for k in sorted(ck.where) if k.startswith(f"{prefix}.{top}."))
                raise CheckpointError(f"checkpoint has experts up to id {top} (e.g. tensor {some} in "
                                      f"{ck.where[some]}), but num_experts={E}")
            for i, e in enumerate(experts):
                pe = f"{prefix}.{e}"
                if layout == "expert_float":
                    cg, xg = _load_float(ck, f"{pe}.{gate}.weight", (I, H), device)
                    cu, xu = _load_float(ck, f"{pe}.{up}.weight", (I, H), device)
                    c2, x2 = _load_float(ck, f"{pe}.{down}.weight", (H, I), device)
                else:
                    cg, xg = _load_mx(ck, f"{pe}.{gate}.weight_blocks", f"{pe}.{gate}.weight_scales", I, H)
                    cu, xu = _load_mx(ck, f"{pe}.{up}.weight_blocks", f"{pe}.{up}.weight_scales", I, H)
                    c2, x2 = _load_mx(ck, f"{pe}.{down}.weight_blocks", f"{pe}.{down}.weight_scales", H, I)
                c1 = torch.cat([cg, cu]).to(device)
                x1 = torch.cat([xg, xu]).to(device)
                w1.put(i, n, transform_weights(c1, x1, gate_up_interleave=True))
                w2.put(i, n, transform_weights(c2.to(device), x2.to(device)))
    out = ExpertWeights(num_experts=E, experts=experts, w1=w1.result(), w2=w2.result())
    n_clamped = w1.n_clamped + w2.n_clamped
    if n_clamped and warn_clamped:
        warnings.warn(f"load_experts({prefix}, experts {experts.start}..{experts.stop - 1}): the MXFP4 transform "
                      f"clamped {w1.n_clamped} W1 and {w2.n_clamped} W2 groups (shift below the exact range; "
                      "lossy; all-zero groups are exact and not counted)", stacklevel=2)
    return out
