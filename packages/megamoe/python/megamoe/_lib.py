"""ctypes signatures of libmegamoe.so (csrc/megamoe_api.h): the fused kernel's launcher."""
from __future__ import annotations

import ctypes
from pathlib import Path

from fp4_gemm._native import NativeLib  # megamoe depends on fp4_gemm: its loader, not a third copy

c_i64, c_int, c_vp, c_f = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_float

LIB = NativeLib("megamoe", Path(__file__).parent, {
    "megamoe_error_string": ([c_int], ctypes.c_char_p),
    "megamoe_abi_version": ([], c_int),
    # layout, peers, host_err, timeout_ns, num_sms, grid_words (kGridWords u32), x_q, x_s, topk_idx, idx_bytes, topk_w, T,
    # w1, w1_rs, w2, w2_rs, I, l1_q, l1_s, y, block_n, clamp, pow2, local_base, stamps (null),
    # sk_partials, sk_floats, sk_counters, sk_slots, stream
    "megamoe_fused_forward": ([c_vp, c_vp, c_vp, c_i64, c_int, c_vp, c_vp, c_vp, c_vp, c_int, c_vp, c_int,
                               c_vp, c_vp, c_vp, c_vp, c_int, c_vp, c_vp, c_vp, c_int, c_f, c_int, c_vp, c_vp,
                               c_vp, c_i64, c_vp, c_int, c_vp], c_int),
}, error_fn="megamoe_error_string", abi=("megamoe_abi_version", 4))  # csrc/megamoe_api.h MOE_ABI_VERSION


def grid_words() -> int:
    """kGridWords of include/megamoe/layout.cuh (the header is the one definition)."""
    from fp4_gemm._native import header_constants, package_header
    return header_constants(package_header(Path(__file__).parent, "megamoe/layout.cuh"))["kGridWords"]

# The fused kernel's own waits in the buffer's error record (csrc/megamoe_api.h MOE_PHASE_GRID0 + barrier).
PHASES = {64: "fused kernel: grid barrier after the dispatch (this rank's CTAs)",
          65: "fused kernel: grid barrier after the L1 GEMM (this rank's CTAs)",
          66: "fused kernel: grid barrier after the L2 GEMM (this rank's CTAs)"}
