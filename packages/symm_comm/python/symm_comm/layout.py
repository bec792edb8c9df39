"""The buffer layout, computed by the library's `symm_layout_init` (one source of truth:
include/symm_comm/layout.cuh) and exposed as a ctypes struct + region table."""
from __future__ import annotations

import ctypes

from ._lib import LAYOUT_VERSION, LIB, SymmLayout, check_abi

REGIONS = ("signals", "state", "meta_count", "meta_slots", "meta_map", "stage_x", "stage_s", "stage_w", "kmask", "meta_scan",
           "id_slot", "cmb_map", "cmb_hist",
           "cmb_order", "cmb_arr", "src_counts", "exp_counts", "exp_offsets", "arrivals", "row_src", "pool_x", "pool_s", "pool_w",
           "combine", "cmb_in")


def compute_layout(num_ranks: int, rank: int, num_experts: int, hidden: int, topk: int, max_tokens: int,
                   block_m: int = 128, pool_rows: int = 0, max_m: int = 0, cmb_in_rows: int = 0) -> SymmLayout:
    check_abi()
    L = SymmLayout()
    LIB.call("symm_layout_init", ctypes.byref(L), num_ranks, rank, num_experts, hidden, topk, max_tokens,
             block_m, pool_rows, max_m, cmb_in_rows)
    if L.version != LAYOUT_VERSION:
        raise RuntimeError(f"symm_comm: layout version {L.version} from the library, the Python mirror is "
                           f"version {LAYOUT_VERSION} — rebuild libsymm_comm.so")
    return L


def region_bytes(L: SymmLayout) -> dict:
    """Bytes of every region (including alignment padding up to the next region)."""
    offs = [(r, getattr(L, "off_" + r)) for r in REGIONS]
    out = {}
    for i, (r, o) in enumerate(offs):
        end = offs[i + 1][1] if i + 1 < len(offs) else L.total_bytes
        out[r] = end - o
    return out


def describe(L: SymmLayout) -> str:
    rb = region_bytes(L)
    big = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in rb.items() if v >= 2**20)
    return (f"symm_comm buffer: {L.total_bytes / 2**20:.1f} MiB per rank (R={L.num_ranks}, E={L.num_experts}, "
            f"H={L.hidden}, K={L.topk}, T={L.max_tokens}, pool {L.pool_rows} rows, block_m {L.block_m}, "
            f"max_m {L.max_m}; {big})")
