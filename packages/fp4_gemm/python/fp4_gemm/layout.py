"""Packed-weight layout for the kernels (constants read from include/fp4_gemm/layout.cuh).

`pack_weights(codes, shift)` turns the logical transformed weights (fp4_gemm.numerics
.transform_weights) into the chunk order the GEMM mainloop streams: per (group, 128-row block,
128-K block) one chunk of two warpgroup sub-chunks, each [k32 step][thread][8 code bytes] followed
by [warp][row quad][k32 step][2] shift bytes. See layout.cuh for the bit-level contract.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch

from ._native import header_constants, package_header, shared_constants

__all__ = ["constants", "header_constants", "pack_weights", "emulate_decode"]


@lru_cache(maxsize=1)
def constants() -> dict:
    """The packed-layout constants of layout.cuh, with the shared granularities it uses (kScaleGroup)."""
    here = str(Path(__file__).resolve().parent)
    return header_constants(package_header(here, "fp4_gemm/layout.cuh"), shared_constants(here))


def pack_weights(codes: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """codes uint8 [G, N, K/2] (element 2j in the low nibble), shift int8 [G, N, K/32]
    -> packed uint8 [G, N/128, K/128, kBlockChunkBytes]."""
    C = constants()
    if codes.dim() != 3 or shift.dim() != 3:
        raise ValueError(f"codes/shift: expected [G, N, K/2] / [G, N, K/32], got {tuple(codes.shape)} / {tuple(shift.shape)}")
    G, N, K2 = codes.shape
    K = 2 * K2
    if N % C["kBlockRows"] or K % C["kBlockK"]:
        raise ValueError(f"weights: N={N} must be a multiple of {C['kBlockRows']} and K={K} of {C['kBlockK']}")
    if tuple(shift.shape) != (G, N, K // C["kGroupK"]):
        raise ValueError(f"shift: expected shape {(G, N, K // C['kGroupK'])}, got {tuple(shift.shape)}")
    if shift.numel() and not (C["kMinShift"] <= int(shift.min()) and int(shift.max()) <= C["kMaxShift"]):
        raise ValueError(f"shift: values must lie in [{C['kMinShift']}, {C['kMaxShift']}] (the decoder's table)")
    NB, KB, WG = N // C["kBlockRows"], K // C["kBlockK"], C["kWarpgroupsPerBlock"]
    S = C["kStepsPerBlockK"]
    out = torch.empty((G, NB, KB, WG, C["kWgChunkBytes"]), dtype=torch.uint8, device=codes.device)
    for g in range(G):  # one group at a time bounds the int32 temporaries
        nib = torch.stack((codes[g] & 0xF, codes[g] >> 4), dim=-1).reshape(N, K).to(torch.int32)
        # rows: [NB, WG, warp(4), h8(2), quad(8)]; K: [KB, step(4), half(2), l4(4), i(4)]
        v = nib.reshape(NB, WG, 4, 2, 8, KB, S, 2, 4, 4)
        v = v.permute(0, 5, 1, 6, 2, 4, 8, 3, 7, 9)  # [NB, KB, WG, step, warp, quad, l4, h8, half, i]
        mag, sgn = v & 7, v >> 3
        i = torch.arange(4, dtype=torch.int32, device=codes.device)
        word = (mag[..., 0, :] << (4 * i)).sum(-1) + (mag[..., 1, :] << (4 * i + 16)).sum(-1)
        word = word + (sgn[..., 0, :] << (8 * i + 7)).sum(-1) + (sgn[..., 1, :] << (8 * i + 3)).sum(-1)
        # word: [NB, KB, WG, step, warp, quad, l4, h8] -> little-endian bytes
        cb = torch.stack([(word >> (8 * b)) & 0xFF for b in range(4)], dim=-1).to(torch.uint8)
        out[g, :, :, :, : C["kCodeBytes"]] = cb.reshape(NB, KB, WG, C["kCodeBytes"])
        sh = shift[g].reshape(NB, WG, 4, 2, 8, KB, S).permute(0, 5, 1, 2, 4, 6, 3)  # [NB,KB,WG,warp,quad,step,h8]
        out[g, :, :, :, C["kCodeBytes"]:] = sh.contiguous().view(torch.uint8).reshape(NB, KB, WG, C["kShiftBytes"])
    return out.reshape(G, NB, KB, C["kBlockChunkBytes"])


def emulate_decode(packed: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """What the kernel's decoder produces from `packed`, as float32 [G, N, K] (E4M3 values, before
    row scales): a bit-level model of decode.cuh (prmt through the per-shift LUT, masked sign ORs)
    and of the register-fragment order, so layout bugs show up without a GPU."""
    C = constants()
    G = packed.shape[0]
    NB, KB, WG, S = N // C["kBlockRows"], K // C["kBlockK"], C["kWarpgroupsPerBlock"], C["kStepsPerBlockK"]
    p = packed.reshape(G, NB, KB, WG, C["kWgChunkBytes"])
    cb = p[..., : C["kCodeBytes"]].reshape(G, NB, KB, WG, S, 4, 8, 4, 2, 4).to(torch.int64)
    word = cb[..., 0] | (cb[..., 1] << 8) | (cb[..., 2] << 16) | (cb[..., 3] << 24)  # [.., step, warp, quad, l4, h8]
    sh = p[..., C["kCodeBytes"]:].reshape(G, NB, KB, WG, 4, 8, S, 2).view(torch.int8).to(torch.int64)
    sh = sh.permute(0, 1, 2, 3, 6, 4, 5, 7)[..., None, :]  # [.., step, warp, quad, 1(l4), h8]
    from .numerics import fp8_e4m3_lut
    lut = torch.stack([fp8_e4m3_lut(s) for s in range(C["kMinShift"], C["kMaxShift"] + 1)]).to(
        device=packed.device, dtype=torch.int64)
    entries = lut[sh - C["kMinShift"]].expand(*word.shape, 8)  # [..., 8]
    i = torch.arange(4, device=packed.device)
    out_bytes = []
    for half in range(2):
        sel = (word[..., None] >> (4 * i + 16 * half)) & 7                  # magnitude index per byte
        mag = torch.gather(entries, -1, sel)
        sign = (word[..., None] >> (8 * i + (7 if half == 0 else 3))) & 1
        out_bytes.append(mag | (sign << 7))
    b = torch.stack(out_bytes, dim=-2)  # [G,NB,KB,WG,step,warp,quad,l4,h8,half,i]
    vals = _e4m3_decode(b)
    # -> rows [NB, WG, warp, h8, quad], K [KB, step, half, l4, i]
    vals = vals.permute(0, 1, 3, 5, 8, 6, 2, 4, 9, 7, 10)
    return vals.reshape(G, N, K)


def _e4m3_decode(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
