#include <cuda_runtime.h>
#include <string.h>
#include "symm_api.h"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"

extern "C" const char* symm_error_string(int code) {
  switch (code) {
    case SYMM_OK: return "success";
    case SYMM_EINVAL: return "invalid size or count";
    case SYMM_EALIGN: return "pointer not 16-byte aligned";
    case SYMM_ELAYOUT: return "invalid layout struct (wrong version or not initialised)";
    case SYMM_ECOOP: return "device cannot co-schedule the cooperative grid (grid barrier)";
    default: return code > 0 ? cudaGetErrorString(cudaError_t(code)) : "unknown error";
  }
}

extern "C" int symm_abi_version(void) { return 3; }  // 2: symm_layout_init(cmb_in_rows), symm_combine_pull;
                                                      // 3: symm_dispatch_kind removed
extern "C" int symm_layout_size(void) { return (int)sizeof(SymmLayout); }

extern "C" int symm_layout_init(SymmLayout* out, int num_ranks, int rank, int num_experts, int hidden, int topk,
                                int max_tokens, int block_m, int64_t pool_rows, int max_m, int64_t cmb_in_rows) {
  if (!out) return SYMM_EINVAL;
  return symm_layout_compute(out, num_ranks, rank, num_experts, hidden, topk, max_tokens, block_m, pool_rows,
                             max_m, cmb_in_rows) == 0
             ? SYMM_OK
             : SYMM_EINVAL;
}

extern "C" int symm_host_words_alloc(int32_t** out) {
  if (!out) return SYMM_EINVAL;
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, SYMM_ERR_WORDS * sizeof(int32_t), cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return (int)e;
  memset(p, 0, SYMM_ERR_WORDS * sizeof(int32_t));
  *out = static_cast<int32_t*>(p);
  return SYMM_OK;
}

extern "C" int symm_host_words_free(int32_t* p) {
  if (!p) return SYMM_OK;
  return (int)cudaFreeHost(p);
}

extern "C" int symm_device_sms(int device, int* out) {
  if (!out) return SYMM_EINVAL;
  return (int)cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device);
}
