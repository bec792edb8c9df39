// moe_common/errors.cuh — THE device error sink of the repository. Every part (symm_comm's dispatch
// and combine, fp4_gemm's pipeline, the fused kernel) reports into one record of kErrWords i32:
//   word 0 code, 1 rank, 2 phase, 3 what, 4 detail, 5 epoch (low 32 bits), 6-7 zero.
// The first error of a call wins (CAS on word 0, relaxed at gpu scope: a flag, it publishes nothing
// the host reads before the kernel ends, except through the mirror below). With a mapped host mirror
// the record is copied there with volatile stores, code last after a sys fence, so the host can read
// it without a device sync. Reporting never traps: the role stops and leaves through its normal exit.
// Code and phase numbers are each package's (symm_comm/errors.cuh 1..31, fp4_gemm/errors.cuh 32..63),
// so one sink serves a kernel that composes both.
#pragma once
#include <stdint.h>
#include "moe_common/ptx.cuh"

#ifdef __cplusplus
namespace moe {
constexpr int kErrWords = 8;

#if defined(__CUDACC__)
struct ErrSink {
  int32_t* dev;   // kErrWords words on the device (zero before the call)
  int32_t* host;  // mapped host mirror (may be null)
  int32_t rank;
  uint32_t epoch;
};

// report_error = claim_error (the CAS: true for the first error) + fill_error (the rest of the record,
// by the thread that claimed it; a register-bound loop may claim inside and fill after it).
// claim_error is the CUDA builtin (relaxed, gpu scope, like the wrapper) so that it carries no asm
// "memory" clobber into a hot loop (the 128-token fp4_gemm loop spilled with it).
__device__ __forceinline__ bool claim_error(const ErrSink& s, int code) { return atomicCAS(s.dev, 0, code) == 0; }
__device__ __forceinline__ void fill_error(const ErrSink& s, int code, int phase, int what, int detail) {
  s.dev[1] = s.rank;
  s.dev[2] = phase;
  s.dev[3] = what;
  s.dev[4] = detail;
  s.dev[5] = (int32_t)s.epoch;
  if (s.host) {
    ptx::st_volatile_s32(s.host + 1, s.rank);
    ptx::st_volatile_s32(s.host + 2, phase);
    ptx::st_volatile_s32(s.host + 3, what);
    ptx::st_volatile_s32(s.host + 4, detail);
    ptx::st_volatile_s32(s.host + 5, (int32_t)s.epoch);
    ptx::fence_acq_rel_sys();
    ptx::st_volatile_s32(s.host + 0, code);
    ptx::fence_acq_rel_sys();
  }
}
// For a kernel whose roles claimed inside loops (claim_error), once they are all done: fills the record
// if its code is one of the claim-only codes [lo, hi] and the host mirror is still empty (several threads
// may call it; they write the same words). Only claim-only codes: report_error's winner fills its own
// record (a fill here could interleave with it), and a record the host has already taken and cleared
// while the device word is not yet zero (stream order) would be raised a second time. Phase / what /
// detail 0: a claimed code names its role itself (fp4_gemm/errors.cuh). Not inlined: off the hot path.
inline __device__ __noinline__ void fill_claimed_error(const ErrSink& s, int lo, int hi) {
  const int32_t code = ptx::ld_relaxed_gpu_s32(s.dev);  // the winner's code (0: none; the common case)
  if (code < lo || code > hi || (s.host && ptx::ld_relaxed_sys_s32(s.host) != 0)) return;
  fill_error(s, code, 0, 0, 0);
}
__device__ __forceinline__ void report_error(const ErrSink& s, int code, int phase, int what, int detail) {
  if (ptx::atom_cas_relaxed_gpu_s32(s.dev, 0, code) == 0) fill_error(s, code, phase, what, detail);  // first error wins
}
#endif  // __CUDACC__
}  // namespace moe
#endif  // __cplusplus
