"""ctypes signatures of libfp4_gemm.so (csrc/fp4_gemm_api.h)."""
from __future__ import annotations

import ctypes
from pathlib import Path

from ._native import NativeLib

c_i64, c_int, c_vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p

LIB = NativeLib("fp4_gemm", Path(__file__).parent, {
    "fp4g_error_string": ([c_int], ctypes.c_char_p),
    "fp4g_abi_version": ([], c_int),
    "fp4g_quantize_fp8": ([c_vp, c_vp, c_vp, c_i64, c_i64, c_i64, c_int, c_vp], c_int),
    "fp4g_splitk_floats_per_slot": ([c_int, c_int], c_int),
    "fp4g_splitk_splits": ([c_int, c_int, c_int, c_int], c_int),
    # ..., num_sms, sk_partials, sk_floats, sk_counters, sk_slots, err, timeout_ns, stream
    "fp4g_grouped_gemm_bf16": ([c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_int, c_int, c_i64, c_int, c_int, c_int,
                                c_int, c_int, c_vp, c_i64, c_vp, c_int, c_vp, c_i64, c_vp], c_int),
    "fp4g_grouped_gemm_l1": ([c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_vp, c_int, c_int, c_i64, c_int, c_int,
                              c_int, c_int, ctypes.c_float, c_int, c_int, c_vp, c_i64, c_vp, c_int, c_vp, c_i64,
                              c_vp], c_int),
}, error_fn="fp4g_error_string", abi=("fp4g_abi_version", 4))  # csrc/errors.cu: 4 = the split-K workspace
