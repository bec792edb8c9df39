// Persistent tile scheduler shared by the contiguous and masked grouped layouts.
// Tiles are enumerated group by group; inside a group the token block varies fastest, so CTAs
// running at the same time share a weight block (read once from HBM, then from L2).
// Group sizes are read from device memory (no host sync), the same way by every thread, so all
// warp roles of a CTA walk the same tile sequence.
#pragma once
#include <cstdint>

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
  const int* masked_m;       // masked: [G] valid rows per group (<= max_m)
};

struct Tile {
  int group;
  int n_block;
  int64_t row0;  // first activation / output row of this tile
  int rows;      // valid rows (tokens) in this tile, 1..BLOCK_N
};

template <int kBlockN, int kBlockRows>
struct GroupedScheduler {
  const GroupedProblem& pb;
  int next_tile;
  int group = 0;
  int tiles_before = 0;  // tiles of groups < group
  int64_t g_row0 = 0;
  int g_m = 0;

  __device__ GroupedScheduler(const GroupedProblem& p) : pb(p), next_tile(blockIdx.x) { load_group(); }

  // Reads group `group`'s rows; malformed sizes are clamped to the tensor (never read past it).
  __device__ void load_group() {
    if (group >= pb.num_groups) return;
    if (pb.layout == GroupLayout::kMasked) {
      g_row0 = int64_t(group) * pb.max_m;
      g_m = min(max(__ldg(pb.masked_m + group), 0), pb.max_m);
    } else {
      const int64_t a = __ldg(pb.group_offsets + group), b = __ldg(pb.group_offsets + group + 1);
      g_row0 = min(max(a, int64_t(0)), pb.rows);
      g_m = int(max(min(b, pb.rows) - g_row0, int64_t(0)));
    }
  }

  __device__ bool next(Tile& t) {
    const int n_blocks = pb.n / kBlockRows;
    while (group < pb.num_groups) {
      const int m_blocks = (g_m + kBlockN - 1) / kBlockN;
      const int tiles = m_blocks * n_blocks;
      if (next_tile < tiles_before + tiles) {
        const int local = next_tile - tiles_before;
        const int mb = local % m_blocks;
        t.group = group;
        t.n_block = local / m_blocks;
        t.row0 = g_row0 + int64_t(mb) * kBlockN;
        t.rows = min(kBlockN, g_m - mb * kBlockN);
        next_tile += gridDim.x;
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
