// megamoe/scheduler.cuh — the fused kernel's task scheduler: L1 and L2 GEMM tasks over the dispatch
// pool, in WAVES of pool blocks so that L2 reads an L1 output ring that stays bounded.
//
// Plan (host and device compute it with the same functions, so the ring the host sizes is the ring
// the device uses): the pool's used blocks (exp_offsets[L] / block_m, known after dispatch) are cut
// into waves of wave_blocks consecutive blocks (experts are contiguous, block-aligned segments, so a
// wave holds whole blocks of one or more experts). A wave's tasks are its L1 tasks (block, L1 unit =
// one 128-channel group of I, the L1 epilogue's n-block pair), then its L2 tasks (block, n-block of
// H). The global task sequence is wave 0's L1, wave 0's L2, wave 1's L1, ...; CTA (or cluster) c of
// n takes tasks c, c + n, c + 2n, ... (start / step from the caller: no blockIdx here).
// Ordering the kernel must add (not this header's job): an L1 task waits for its block's dispatch
// arrivals, an L2 task for its block's L1 readiness (megamoe/layout.cuh l1_ready); a wave's L1
// output lives in ring slots block % ring_blocks, distinct within a wave (wave_blocks <= ring_blocks).
// A CTA that runs ahead into wave w + 1's L1 while wave w's L2 tasks still read slot s cannot
// overwrite s: wave w + 1 uses slot s only for block b + ring_blocks, i.e. when ring_blocks ==
// wave_blocks, the L1 task writing it must wait until the L2 tasks of block b finished (the fused
// kernel keeps a per-slot "free" counter for that; with ring_blocks >= 2 wave_blocks it never waits).
// Every value a lane reads is defined: next() returns false with a task of phase kNone at the end.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define MOE_SCHED_HD __host__ __device__ __forceinline__
#else
#define MOE_SCHED_HD inline
#endif

namespace moe {

enum class Phase : int32_t { kNone = 0, kL1 = 1, kL2 = 2 };

struct Task {
  Phase phase = Phase::kNone;
  int32_t wave = -1;
  int32_t expert = -1;      // local expert of the block
  int32_t unit = -1;        // L1: 128-channel group of I (n-blocks 2 unit, 2 unit + 1); L2: n-block of H
  int64_t pool_block = -1;  // block of the dispatch pool (block_m rows)
  int32_t rows = 0;         // valid rows of the block (padding rows excluded)
};

struct WavePlan {
  int32_t wave_blocks;  // pool blocks per wave (the last wave may hold fewer)
  int32_t l1_units;     // L1 tasks per block: I / 128
  int32_t l2_units;     // L2 tasks per block: H / 128
};

// Blocks per wave: enough L1 tasks for two of every CTA (the reference's heuristic: a wave's L1 work
// is over before its L2 tasks need it), at most the pool. Host (ring sizing) and device.
MOE_SCHED_HD int32_t moe_wave_blocks(int32_t workers, int32_t l1_units, int64_t pool_blocks) {
  int64_t w = (2 * (int64_t)workers + l1_units - 1) / (l1_units > 0 ? l1_units : 1);
  if (w > pool_blocks) w = pool_blocks;
  return (int32_t)(w < 1 ? 1 : w);
}

// One worker's walk of the task sequence. offsets: exp_offsets [L + 1] (segment starts, [L] = rows
// used), counts: exp_counts [L], both as dispatch published them (the caller acquired them).
struct MoeScheduler {
  WavePlan plan;
  const int32_t* offsets;
  const int32_t* counts;
  int32_t num_experts;
  int32_t block_m;
  int64_t used_blocks;
  int64_t next_index;  // global task index of this worker's next task
  int64_t step;

  MOE_SCHED_HD MoeScheduler(const WavePlan& p, const int32_t* offs, const int32_t* cnt, int32_t L, int32_t bm,
                            int64_t start, int64_t step_)
      : plan(p), offsets(offs), counts(cnt), num_experts(L), block_m(bm), next_index(start), step(step_) {
    const int64_t used_rows = L > 0 ? offs[L] : 0;
    used_blocks = used_rows > 0 ? (used_rows + bm - 1) / bm : 0;
  }

  MOE_SCHED_HD int64_t tasks_per_block() const { return (int64_t)plan.l1_units + plan.l2_units; }
  MOE_SCHED_HD int64_t total_tasks() const { return used_blocks * tasks_per_block(); }

  // The local expert whose segment holds pool row `row` (binary search: segments are sorted).
  MOE_SCHED_HD int32_t expert_of(int64_t row) const {
    int32_t lo = 0, hi = num_experts;  // offsets[lo] <= row < offsets[hi]
    while (hi - lo > 1) {
      const int32_t mid = (lo + hi) / 2;
      if (offsets[mid] <= row) lo = mid;
      else hi = mid;
    }
    return lo;
  }

  // Task of global index g (g < total_tasks()).
  MOE_SCHED_HD Task task_at(int64_t g) const {
    const int64_t per_wave = (int64_t)plan.wave_blocks * tasks_per_block();
    const int64_t w = g / per_wave;
    int64_t in_wave = g - w * per_wave;
    const int64_t b0 = w * plan.wave_blocks;
    const int64_t nb = used_blocks - b0 < plan.wave_blocks ? used_blocks - b0 : plan.wave_blocks;  // last wave
    Task t;
    t.wave = (int32_t)w;
    if (in_wave < nb * plan.l1_units) {
      t.phase = Phase::kL1;
      t.pool_block = b0 + in_wave / plan.l1_units;
      t.unit = (int32_t)(in_wave % plan.l1_units);
    } else {
      in_wave -= nb * plan.l1_units;
      t.phase = Phase::kL2;
      t.pool_block = b0 + in_wave / plan.l2_units;
      t.unit = (int32_t)(in_wave % plan.l2_units);
    }
    const int64_t row0 = t.pool_block * block_m;
    t.expert = expert_of(row0);
    const int64_t end = (int64_t)offsets[t.expert] + counts[t.expert];  // valid rows end (padding after)
    const int64_t r = end - row0;
    t.rows = (int32_t)(r < 0 ? 0 : (r > block_m ? block_m : r));
    return t;
  }

  // The worker's next task; false (and a task of phase kNone) past the end.
  MOE_SCHED_HD bool next(Task& t) {
    if (next_index >= total_tasks()) {
      t = Task{};
      return false;
    }
    t = task_at(next_index);
    next_index += step;
    return true;
  }
};

}  // namespace moe
