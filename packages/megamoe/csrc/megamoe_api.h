// libmegamoe.so's C ABI (called from Python through ctypes: megamoe/_lib.py mirrors the signatures).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "symm_comm/layout.cuh"

#define MOE_API __attribute__((visibility("default")))
#define MOE_ABI_VERSION 4

// Return codes (> 0: a cudaError_t).
#define MOE_OK 0
#define MOE_EINVAL -1
#define MOE_EALIGN -2
#define MOE_EUNSUPPORTED -3
#define MOE_ELAYOUT -4
#define MOE_ECOOP -5

// Error-record phases of the fused kernel's own waits (moe_common/errors.cuh; symm_comm uses 1..31,
// fp4_gemm 32..63): grid barrier b of a call reports MOE_PHASE_GRID0 + b, what = -1, detail = the count seen.
#define MOE_PHASE_GRID0 64

#ifdef __cplusplus
extern "C" {
#endif
MOE_API const char* megamoe_error_string(int code);
MOE_API int megamoe_abi_version(void);
// One fused MoE call on this rank (collective over the buffer's ranks), enqueued on `stream`:
// dispatch of (x_q, x_s, topk_idx, topk_w) [num_tokens rows] -> L1 (w1, gate/up interleaved, SwiGLU x top-k
// weight -> l1_q / l1_s, [pool_rows][I] / [pool_rows][I / 128]) -> L2 (w2 -> the buffer's combine input)
// -> pull combine -> y BF16 [num_tokens][H]. grid_words: kGridWords u32 (megamoe/layout.cuh: the grid
// barriers' words and the dynamic tile order's counters), zero at creation and after a resync.
// Device-side errors go to the buffer's error record (host_err mirror), the GEMM roles' timeouts too
// (fp4_gemm's codes 32..: claimed in their loops, the record filled at the kernel's end). stamps: null, or 9 u64 per CTA of the
// grid (at most 2 x the SM count): %globaltimer at the phase boundaries and the SM (fused.cu kStamps; profiling).
// sk_*: the split-K workspace of both GEMMs (fp4_gemm_api.h; null: none), zero on entry, left zero by a
// call that completes (after an error the caller zeroes the counters).
MOE_API int megamoe_fused_forward(const SymmLayout* layout, const uint64_t* peers, int32_t* host_err, int64_t timeout_ns,
                                  int num_sms, uint32_t* grid_words, const void* x_q, const float* x_s,
                                  const void* topk_idx, int idx_bytes, const float* topk_w, int num_tokens,
                                  const void* w1, const float* w1_rs, const void* w2, const float* w2_rs,
                                  int intermediate, void* l1_q, float* l1_s, void* y, int block_n,
                                  float activation_clamp, int pow2, void* local_base, uint64_t* stamps,
                                  float* sk_partials, int64_t sk_floats, uint32_t* sk_counters, int sk_slots,
                                  cudaStream_t stream);
#ifdef __cplusplus
}
#endif
