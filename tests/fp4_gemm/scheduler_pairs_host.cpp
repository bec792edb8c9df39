// Host-side check of GroupedScheduler (scheduler.cuh) for 2-CTA clusters, compiled by
// test_scheduler_pairs.py with the device intrinsics stubbed: for random grouped problems
// (contiguous and masked, empty groups, odd n-block counts, any number of clusters), the two CTAs of
// every cluster walk the same token-tile sequence (lock-step), rank 0 always has a real tile, rank 1
// gets n-block + 1 or a dummy (rows 0) only past the last n-block, and the real tiles of all CTAs are
// exactly the tiles of the 1-CTA scheduler, each once. Prints "ok <runs>" or the first failure.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <tuple>
#include <vector>
using std::max;
using std::min;
#define __device__
struct Dim3 { unsigned x; };
static Dim3 blockIdx, gridDim;
static unsigned g_rank, g_cluster, g_clusters;
namespace fp4_gemm::ptx {
inline uint32_t cluster_id_x() { return g_cluster; }
inline uint32_t num_clusters_x() { return g_clusters; }
inline uint32_t cluster_ctarank() { return g_rank; }
}  // namespace fp4_gemm::ptx
inline int __ldg(const int* p) { return *p; }
#include "scheduler_stripped.h"  // scheduler.cuh without its ptx.cuh include

using namespace fp4_gemm;
using Key = std::tuple<int, int, int64_t, int>;  // group, n_block, row0, rows

int main() {
  std::mt19937 rng(12345);
  const int runs = 4000;
  for (int trial = 0; trial < runs; ++trial) {
    GroupedProblem pb{};
    const int G = 1 + rng() % 6;
    pb.num_groups = G;
    pb.n = 128 * (1 + rng() % 7);
    pb.k = 128;
    pb.layout = (trial & 1) ? GroupLayout::kMasked : GroupLayout::kContiguous;
    std::vector<int> sizes(G), offs(G + 1), masked(G);
    for (int g = 0; g < G; ++g) sizes[g] = (rng() % 3 == 0) ? 0 : int(rng() % 400);
    if (pb.layout == GroupLayout::kMasked) {
      pb.max_m = 1 + rng() % 400;
      for (int g = 0; g < G; ++g) masked[g] = min(sizes[g], pb.max_m);
      pb.rows = int64_t(G) * pb.max_m;
      pb.masked_m = masked.data();
    } else {
      for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + sizes[g];
      pb.rows = offs[G];
      pb.group_offsets = offs.data();
    }
    const int n_blocks = pb.n / 128;
    const unsigned clusters = 1 + rng() % 70;
    std::map<Key, int> seen, ref;
    const char* why = nullptr;
    for (unsigned c = 0; c < clusters && !why; ++c) {
      std::vector<Tile> seq[2];
      for (unsigned r = 0; r < 2; ++r) {
        g_rank = r, g_cluster = c, g_clusters = clusters;
        blockIdx.x = 2 * c + r, gridDim.x = 2 * clusters;
        GroupedScheduler<128, 128, 2> s(pb);
        Tile t;
        while (s.next(t)) seq[r].push_back(t);
      }
      if (seq[0].size() != seq[1].size()) why = "ranks walk different numbers of tiles";
      for (size_t i = 0; i < seq[0].size() && !why; ++i) {
        const Tile &a = seq[0][i], &b = seq[1][i];
        if (a.group != b.group || a.row0 != b.row0) why = "ranks on different token tiles";
        else if (a.rows <= 0 || a.n_block % 2 != 0) why = "rank 0 without a real even n-block";
        else if (b.rows > 0 && (b.n_block != a.n_block + 1 || b.rows != a.rows)) why = "rank 1 not on n-block + 1";
        else if (b.rows == 0 && (b.n_block != a.n_block || a.n_block != n_blocks - 1)) why = "dummy tile not at the odd end";
        for (const Tile* t : {&a, &b})
          if (t->rows > 0) {
            if (t->n_block >= n_blocks || t->row0 + t->rows > pb.rows) why = "tile out of range";
            seen[{t->group, t->n_block, t->row0, t->rows}] += 1;
          }
      }
    }
    blockIdx.x = 0, gridDim.x = 1;
    GroupedScheduler<128, 128, 1> s1(pb);
    Tile t;
    while (s1.next(t)) ref[{t.group, t.n_block, t.row0, t.rows}] += 1;
    if (!why && seen != ref) why = "real tiles differ from the 1-CTA scheduler's";
    if (why) {
      printf("FAIL trial %d (G %d, n %d, layout %d, clusters %u): %s\n", trial, G, pb.n, int(pb.layout), clusters, why);
      return 1;
    }
  }
  printf("ok %d\n", runs);
  return 0;
}
