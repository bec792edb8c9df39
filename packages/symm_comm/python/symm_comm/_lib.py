"""ctypes signatures of libsymm_comm.so (csrc/symm_api.h) and the SymmLayout mirror (layout.cuh)."""
from __future__ import annotations

import ctypes
from pathlib import Path

from ._native import NativeLib

c_i64, c_int, c_vp, c_u64 = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64

LAYOUT_VERSION = 10
ERR_WORDS = 8


class SymmLayout(ctypes.Structure):
    """Mirror of `struct SymmLayout` (include/symm_comm/layout.cuh). Checked against the library's
    sizeof at load time (symm_layout_size)."""
    _fields_ = [(n, ctypes.c_int64) for n in (
        "total_bytes", "pool_rows", "off_signals", "off_state", "off_meta_count", "off_meta_slots",
        "off_stage_x", "off_stage_s", "off_stage_w", "off_kmask", "off_meta_scan", "off_cmb_hist", "off_cmb_order", "off_cmb_arr",
        "off_src_counts", "off_exp_counts",
        "off_exp_offsets", "off_arrivals", "off_row_src", "off_pool_x", "off_pool_s", "off_pool_w",
        "off_combine", "off_id_slot", "off_meta_map", "meta_count_half", "meta_slots_half", "stage_x_half", "stage_s_half",
        "stage_w_half", "combine_half", "cmb_arr_half", "meta_map_half", "off_cmb_map", "off_cmb_in",
        "cmb_in_rows")] + [(n, ctypes.c_int32) for n in (
        "num_ranks", "rank", "num_experts", "num_local_experts", "hidden", "topk", "max_tokens",
        "block_m", "max_m", "scale_cols", "num_blocks", "combine_chunk", "num_chunks", "version")]

    def as_dict(self) -> dict:
        return {n: getattr(self, n) for n, _ in self._fields_}


_LP = ctypes.POINTER(SymmLayout)

LIB = NativeLib("symm_comm", Path(__file__).parent, {
    "symm_error_string": ([c_int], ctypes.c_char_p),
    "symm_abi_version": ([], c_int),
    "symm_layout_size": ([], c_int),
    "symm_layout_init": ([_LP, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_i64, c_int, c_i64], c_int),
    "symm_host_words_alloc": ([ctypes.POINTER(ctypes.POINTER(ctypes.c_int32))], c_int),
    "symm_host_words_free": ([ctypes.POINTER(ctypes.c_int32)], c_int),
    "symm_device_sms": ([c_int, ctypes.POINTER(c_int)], c_int),
    "symm_dispatch": ([_LP, c_vp, c_vp, c_vp, c_vp, c_int, c_vp, c_int, c_int, c_int, c_i64,
                       ctypes.POINTER(ctypes.c_int32), c_vp], c_int),
    "symm_combine": ([_LP, c_vp, c_vp, c_i64, c_vp, c_vp, c_int, c_int, c_i64,
                      ctypes.POINTER(ctypes.c_int32), c_vp], c_int),
    "symm_combine_pull": ([_LP, c_vp, c_vp, c_vp, c_int, c_int, c_i64, ctypes.POINTER(ctypes.c_int32), c_vp], c_int),
    "symm_reset_state": ([_LP, c_vp, c_u64, c_u64, c_vp], c_int),
}, error_fn="symm_error_string", abi=("symm_abi_version", 3))  # csrc/errors.cu symm_abi_version


def check_abi() -> None:
    """Raise if the loaded library's ABI (NativeLib.require) or struct size differs from this mirror."""
    LIB.require()
    n = LIB.lib.symm_layout_size()
    if n != ctypes.sizeof(SymmLayout):
        raise RuntimeError(f"symm_comm: SymmLayout size mismatch: library {n} bytes, Python mirror "
                           f"{ctypes.sizeof(SymmLayout)} bytes — rebuild libsymm_comm.so")
