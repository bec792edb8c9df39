// Persistent tile scheduler shared by the contiguous and masked grouped layouts.
// Tiles are enumerated group by group; inside a group the token block varies fastest, so CTAs
// running at the same time share a weight block (read once from HBM, then from L2).
// Group sizes are read from device memory (no host sync), the same way by every thread, so all
// warp roles of a CTA walk the same tile sequence. Plain (weak, L1-cached) loads, never the
// non-coherent path: a fused kernel's dispatch may write them earlier in the same launch, and its
// scheduler reads them only after acquiring that write (an acquire orders later weak loads). Strong
// (L1-bypassing) loads cost one L2 round trip per group in every CTA's walk: measured 0.5-1 ms per
// GEMM over 384 experts (2026-12-01).
//
// Pairs along N (kPairN = 2, the L1 epilogue): the unit of work then holds two consecutive weight
// n-blocks 2p, 2p + 1 of one token tile, both for the SAME CTA: next() returns the unit with its
// first n-block and the caller runs n_block, n_block + 1 in a row (a second next() state here cost
// the L1 kernels registers: spills), so the epilogue sees both 64-channel halves of a 128-channel L1
// output scale group (epilogue.cuh). With clusters, CTA rank r of the cluster takes the pair
// (2 * unit + r): n-blocks 4u + 2r, 4u + 2r + 1.
//
// Split-K (kSplitK, the decode configurations): when a launch has too few units to occupy its CTAs
// (few tokens: a handful of experts x n-blocks), each unit is cut into `splits` ranges of K blocks, one
// split-unit each (split index fastest, so a unit's splits run at the same time on consecutive CTAs).
// splits = choose_k_splits(units, CTAs, K blocks, workspace slots), computed by every role of every CTA
// from the same unit table, so all agree. A split-unit's partial sums go to its workspace slot and the
// last of a unit's splits to arrive sums them in split order and runs the epilogue (roles.cuh): the
// result does not depend on which CTA arrives last.
//
// Clusters (kClusterN = 2, token-tile multicast): the unit of work is a tile PAIR, the same token
// tile (group, m-block) with weight n-blocks 2p (cluster rank 0) and 2p + 1 (rank 1). Both CTAs of a
// cluster walk the same pair sequence (cluster index, step = number of clusters), so they agree on
// every tile and, K being the same for all tiles, on every pipeline stage. When a group's n-block
// count is odd, its last n-pair has no n-block for rank 1: that CTA gets DUMMY tiles (rows = 0,
// n_block = the partner's, same token tile) which it loads and computes in lock-step (its token
// half is multicast to the partner) but whose epilogue is skipped (wasted work: 1 / n_blocks of
// the tiles when n_blocks is odd; none at the benchmark shapes). Groups with 0 rows have no
// pairs, exactly as they have no tiles without clusters.
#pragma once
#include <cstdint>

#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/ptx.cuh"

