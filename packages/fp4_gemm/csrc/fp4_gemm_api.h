// Plain C ABI of libfp4_gemm.so. Every function returns 0 on success, a positive cudaError_t
// from a CUDA call, or a negative FP4G_E* code for a bad argument (nothing is launched then).
#pragma once
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FP4G_API __attribute__((visibility("default")))

enum {
  FP4G_OK = 0,
  FP4G_EINVAL = -1,     // a size or stride is out of range
  FP4G_EALIGN = -2,     // a pointer or stride is not aligned as required
  FP4G_EUNSUPPORTED = -3,  // a shape this build has no kernel for
};

FP4G_API const char* fp4g_error_string(int code);
FP4G_API int fp4g_abi_version(void);

// x: BF16 [T, H] with row stride x_stride (elements); q: E4M3 [T, H] contiguous;
// scales: FP32 [T, H/128] contiguous. H % 128 == 0.
FP4G_API int fp4g_quantize_fp8(const void* x, void* q, float* scales, int64_t T, int64_t H,
                               int64_t x_stride, int pow2_scales, cudaStream_t stream);

// Grouped GEMM, BF16 output: out[row, n] = sum_k x[row, k] * W_g[n, k], W_g decoded from the
// packed FP4 weights (layout.cuh) times row_scale[g, n], x per-128 scaled FP8.
//  layout 0 (contiguous): x [rows, k], group_sizes = int32 [G + 1] row offsets, out [rows, n];
//    group_counts (optional, may be null): int32 [G], group g's valid rows start at its offset
//    (min with its segment): rows past them (e.g. a dispatch pool's padding) are neither read nor written;
//  layout 1 (masked): x [G, max_m, k] (rows = G * max_m), group_sizes = int32 [G] valid rows.
//  x_scales: FP32 [rows, k / 128]. block_n: token tile (8, 16, 32, 64, 128). num_sms <= 0: all.
//  err: int32 [8] device words (moe_common/errors.cuh: code, rank, phase, what, detail, epoch, 0, 0),
//    zero on entry; a non-zero code after the kernel is the first error (fp4_gemm/errors.cuh).
//  timeout_ns > 0: limit of each pipeline wait (then the error above, and the kernel returns).
//  Split-K workspace (optional; sk_partials or sk_counters null: none): used by the few-token kernels
//    (block_n 8, 16) when a call has fewer tiles than CTAs. sk_partials FP32 [sk_floats] (16-byte
//    aligned), sk_counters u32 [sk_slots], ZERO on entry (each call leaves them zero; after an error
//    the caller zeroes them). One workspace per stream: two calls in flight at once must not share it.
//    fp4g_splitk_floats_per_slot(block_n, l1) floats per slot; the kernel uses at most
//    min(sk_slots, sk_floats / that) slots.
FP4G_API int fp4g_splitk_floats_per_slot(int block_n, int l1);
// The K splits per tile a launch uses for `units` tiles (L1: tile pairs), `workers` = 2 x the device's SMs,
// `k_blocks` = k / 128 and `slots` workspace slots (1: unsplit). Exported for tests and tuning.
FP4G_API int fp4g_splitk_splits(int units, int workers, int k_blocks, int slots);
FP4G_API int fp4g_grouped_gemm_bf16(const void* x, const float* x_scales, const void* w_packed,
                                    const float* row_scale, const int* group_sizes, const int* group_counts, void* out,
                                    int layout, int num_groups, int64_t rows, int max_m, int n, int k,
                                    int block_n, int num_sms, float* sk_partials, int64_t sk_floats,
                                    uint32_t* sk_counters, int sk_slots, int32_t* err, int64_t timeout_ns,
                                    cudaStream_t stream);

// Grouped GEMM with the L1 (SwiGLU) epilogue over gate/up-interleaved W1 (n = 2I rows):
// out_q E4M3 [rows, n / 2] = a / scale with a = silu(min(g, c)) * clamp(u, -c, c) * topk_w[row],
// out_s FP32 [rows, n / 256]: one scale per token per 128 intermediate channels (layout.cuh
// kScaleGroup: the L2 GEMM's x_scales as they stand); n % 256 == 0, out_q 16-byte aligned.
// activation_clamp c >= 0 (INFINITY: none); pow2_scales rounds scales up to powers of two.
// sk_*, err, timeout_ns: as fp4g_grouped_gemm_bf16.
FP4G_API int fp4g_grouped_gemm_l1(const void* x, const float* x_scales, const void* w_packed,
                                  const float* row_scale, const int* group_sizes, const int* group_counts,
                                  const float* topk_w,
                                  void* out_q, float* out_s, int layout, int num_groups, int64_t rows, int max_m,
                                  int n, int k, int block_n, float activation_clamp, int pow2_scales, int num_sms,
                                  float* sk_partials, int64_t sk_floats, uint32_t* sk_counters, int sk_slots,
                                  int32_t* err, int64_t timeout_ns, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
