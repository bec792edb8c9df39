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

#ifdef __cplusplus
}
#endif