namespace fp4_gemm {

enum class GroupLayout : int { kContiguous = 0, kMasked = 1 };

// Split-K workspace (caller-owned; partials == nullptr or slots == 0: no split). partials: FP32
// [slots][kPairN][WL::kMathThreads * kAccRegs] (each math thread's accumulator fragment, as the
// mainloop holds it); counters: [slots] u32, ZERO before a launch (fresh, or left so by the previous
// launch: the last arriver of each unit resets its counter; after a timed-out launch the caller must
// zero them again). slots = min(counters' length, partials' length / floats per slot). workers: the
// CTA count the split choice assumes (the launcher's: 2 per SM of the device), NOT the launch's grid, so
// that the splits, and so the bits, are the same for every launch on a device (the fused kernel and the
// standalone GEMM alike, whatever SM limit either runs under).
struct SplitKSpace {
  float* partials;
  uint32_t* counters;
  int64_t partial_floats;
  int counter_slots;
  int workers;
};

// FP32 floats of one workspace slot: pair_n n-blocks of every math thread's accumulator fragment
// (block_n / 2 floats each), in the order roles.cuh stores them. The one definition (the C ABI's
// fp4g_splitk_floats_per_slot and the kernels both use it).
__host__ __device__ constexpr int splitk_slot_floats(int block_n, int pair_n) {
  return pair_n * WL::kMathThreads * (block_n / 2);
}

constexpr int kSplitKCtasPerSm = 2;  // the split-K configurations run 2 CTAs per SM (MainloopConfig::kSplitK)
constexpr int kMaxKSplits = 8;
constexpr int kMinSplitKBlocks = 4;      // K blocks per split at least
constexpr int kSplitOverheadBlocks = 8;  // a split-unit's extra cost, in K blocks of one n-block (below)

// The splits of K per unit for `units` units on `workers` CTAs with `k_blocks` K blocks and `slots`
// workspace slots: the S in 1..kMaxKSplits with the least busiest-CTA time rounds(S) x (k_blocks / S +
// overhead), rounds(S) = ceil(units * S / workers), overhead = kSplitOverheadBlocks for S > 1 (the
// partials' stores, the arrival, the last split's sum and its epilogue after a short tile: measured
// ~4.7 us per split-unit of one n-block and ~9 us of an L1 pair on H200, ~8 and ~16 K blocks at
// ~0.56 us each; bench/splitk.py, 2026-12-02), with units * S <= slots and k_blocks / S >=
// kMinSplitKBlocks; a larger S only where it gains at least 1/32.
// The divisions are 32-bit: a 64-bit one is a subroutine call, and calls in the fused kernel's math region
// (which builds its schedulers there) made ptxas spill around them. units * S fits: above kMaxSplitUnits
// units (with workers <= kMaxSplitWorkers, i.e. >= 64 rounds of CTAs) no split can win, so the result is
// the 64-bit formula's (tests/fp4_gemm/scheduler_pairs_host.cpp compares them); more workers than that
// (the launchers pass 2 x SMs): no split.
constexpr int kMaxSplitUnits = 1 << 26, kMaxSplitWorkers = 1 << 20;
__host__ __device__ inline int choose_k_splits(int units, int workers, int k_blocks, int slots) {
  if (units <= 0 || workers <= 0 || units > kMaxSplitUnits || workers > kMaxSplitWorkers) return 1;
  int best = 1;
  int64_t best_num = int64_t((units + workers - 1) / workers) * k_blocks;  // cost(S) = num / S
  for (int s = 2; s <= kMaxKSplits; ++s) {
    if (int64_t(units) * s > slots || k_blocks / s < kMinSplitKBlocks) break;
    const int64_t num = int64_t((units * s + workers - 1) / workers) * (k_blocks + kSplitOverheadBlocks * s);
    if (num * best * 32 < best_num * s * 31) best = s, best_num = num;
  }
  return best;
}

struct GroupedProblem {
  GroupLayout layout;
  int num_groups;
  int n;            // output channels (weight rows) per group
  int k;            // reduction size
  int64_t rows;     // rows of the activation tensor (contiguous: M; masked: G * max_m)
  int max_m;        // masked: rows reserved per group
  const int* group_offsets;  // contiguous: [G + 1] row offsets (non-decreasing, last <= rows)
  const int* group_counts;   // contiguous, optional: [G] valid rows of group g, from offsets[g]
                             // (min with the segment; rows past it, e.g. pool padding, are skipped)
  const int* masked_m;       // masked: [G] valid rows per group (<= max_m)
  SplitKSpace sk;            // optional (kSplitK schedulers only)
};


struct Tile {
  int group;
  int n_block;
  int64_t row0;  // first activation / output row of this tile
  int rows;      // valid rows (tokens) in this tile, 1..BLOCK_N; 0: a cluster's dummy tile (never stored)
  // kSplitK schedulers only (unset otherwise): the split-unit's index = its workspace slot; its unit
  // (arrival counter) is slot / splits, its split slot % splits (GroupedScheduler::k_range).
  int slot;
};

__device__ inline int load_size(const int* p) { return *p; }

// Units of work per group, as a shared-memory table built once per CTA (before the roles split):
// table[g] = units of groups 0..g (inclusive prefix). next() then finds a tile's group by a binary
// search in shared memory and reads only that group's sizes from global memory. Without it, every
// role of every CTA walks the groups one dependent global load at a time: ~0.4 us per group and GEMM
// (150 us over 384 experts at one token per rank, H200 2026-12-01). Groups beyond kMaxTableGroups:
// the walk (correct, slower).
constexpr int kMaxTableGroups = 1024;
constexpr int kUnitTableBytes = kMaxTableGroups * 4;

// Which worker of the launch a scheduler serves (the kernel maps its CTAs or clusters to workers; the
// scheduler reads no blockIdx): worker `index` of `count` takes units index, index + count, ...; `rank`:
// this CTA's place in a cluster (kClusterN = 2), else 0.
struct Worker {
  int index, count, rank;
};

template <int kBlockN, int kBlockRows, int kClusterN = 1, int kPairN = 1, bool kSplitK = false>
struct GroupedScheduler {
  static_assert(!kSplitK || kClusterN == 1, "split-K: one CTA per unit");
  static_assert(kClusterN == 1 || kClusterN == 2, "clusters of 1 or 2 CTAs along the weight n-blocks");
  static_assert(kPairN == 1 || kPairN == 2, "1 or 2 consecutive n-blocks per CTA and unit");
  static constexpr int kUnitN = kClusterN * kPairN;  // n-blocks per unit of work
  const GroupedProblem& pb;
  int next_tile;         // in units of kClusterN tiles (one per CTA of the cluster)
  int step;
  int rank = 0;          // this CTA's n-block within a unit
  int group = 0;
  int tiles_before = 0;  // units of groups < group
  int64_t g_row0 = 0;
  int g_m = 0;
  const int* table = nullptr;  // build_table's prefix (shared memory), or null: walk
  int splits = 1;              // kSplitK: split-units per unit this launch (needs the table and a workspace)

