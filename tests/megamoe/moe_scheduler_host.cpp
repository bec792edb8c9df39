// Host check of the fused kernel's scheduler and workspace layout (megamoe/scheduler.cuh,
// megamoe/layout.cuh), compiled by test_moe_scheduler.py with a host C++ compiler: for random expert
// counts, block sizes, wave sizes and worker counts, every (block, L1 unit) and (block, L2 unit) task
// is handed out exactly once over all workers; the global order runs a wave's L1 tasks before its L2
// tasks; rows are the valid rows of the block (>= 1) and the expert is the segment's; within a wave
// the ring slots are distinct; every worker ends with a defined kNone task; the layout's regions do
// not overlap and the ring row accessor stays inside the ring. Prints "ok <runs>" or the first failure.
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>
#define MOE_HOST_ACCESSORS
#include "megamoe/layout.cuh"
#include "megamoe/scheduler.cuh"

int main() {
  std::mt19937 rng(7);
  const int runs = 3000;
  for (int trial = 0; trial < runs; ++trial) {
    const int L = 1 + rng() % 40, bm = (rng() % 2) ? 128 : 64;
    std::vector<int32_t> counts(L), offs(L + 1, 0);
    for (int e = 0; e < L; ++e) counts[e] = (rng() % 3 == 0) ? 0 : int(rng() % 500);
    for (int e = 0; e < L; ++e) offs[e + 1] = offs[e] + (counts[e] + bm - 1) / bm * bm;
    const int64_t used_blocks = offs[L] / bm;
    moe::WavePlan plan{};
    plan.l1_units = 1 + rng() % 24;
    plan.l2_units = 1 + rng() % 56;
    const int workers = 1 + rng() % 300;
    plan.wave_blocks = moe::moe_wave_blocks(workers, plan.l1_units, used_blocks > 0 ? used_blocks : 1);
    const char* why = nullptr;
    std::map<std::tuple<int, int64_t, int>, int> seen;  // (phase, block, unit) -> times
    std::map<int64_t, moe::Task> by_index;
    for (int w = 0; w < workers && !why; ++w) {
      moe::MoeScheduler s(plan, offs.data(), counts.data(), L, bm, w, workers);
      moe::Task t;
      int64_t g = w;
      while (s.next(t)) {
        by_index[g] = t;
        g += workers;
        seen[{int(t.phase), t.pool_block, t.unit}] += 1;
        const int64_t row0 = t.pool_block * bm;
        if (t.expert < 0 || t.expert >= L || row0 < offs[t.expert] || row0 >= offs[t.expert + 1]) why = "wrong expert";
        else if (t.rows < 1 || t.rows > bm || row0 + t.rows > offs[t.expert] + counts[t.expert]) why = "wrong rows";
        else if (t.wave != int(t.pool_block / plan.wave_blocks)) why = "block outside its wave";
      }
      if (!why && (t.phase != moe::Phase::kNone || t.pool_block != -1 || t.rows != 0)) why = "undefined end task";
    }
    for (int64_t b = 0; b < used_blocks && !why; ++b) {
      for (int u = 0; u < plan.l1_units && !why; ++u)
        if (seen[{int(moe::Phase::kL1), b, u}] != 1) why = "an L1 task not handed out exactly once";
      for (int u = 0; u < plan.l2_units && !why; ++u)
        if (seen[{int(moe::Phase::kL2), b, u}] != 1) why = "an L2 task not handed out exactly once";
    }
    if (!why && seen.size() != size_t(used_blocks * (plan.l1_units + plan.l2_units))) why = "extra tasks";
    // global order: in each wave, every L1 index < every L2 index; waves in order
    std::map<int, int64_t> last_l1, first_l2;
    for (auto& [g, t] : by_index) {
      if (t.phase == moe::Phase::kL1) last_l1[t.wave] = g;
      else if (!first_l2.count(t.wave)) first_l2[t.wave] = g;
    }
    for (auto& [w, g] : last_l1)
      if (!why && first_l2.count(w) && first_l2[w] < g) why = "an L2 task before its wave's last L1 task";
    // the workspace: regions in order, the ring sized by the plan, slots of a wave distinct
    SymmLayout S;
    if (!why && symm_layout_compute(&S, 1, 0, L, 512, 4, 64, bm, offs[L] > 0 ? offs[L] : bm, 0, -1) == 0) {
      MoeLayout M;
      const int I = 128 * plan.l1_units;
      if (moe_layout_compute(&M, &S, I, plan.wave_blocks) != 0) why = "moe_layout_compute refused a valid plan";
      else if (M.off_l1_q < S.total_bytes || M.off_l1_s < M.off_l1_q + M.ring_rows * I ||
               M.off_l1_ready < M.off_l1_s + M.ring_rows * plan.l1_units * 4 ||
               M.total_bytes < M.off_l1_ready + S.num_blocks * 4) why = "overlapping regions";
      else {
        for (int64_t b0 = 0; b0 < used_blocks && !why; b0 += plan.wave_blocks) {
          std::set<int64_t> slots;
          for (int64_t b = b0; b < used_blocks && b < b0 + plan.wave_blocks; ++b) slots.insert(moe::ring_slot(M, b));
          const int64_t nb = used_blocks - b0 < plan.wave_blocks ? used_blocks - b0 : plan.wave_blocks;
          if (int64_t(slots.size()) != nb) why = "ring slots repeat within a wave";
        }
        for (int64_t r = 0; r < int64_t(used_blocks) * bm && !why; r += 37) {
          const uint8_t* q = moe::l1_q_row(0, M, r);
          if ((uint64_t)q < (uint64_t)M.off_l1_q || (uint64_t)q + I > (uint64_t)(M.off_l1_q + M.ring_rows * I))
            why = "an L1 row outside the ring";
        }
      }
    }
    if (why) {
      printf("FAIL trial %d (L %d, bm %d, units %d/%d, workers %d, wave %d): %s\n", trial, L, bm, plan.l1_units,
             plan.l2_units, workers, plan.wave_blocks, why);
      return 1;
    }
  }
  printf("ok %d\n", runs);
  return 0;
}
