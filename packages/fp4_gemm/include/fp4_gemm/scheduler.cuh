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

#include "fp4_gemm/ptx.cuh"

namespace fp4_gemm {

enum class GroupLayout : int { kContiguous = 0, kMasked = 1 };

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
};


struct Tile {
  int group;
  int n_block;
  int64_t row0;  // first activation / output row of this tile
  int rows;      // valid rows (tokens) in this tile, 1..BLOCK_N; 0: a cluster's dummy tile (never stored)
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

template <int kBlockN, int kBlockRows, int kClusterN = 1, int kPairN = 1>
struct GroupedScheduler {
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

  // unit_table: the CTA's build_table result (all threads built it and synchronised), or nullptr.
  __device__ GroupedScheduler(const GroupedProblem& p, const int* unit_table = nullptr) : pb(p) {
    if (unit_table != nullptr && pb.num_groups <= kMaxTableGroups) table = unit_table;
    if constexpr (kClusterN == 1) {
      next_tile = blockIdx.x;
      step = gridDim.x;
    } else {
      next_tile = int(ptx::cluster_id_x());
      step = int(ptx::num_clusters_x());
      rank = int(ptx::cluster_ctarank());
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

  __device__ bool next(Tile& t) {
    const int n_blocks = pb.n / kBlockRows;  // kPairN == 2: even (the launcher checks)
    const int n_units = n_units_of(pb);
    if (table != nullptr) {
      // The first group g >= group with table[g] > next_tile (the table is non-decreasing).
      int lo = group, hi = pb.num_groups;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (table[mid] > next_tile) hi = mid;
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
      if (next_tile < tiles_before + tiles) {
        const int local = next_tile - tiles_before;
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
