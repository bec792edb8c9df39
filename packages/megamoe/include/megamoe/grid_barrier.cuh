// megamoe/grid_barrier.cuh — the fused kernel's barrier across this rank's CTAs inside one launch
// (what a kernel boundary gives the staged pipeline between its kernels). Rank-local words, no reset
// step between calls, robust to a call that timed out half way:
//
//   words [2][kGridBarriers] u32, zero at creation. Call e (the dispatch epoch, 1-based) uses the row
//   of parity e & 1; barrier b of it counts CTA arrivals in words[e & 1][b] up to the grid size.
//   At its start CTA 0 zeroes the OTHER row, which call e - 1 used and call e + 1 will use: call e - 1
//   finished before call e started (stream order; a graph replay is a launch too), so nothing else
//   touches that row now, and it is zero before call e + 1 starts, whatever call e - 1 left there
//   (a timed-out call leaves a partial count). The zeroing is ordered before call e + 1 by the kernel
//   boundary between calls e and e + 1 (the same boundary symm_comm's epoch protocol relies on).
//
// Ordering contract of arrive_wait (one thread per CTA calls it, after a CTA-wide barrier that
// follows the CTA's writes, and the CTA waits on a CTA-wide barrier after it):
//   release: red.release.gpu.add — cumulative over the writes the CTA barrier ordered before it;
//   acquire: ld.acquire.gpu of the count == grid size — every CTA's pre-barrier writes are visible to
//            this thread, and to the CTA's other threads after the following CTA barrier.
//   A TMA (async proxy) read of data generic-proxy stores wrote before the barrier additionally needs
//   fence.proxy.async.global in the thread issuing the TMA, after the acquire.
#pragma once
#include <stdint.h>
#include "moe_common/errors.cuh"
#include "moe_common/ptx.cuh"

namespace moe {

static constexpr int kGridBarriers = 4;  // barriers one fused call may use (words per parity row; Python reads it)

struct GridBarrier {
  uint32_t* words;  // [2][kGridBarriers], rank-local device memory, zero at creation
  uint32_t parity;  // this call's row: dispatch epoch & 1
  uint32_t nctas;   // CTAs in the launch

#if defined(__CUDACC__)
  // CTA 0, one thread, before its first arrive of the call.
  __device__ __forceinline__ void clear_next_row() const {
#pragma unroll
    for (int b = 0; b < kGridBarriers; ++b) words[(parity ^ 1u) * kGridBarriers + b] = 0u;
  }

  // Barrier b (< kGridBarriers, each used once per call). One thread per CTA; false on timeout (the
  // error is reported with `phase`, what = -1 (grid), detail = the count seen).
  __device__ __forceinline__ bool arrive_wait(int b, uint64_t deadline, const ErrSink& err, int code_timeout,
                                              int phase) const {
    uint32_t* w = words + parity * kGridBarriers + b;
    ptx::red_add_release_gpu_u32(w, 1u);
    uint32_t seen = 0;
    while ((seen = ptx::ld_acquire_gpu_u32(w)) < nctas) {
      if (ptx::globaltimer_ns() > deadline) {
        report_error(err, code_timeout, phase, -1, (int)seen);
        return false;
      }
      ptx::nanosleep(32);
    }
    return true;
  }
#endif
};

}  // namespace moe
