#include <cuda_runtime.h>
#include "fp4_gemm_api.h"

extern "C" const char* fp4g_error_string(int code) {
  switch (code) {
    case FP4G_OK: return "success";
    case FP4G_EINVAL: return "invalid size or stride";
    case FP4G_EALIGN: return "misaligned pointer or stride";
    case FP4G_EUNSUPPORTED: return "shape not supported by this build";
    default: return code > 0 ? cudaGetErrorString(cudaError_t(code)) : "unknown error";
  }
}

extern "C" int fp4g_abi_version(void) { return 4; }  // 4: the split-K workspace; 3: the 8-word error record + timeout_ns; 2: group_counts, L1 scales per 128
