"""Argument checks for dispatch/combine. Pure Python on DevArray descriptors (no GPU needed), so
every error names the argument and is raised before anything is launched or any state changes."""
from __future__ import annotations

from dataclasses import dataclass

from pathlib import Path

from ._arrays import DevArray, check
from ._native import shared_constants

# FP32 activation scales per row: one per SCALE_GROUP channels (moe_common/constants.cuh)
SCALE_GROUP = shared_constants(str(Path(__file__).resolve().parent))["kScaleGroup"]


@dataclass
class Config:
    hidden: int
    topk: int
    max_tokens: int
    num_experts: int
    num_local_experts: int
    max_m: int
    device: int


def _aligned(a: DevArray, name: str, nbytes: int = 16):
    if a.ptr % nbytes and min(a.shape, default=1) > 0:
        raise ValueError(f"{name}: data pointer must be {nbytes}-byte aligned (got 0x{a.ptr:x}); "
                         "pass a fresh contiguous tensor, not an offset slice")


def _device(a: DevArray, name: str, cfg: Config):
    if a.device != cfg.device:
        raise ValueError(f"{name}: on device {a.device}, but the buffer lives on device {cfg.device}")


def check_dispatch(cfg: Config, x: DevArray, scales: DevArray, idx: DevArray, w: DevArray | None,
                   layout: str) -> tuple[int, int]:
    """Returns (num_tokens, idx_bytes)."""
    if layout not in ("contiguous", "masked"):
        raise ValueError(f"layout: expected 'contiguous' or 'masked', got {layout!r}")
    check(x, "x_fp8", ("fp8", "u8"), ndim=2, contiguous=True)
    T, H = x.shape
    if H != cfg.hidden:
        raise ValueError(f"x_fp8: hidden size {H} != the buffer's hidden {cfg.hidden}")
    if T > cfg.max_tokens:
        raise ValueError(f"x_fp8: {T} tokens > max_tokens_per_rank {cfg.max_tokens} of the buffer")
    check(scales, "x_scales", ("f32",), ndim=2, contiguous=True)
    if scales.shape != (T, H // SCALE_GROUP):
        raise ValueError(f"x_scales: expected shape {(T, H // SCALE_GROUP)} (one FP32 per token per {SCALE_GROUP} channels), "
                         f"got {scales.shape}")
    check(idx, "topk_idx", ("i32", "i64"), ndim=2, contiguous=True)
    if idx.shape != (T, cfg.topk):
        raise ValueError(f"topk_idx: expected shape {(T, cfg.topk)}, got {idx.shape}")
    arrs = [(x, "x_fp8"), (scales, "x_scales"), (idx, "topk_idx")]
    if w is not None:
        check(w, "topk_w", ("f32",), ndim=2, contiguous=True)
        if w.shape != (T, cfg.topk):
            raise ValueError(f"topk_w: expected shape {(T, cfg.topk)}, got {w.shape}")
        arrs.append((w, "topk_w"))
    for a, n in arrs:
        _device(a, n, cfg)
    _aligned(x, "x_fp8")
    _aligned(scales, "x_scales")
    _aligned(idx, "topk_idx", idx.itemsize)
    if w is not None:
        _aligned(w, "topk_w")
    return T, idx.itemsize


def check_combine(cfg: Config, expert_out: DevArray, masked: bool, num_tokens: int,
                  w: DevArray | None, out: DevArray | None) -> int:
    """Returns the number of rows of expert_out."""
    check(expert_out, "expert_out", ("bf16", "u16"), contiguous=True)
    if masked:
        want = (cfg.num_local_experts, cfg.max_m, cfg.hidden)
        if tuple(expert_out.shape) != want:
            raise ValueError(f"expert_out: masked layout expects shape {want}, got {expert_out.shape}")
        rows = want[0] * want[1]
    else:
        if len(expert_out.shape) != 2 or expert_out.shape[1] != cfg.hidden:
            raise ValueError(f"expert_out: expected shape [pool_rows, {cfg.hidden}], got {expert_out.shape}")
        rows = expert_out.shape[0]
    _device(expert_out, "expert_out", cfg)
    _aligned(expert_out, "expert_out")
    if w is not None:
        check(w, "topk_w", ("f32",), ndim=2, contiguous=True)
        if w.shape != (num_tokens, cfg.topk):
            raise ValueError(f"topk_w: expected shape {(num_tokens, cfg.topk)} (the dispatch's tokens), "
                             f"got {w.shape}")
        _device(w, "topk_w", cfg)
        _aligned(w, "topk_w")
    if out is not None:
        check(out, "out", ("bf16", "u16"), ndim=2, contiguous=True)
        if out.shape != (num_tokens, cfg.hidden):
            raise ValueError(f"out: expected shape {(num_tokens, cfg.hidden)}, got {out.shape}")
        _device(out, "out", cfg)
        _aligned(out, "out")
    return rows


def check_buffer_args(num_ranks: int, num_experts: int, hidden: int, topk: int, max_tokens: int,
                      block_m: int, backend: str):
    if backend not in ("torch", "nvshmem", "ipc"):
        raise ValueError(f"backend: expected 'torch', 'nvshmem' or 'ipc' (several ranks per GPU), got {backend!r}")
    if num_experts < num_ranks or num_experts % num_ranks:
        raise ValueError(f"num_experts: {num_experts} must be a positive multiple of the rank count {num_ranks}")
    if hidden <= 0 or hidden % SCALE_GROUP:
        raise ValueError(f"hidden: {hidden} must be a positive multiple of {SCALE_GROUP} (one FP8 scale per "
                         f"{SCALE_GROUP} channels)")
    if not 1 <= topk <= 32:
        raise ValueError(f"topk: {topk} must be in [1, 32]")
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_rank: {max_tokens} must be >= 1")
    if not 1 <= block_m <= 4096:
        raise ValueError(f"block_m: {block_m} must be in [1, 4096]")
    if num_ranks > 64:
        raise ValueError(f"group size {num_ranks} > 64 ranks is not supported")
