// symm_comm/errors.cuh — device error word. The first error of a call wins (CAS on the buffer's
// state word) and is mirrored to mapped host memory (plain volatile stores, no host atomics), so the
// host can read it without a device sync. Kernels set it and RETURN; nothing traps.
#pragma once
#include <stdint.h>
#include "symm_comm/ptx.cuh"

// Device error codes (word 0).
#define SYMM_ERR_NONE 0
#define SYMM_ERR_TIMEOUT 1        // a spin-wait passed its deadline
#define SYMM_ERR_BAD_EXPERT 2     // topk_idx outside [-1, num_experts)
#define SYMM_ERR_POOL_OVERFLOW 3  // rows needed exceed the pool capacity (nothing written)
#define SYMM_ERR_SLOT_OVERFLOW 4  // more than max_tokens slots for one (expert, source) (duplicate ids)
#define SYMM_ERR_OUT_ROWS 5       // combine: expert_out has fewer rows than the pool uses
#define SYMM_ERR_MASKED_OVERFLOW 6  // masked layout: an expert got more than max_m rows
#define SYMM_ERR_COMBINE_MODE 7   // combine: this rank pulls and rank `what` does not (or the reverse)
#define SYMM_ERR_COMBINE_ROW 8    // pull combine: token `what`'s row k = detail has no valid owner row
#define SYMM_ERR_SMEM 9           // dispatch_run: scratch of `what` ints, the phase needs `detail` (fused kernels)

// Phases (word 2).
#define SYMM_PHASE_DISPATCH_SCAN 1     // phase A: scan topk_idx, push metadata
#define SYMM_PHASE_DISPATCH_GRID 2     // phase A: the one-pass metadata scan's grid barrier (this rank's CTAs)
#define SYMM_PHASE_DISPATCH_RANKS 3    // cross-rank barrier after phase A
#define SYMM_PHASE_DISPATCH_LAYOUT 4   // phase B: pool layout
#define SYMM_PHASE_COMBINE_PUSH 5      // combine: peer stores
// 6: retired (combine has no grid barrier any more); kept free so the other numbers stay stable.
#define SYMM_PHASE_COMBINE_RANKS 7     // combine start: a peer has not finished its previous combine yet
#define SYMM_PHASE_COMBINE_ARRIVE 8    // combine reduce: the rows of a token did not all arrive
// 9: retired (the push dispatch's completion barrier, removed in layout v10); kept free.
#define SYMM_PHASE_COMBINE_PULL 10     // pull combine: waiting for the owners' start signals / reading their rows
#define SYMM_PHASE_POOL_WAIT 11        // a pool consumer (wait_block): block `what`'s rows did not all arrive
#define SYMM_PHASE_GRID 12             // grid_barrier_gpu between a fused kernel's phases

// Error word layout (8 x i32): code, rank, phase, what, detail, epoch (low 32 bits), 0, 0.
//   TIMEOUT: what = peer rank waited for (-1 = grid barrier), detail = last value seen (low bits;
//            dispatch cross-rank barrier: the word >> 32, i.e. the calls of that rank counted);
//            phase COMBINE_ARRIVE: what = token, detail = rows arrived (of popcount(kmask[token])).
//   BAD_EXPERT: what = token * K + k, detail = the id. POOL_OVERFLOW: what = rows needed, detail = P.
#define SYMM_ERR_WORDS 8

#if defined(__CUDACC__)
namespace symm {

struct ErrSink {
  int32_t* dev;   // SYMM_ERR_WORDS words in the buffer's local state
  int32_t* host;  // mapped host mirror (may be null)
  int32_t rank;
  uint32_t epoch;
};

__device__ __forceinline__ void report_error(const ErrSink& s, int code, int phase, int what, int detail) {
  if (ptx::atom_cas_relaxed_gpu_s32(s.dev, 0, code) != 0) return;  // first error wins
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

}  // namespace symm
#endif