  // Workspace slots of a problem's split-K space.
  static __device__ __forceinline__ int split_slots(const SplitKSpace& sk) {
    if (sk.partials == nullptr || sk.counters == nullptr) return 0;
    const int64_t by_floats = sk.partial_floats / splitk_slot_floats(kBlockN, kPairN);
    return int(min(int64_t(sk.counter_slots), by_floats));
  }

  // unit_table: the CTA's build_table result (all threads built it and synchronised), or nullptr. w: this
  // CTA's (or, with clusters, its cluster's) worker; both CTAs of a cluster pass the same index and count.
  __device__ GroupedScheduler(const GroupedProblem& p, const int* unit_table, Worker w)
      : pb(p), next_tile(w.index), step(w.count), rank(kClusterN > 1 ? w.rank : 0) {
    if (unit_table != nullptr && pb.num_groups <= kMaxTableGroups) table = unit_table;
    if constexpr (kSplitK) {
      if (table != nullptr && pb.num_groups > 0)
        splits = choose_k_splits(table[pb.num_groups - 1], pb.sk.workers, pb.k / WL::kBlockK,
                                 split_slots(pb.sk));
    }
    load_group();
  }

  // Group g's first row and rows; malformed sizes are clamped to the tensor (never read past it).
  static __device__ __forceinline__ void group_rows(const GroupedProblem& pb, int g, int64_t& row0, int& m) {
    if (pb.layout == GroupLayout::kMasked) {
      row0 = int64_t(g) * pb.max_m;
      m = min(max(load_size(pb.masked_m + g), 0), pb.max_m);
    } else {
      const int64_t a = load_size(pb.group_offsets + g), b = load_size(pb.group_offsets + g + 1);
      row0 = min(max(a, int64_t(0)), pb.rows);
      m = int(max(min(b, pb.rows) - row0, int64_t(0)));
      if (pb.group_counts != nullptr) m = min(m, max(load_size(pb.group_counts + g), 0));
    }
  }
  __device__ __forceinline__ void load_group() {
    if (group < pb.num_groups) group_rows(pb, group, g_row0, g_m);
  }

  static __device__ __forceinline__ int units_per_group_m(int m, int n_units) { return (m + kBlockN - 1) / kBlockN * n_units; }
  static __device__ __forceinline__ int n_units_of(const GroupedProblem& p) { return (p.n / kBlockRows + kUnitN - 1) / kUnitN; }

