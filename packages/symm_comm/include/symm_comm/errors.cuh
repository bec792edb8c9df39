// symm_comm/errors.cuh — symm_comm's error codes and phases for the common error sink
// (moe_common/errors.cuh: first error wins, mirrored to mapped host memory; kernels set it and
// RETURN, nothing traps). The sink lives in the buffer's state words.
#pragma once
#include <stdint.h>
#include "moe_common/errors.cuh"
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

#ifdef __cplusplus
static_assert(SYMM_ERR_WORDS == moe::kErrWords, "the common sink's record");
#endif

#if defined(__CUDACC__)
namespace symm {
// The one error sink (moe_common/errors.cuh); symm_comm's codes and phases are the numbers above.
using moe::ErrSink;
using moe::report_error;
}  // namespace symm
#endif
