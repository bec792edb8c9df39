// megamoe/tile_queue.cuh — a dynamic tile order for a CTA's producer / math roles (fp4_gemm's
// Mainloop<Cfg>::produce / math take any scheduler with next() / k_range() / splits): one thread takes
// the next split-unit from a grid-wide counter and hands it to the CTA's other role threads through a
// small shared-memory ring. The counter is the caller's (zero at creation; the caller resets it once
// every CTA has left the phase), as is the ring's storage (TileQueue, initialised before the roles split).
#pragma once
#include <stdint.h>

#include "fp4_gemm/roles.cuh"
#include "moe_common/errors.cuh"

namespace megamoe {

// Why: the two CTAs of an SM progress at different rates (docs/perf-notes.md: 31-43 us per unit at 128
// tokens), so a static round-robin order ends each GEMM phase with the slow ones. The producer's thread 0
// takes the next split-unit from the phase's counter (atomicAdd: per CTA the values only grow, which the
// scheduler's forward walk needs) and hands it to its warpgroup and the math warps through a small ring:
// unit[slot] written with st.shared, published by full[slot]'s arrive (release, cta scope), read after the
// wait (acquire); every reader arrives on empty[slot] so thread 0 reuses the slot only after all 383 read
// it. A unit's tile, K range and workspace slot are the scheduler's, so the tiles and their accumulation
// order, hence the bits, do not depend on which CTA runs them.
constexpr int kTileRing = 4;
// The readers: the CTA (one producer warpgroup + the math warpgroups) but producer thread 0.
constexpr uint32_t kTileReaders = fp4_gemm::kMathThreads + 127;
struct TileQueue {
  uint64_t full[kTileRing], empty[kTileRing];
  int32_t unit[kTileRing];
  __device__ void init() {
    for (int i = 0; i < kTileRing; ++i) {
      ::moe::ptx::mbar_init(&full[i], 1);
      ::moe::ptx::mbar_init(&empty[i], kTileReaders);
    }
  }
};

template <class Base>
struct DynSched {
  Base s;
  int splits;  // s.splits, as a member: the roles read `sched.splits`
  TileQueue* q;
  uint32_t* counter;
  const moe::ErrSink* err;
  uint64_t timeout_ns;
  int taker;  // 1: producer thread 0 (takes the units), 0: a reader
  uint32_t j = 0;
  __device__ DynSched(const Base& b, TileQueue* q_, uint32_t* c, const moe::ErrSink* e, uint64_t to, bool tk)
      : s(b), splits(b.splits), q(q_), counter(c), err(e), timeout_ns(to), taker(tk) {}
  __device__ __forceinline__ void k_range(const fp4_gemm::Tile& t, int& kb0, int& kbn) const {
    s.k_range(t, kb0, kbn);
  }
  __device__ bool next(fp4_gemm::Tile& t) {
    const int slot = int(j % kTileRing);
    const uint32_t ph = (j / kTileRing) & 1u;
    ++j;
    int u;
    if (taker) {
      u = int(atomicAdd(counter, 1u));
      if (!::moe::ptx::mbar_wait(&q->empty[slot], ph ^ 1u, timeout_ns)) {
        moe::claim_error(*err, fp4_gemm::Err::kTimeoutEmpty);
        return false;
      }
      ::moe::ptx::st_shared_s32(&q->unit[slot], u);
      ::moe::ptx::mbar_arrive(&q->full[slot]);
    } else {
      if (!::moe::ptx::mbar_wait(&q->full[slot], ph, timeout_ns)) {
        moe::claim_error(*err, fp4_gemm::Err::kTimeoutFull);
        return false;
      }
      u = ::moe::ptx::ld_shared_s32(&q->unit[slot]);
      ::moe::ptx::mbar_arrive(&q->empty[slot]);
    }
    s.next_tile = u;
    return s.next(t);
  }
};

}  // namespace megamoe