  // The unit table, built by kTableThreads threads (`tid` 0..383, whole warps, all of them: the CTA,
  // before its roles split) with `scratch` (12 ints of shared memory) and the barrier `bar_id` of those
  // threads. Thread tid takes groups 3 tid .. 3 tid + 2: a local prefix, a warp scan of the thread
  // totals, the 12 warp totals through shared memory. The caller synchronises the table's readers after.
  static constexpr int kTableThreads = 384;  // the whole CTA of the standalone kernels
  static constexpr int kTableGroupsPerThread = (kMaxTableGroups + kTableThreads - 1) / kTableThreads;
  static __device__ __forceinline__ void build_table(const GroupedProblem& p, int* tab, int* scratch, int tid,
                                                     uint32_t bar_id) {
#ifdef __CUDA_ARCH__
    if (p.num_groups > kMaxTableGroups) return;
    constexpr int kPer = kTableGroupsPerThread;
    const int nu = n_units_of(p), lane = tid % 32, warp = tid / 32;
    int v[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {  // the same clamped sizes the walk uses
      const int g = kPer * tid + i;
      int m = 0;
      int64_t r0;
      if (g < p.num_groups) group_rows(p, g, r0, m);
      v[i] = units_per_group_m(m, nu) + (i > 0 ? v[i - 1] : 0);
    }
    int incl = v[kPer - 1];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    if (lane == 31) scratch[warp] = incl;
    __syncwarp();  // the aligned barrier after lane-divergent code: reconverge first (an asm bar.sync does not)
    ptx::named_barrier(bar_id, kTableThreads);
    int before = incl - v[kPer - 1];
    for (int w = 0; w < warp; ++w) before += scratch[w];
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (kPer * tid + i < p.num_groups) tab[kPer * tid + i] = before + v[i];
#else
    (void)scratch, (void)bar_id;
    if (tid == 0 && p.num_groups <= kMaxTableGroups) {  // host builds (tests): the same prefix, serially
      int carry = 0;
      for (int g = 0; g < p.num_groups; ++g) {
        int64_t r0;
        int m;
        group_rows(p, g, r0, m);
        tab[g] = carry += units_per_group_m(m, n_units_of(p));
      }
    }
#endif
  }

  // kSplitK: tile t's K blocks [kb0, kb0 + kbn) (all of them when unsplit).
  __device__ __forceinline__ void k_range(const Tile& t, int& kb0, int& kbn) const {
    const int k_blocks = pb.k / WL::kBlockK, split = t.slot % splits;
    kb0 = split * k_blocks / splits;
    kbn = (split + 1) * k_blocks / splits - kb0;
  }

  __device__ bool next(Tile& t) {
    const int n_blocks = pb.n / kBlockRows;  // kPairN == 2: even (the launcher checks)
    const int n_units = n_units_of(pb);
    // The unit of this split-unit (kSplitK; else the split-unit is the unit).
    const int u = kSplitK ? next_tile / splits : next_tile;
    if (table != nullptr) {
      // The first group g >= group with table[g] > u (the table is non-decreasing).
      int lo = group, hi = pb.num_groups;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (table[mid] > u) hi = mid;
        else lo = mid + 1;
      }
      if (lo >= pb.num_groups) {
        group = pb.num_groups;
        return false;
      }
      if (lo != group) {
        group = lo;
        tiles_before = lo > 0 ? table[lo - 1] : 0;
        load_group();
      }
    }
    while (group < pb.num_groups) {
      const int m_blocks = (g_m + kBlockN - 1) / kBlockN;
      const int tiles = m_blocks * n_units;
      if (u < tiles_before + tiles) {
        const int local = u - tiles_before;
        const int mb = local % m_blocks;
        t.group = group;
        t.n_block = ((local / m_blocks) * kClusterN + rank) * kPairN;
        t.row0 = g_row0 + int64_t(mb) * kBlockN;
        t.rows = min(kBlockN, g_m - mb * kBlockN);
        if constexpr (kClusterN > 1) {
          if (t.n_block >= n_blocks) {  // the last unit has no n-block(s) for rank 1: dummy tile(s)
            t.n_block = n_blocks - kPairN;
            t.rows = 0;
          }
        }
        if constexpr (kSplitK) t.slot = next_tile;
        next_tile += step;
        return true;
      }
      tiles_before += tiles;
      ++group;
      load_group();
    }
    return false;
  }
};

}  // namespace fp4_gemm
