// Plain C ABI of libsymm_comm.so. Every function returns 0 on success, a positive cudaError_t from a
// CUDA call, or a negative SYMM_E* code for a bad argument (nothing is launched then). Errors found
// by a kernel (timeouts, bad expert ids, pool overflow) go to the device error word and its mapped
// host mirror `host_err` (SYMM_ERR_WORDS int32: code, rank, phase, what, detail, epoch) — see
// include/symm_comm/errors.cuh; the launch itself still returns 0.
#pragma once
#include <stdint.h>
#include <cuda_runtime_api.h>
#include "symm_comm/layout.cuh"

#ifdef __cplusplus
extern "C" {
#endif

#define SYMM_API __attribute__((visibility("default")))

enum {
  SYMM_OK = 0,
  SYMM_EINVAL = -1,      // a size or count is out of range
  SYMM_EALIGN = -2,      // a pointer is not 16-byte aligned
  SYMM_ELAYOUT = -3,     // the layout struct is invalid or from another version
  SYMM_ECOOP = -4,       // the device cannot run the cooperative (grid-barrier) kernel
};

SYMM_API const char* symm_error_string(int code);
SYMM_API int symm_abi_version(void);
SYMM_API int symm_layout_size(void);  // sizeof(SymmLayout), for the ctypes mirror
// Fills *out (see layout.cuh). pool_rows <= 0 / max_m <= 0: defaults. cmb_in_rows: rows of the pull
// combine's input region (0: none, < 0: pool_rows).
SYMM_API int symm_layout_init(SymmLayout* out, int num_ranks, int rank, int num_experts, int hidden, int topk,
                              int max_tokens, int block_m, int64_t pool_rows, int max_m, int64_t cmb_in_rows);
// SYMM_ERR_WORDS int32 of zeroed, device-mapped, pinned host memory (the error mirror).
SYMM_API int symm_host_words_alloc(int32_t** out);
SYMM_API int symm_host_words_free(int32_t* p);
SYMM_API int symm_device_sms(int device, int* out);

// Dispatch. peers: device array uint64 [num_ranks] of buffer base addresses (peers[rank] = local).
// x: FP8 [num_tokens, H]; scales: FP32 [num_tokens, H/128]; topk_idx: int32 (idx_bytes 4) or int64
// (8) [num_tokens, K]; topk_w: FP32 [num_tokens, K] or null; all contiguous, 16-byte aligned.
// masked: 0 contiguous pool, 1 masked ([L, max_m] rows). num_sms <= 0: all SMs.
SYMM_API int symm_dispatch(const SymmLayout* layout, const uint64_t* peers, const void* x, const float* scales,
                           const void* topk_idx, int idx_bytes, const float* topk_w, int num_tokens, int masked,
                           int num_sms, int64_t timeout_ns, int32_t* host_err, cudaStream_t stream);

// Combine of the last dispatch. expert_out: BF16 [out_rows, H] in pool row order; topk_w: FP32
// [num_tokens, K] or null (no weight multiply); y: BF16 [num_tokens, H].
SYMM_API int symm_combine(const SymmLayout* layout, const uint64_t* peers, const void* expert_out, int64_t out_rows,
                          const float* topk_w, void* y, int num_tokens, int num_sms, int64_t timeout_ns,
                          int32_t* host_err, cudaStream_t stream);

// Pull combine of the last dispatch (layout cmb_in_rows > 0): every rank's expert outputs are in its
// buffer's cmb_in region (BF16 [cmb_in_rows, H], pool row order), written before this call on the stream;
// each rank reads its tokens' rows from the owners and reduces them in registers. Every rank must pull
// in the same call (checked: SYMM_ERR_COMBINE_MODE). The rows must stay unchanged until every rank's
// combine has read them (the next dispatch's cross-rank barrier guarantees it).
SYMM_API int symm_combine_pull(const SymmLayout* layout, const uint64_t* peers, const float* topk_w, void* y,
                               int num_tokens, int num_sms, int64_t timeout_ns, int32_t* host_err,
                               cudaStream_t stream);

// Sets the local state: epochs (dispatch, combine), grid-barrier words 0, error word 0, and every
// arrival counter to dispatch_epoch * block_m. Used at creation and by the collective resync.
SYMM_API int symm_reset_state(const SymmLayout* layout, void* local_base, uint64_t dispatch_epoch,
                              uint64_t combine_epoch, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
