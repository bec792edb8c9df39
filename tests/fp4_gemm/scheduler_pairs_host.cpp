// Host-side check of GroupedScheduler (scheduler.cuh) for 2-CTA clusters, compiled by
// test_scheduler_pairs.py (the scheduler takes its worker from the caller: no intrinsics): for random grouped problems
// (contiguous and masked, empty groups, odd n-block counts, any number of clusters), the two CTAs of
// every cluster walk the same token-tile sequence (lock-step), rank 0 always has a real tile, rank 1
// gets n-block + 1 or a dummy (rows 0) only past the last n-block, and the real tiles of all CTAs are
// exactly the tiles of the 1-CTA scheduler, each once. Split-K (kSplitK): every unit's splits cover its
// K blocks exactly once, in split order, each on its own workspace slot, with the split count of
// choose_k_splits. Prints "ok <runs>" or the first failure.
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
#define __host__
#define __forceinline__ inline
inline int __ldg(const int* p) { return *p; }
#include "scheduler_stripped.h"  // scheduler.cuh without its ptx.cuh include

using namespace fp4_gemm;
using Key = std::tuple<int, int, int64_t, int>;  // group, n_block, row0, rows

// choose_k_splits before its divisions became 32-bit (64-bit throughout): the two must agree for every
// input with workers <= kMaxSplitWorkers (the launchers pass 2 x SMs).
static int choose_k_splits_ref64(int units, int workers, int k_blocks, int slots) {
  if (units <= 0 || workers <= 0) return 1;
  int best = 1;
  int64_t best_num = (int64_t(units) + workers - 1) / workers * k_blocks;
  for (int s = 2; s <= kMaxKSplits; ++s) {
    if (int64_t(units) * s > slots || k_blocks / s < kMinSplitKBlocks) break;
    const int64_t num = (int64_t(units) * s + workers - 1) / workers * (k_blocks + kSplitOverheadBlocks * s);
    if (num * best * 32 < best_num * s * 31) best = s, best_num = num;
  }
  return best;
}

int main() {
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) {  // small and huge units, slots up to INT_MAX
    const int units = (i % 3 == 0) ? int(rng() % 2000) : int(rng() % 0x7fffffffu);
    const int workers = 1 + int(rng() % (i % 2 ? 2048u : unsigned(kMaxSplitWorkers))), k_blocks = 1 + int(rng() % 512);
    const int slots = (i % 2 == 0) ? int(rng() % 100000) : int(rng() % 0x7fffffffu);
    const int a = choose_k_splits(units, workers, k_blocks, slots);
    const int b = choose_k_splits_ref64(units, workers, k_blocks, slots);
    if (a != b) {
      std::printf("FAIL choose_k_splits(%d, %d, %d, %d) = %d, 64-bit %d\n", units, workers, k_blocks, slots, a, b);
      return 1;
    }
  }
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
        GroupedScheduler<128, 128, 2> s(pb, nullptr, {int(c), int(clusters), int(r)});
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
    GroupedScheduler<128, 128, 1> s1(pb, nullptr, {0, 1, 0});
    Tile t;
    while (s1.next(t)) ref[{t.group, t.n_block, t.row0, t.rows}] += 1;
    if (!why && seen != ref) why = "real tiles differ from the 1-CTA scheduler's";
    if (why) {
      printf("FAIL trial %d (G %d, n %d, layout %d, clusters %u): %s\n", trial, G, pb.n, int(pb.layout), clusters, why);
      return 1;
    }
  }
  // Pairs along N (kPairN = 2, the L1 epilogue), without and with clusters, contiguous groups with
  // optional per-group counts (pool padding skipped): next() returns units whose first n-block is
  // even; the CTA runs it and the next one (as the kernels do), and the real tiles are the 1-CTA
  // scheduler's, each once.
  for (int trial = 0; trial < runs; ++trial) {
    GroupedProblem pb{};
    const int G = 1 + rng() % 6;
    pb.num_groups = G;
    pb.n = 256 * (1 + rng() % 4);
    pb.k = 128;
    pb.layout = GroupLayout::kContiguous;
    std::vector<int> offs(G + 1), counts(G);
    for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + ((rng() % 3 == 0) ? 0 : int(rng() % 400));
    for (int g = 0; g < G; ++g) counts[g] = int(rng() % 450);
    pb.rows = offs[G];
    pb.group_offsets = offs.data();
    pb.group_counts = (trial & 1) ? counts.data() : nullptr;
    const int n_blocks = pb.n / 128;
    const int cl = (trial & 2) ? 2 : 1;
    const unsigned units = 1 + rng() % 70;
    std::map<Key, int> seen, ref;
    const char* why = nullptr;
    for (unsigned c = 0; c < units && !why; ++c)
      for (unsigned r = 0; r < unsigned(cl) && !why; ++r) {
        std::vector<Tile> seq;
        Tile t;
        auto both = [&](Tile u) { seq.push_back(u); ++u.n_block; seq.push_back(u); };
        // With the shared-memory unit table (built on the host by build_table's serial branch) the
        // CTA must walk exactly the same units as without it.
        std::vector<int> tab(kMaxTableGroups);
        std::vector<Tile> with_table;
        auto same = [](const Tile& a, const Tile& b) {
          return a.group == b.group && a.n_block == b.n_block && a.row0 == b.row0 && a.rows == b.rows;
        };
        if (cl == 2) {
          GroupedScheduler<128, 128, 2, 2>::build_table(pb, tab.data(), nullptr, 0, 0);
          GroupedScheduler<128, 128, 2, 2> s(pb, nullptr, {int(c), int(units), int(r)}),
              st(pb, tab.data(), {int(c), int(units), int(r)});
          while (s.next(t)) both(t);
          while (st.next(t)) with_table.push_back(t);
        } else {
          GroupedScheduler<128, 128, 1, 2>::build_table(pb, tab.data(), nullptr, 0, 0);
          GroupedScheduler<128, 128, 1, 2> s(pb, nullptr, {int(c), int(units), 0}), st(pb, tab.data(), {int(c), int(units), 0});
          while (s.next(t)) both(t);
          while (st.next(t)) with_table.push_back(t);
        }
        if (with_table.size() * 2 != seq.size()) why = "the unit table changes the number of units";
        for (size_t i = 0; i < with_table.size() && !why; ++i)
          if (!same(with_table[i], seq[2 * i])) why = "the unit table changes a unit";
        for (size_t i = 0; i + 1 < seq.size() && !why; i += 2) {
          const Tile &a = seq[i], &b = seq[i + 1];
          if (a.group != b.group || a.row0 != b.row0 || a.rows != b.rows) why = "pair halves on different token tiles";
          else if (a.n_block % 2 != 0) why = "a unit's first n-block is odd";
          for (const Tile* u : {&a, &b})
            if (u->rows > 0) {
              if (u->n_block >= n_blocks || u->row0 + u->rows > pb.rows) why = "tile out of range";
              seen[{u->group, u->n_block, u->row0, u->rows}] += 1;
            }
        }
      }
    GroupedScheduler<128, 128, 1> s1(pb, nullptr, {0, 1, 0});
    Tile t;
    while (s1.next(t)) ref[{t.group, t.n_block, t.row0, t.rows}] += 1;
    for (auto& kv : ref) {  // the 1-CTA reference, counts applied by hand
      const int g = std::get<0>(kv.first);
      const int64_t end = offs[g] + (pb.group_counts ? std::min(counts[g], offs[g + 1] - offs[g]) : offs[g + 1] - offs[g]);
      if (std::get<2>(kv.first) + std::get<3>(kv.first) > end) why = "a tile past the group's count";
    }
    if (!why && seen != ref) why = "paired real tiles differ from the 1-CTA scheduler's";
    if (why) {
      printf("FAIL pairs trial %d (G %d, n %d, cluster %d, units %u): %s\n", trial, G, pb.n, cl, units, why);
      return 1;
    }
  }
  // Split-K (kSplitK, the unit table): splits = choose_k_splits(units, workers, k_blocks, slots); the
  // split-units of all CTAs are the unsplit units times their splits, each unit's K ranges partition
  // [0, k_blocks) in split order, slot = unit * splits + split (unique, inside the workspace).
  int split_trials = 0;  // trials that did split (the checks below must not pass vacuously)
  for (int trial = 0; trial < runs; ++trial) {
    GroupedProblem pb{};
    const int G = 1 + rng() % 8;
    pb.num_groups = G;
    pb.n = 256 * (1 + rng() % 4);
    pb.k = 128 * (1 + rng() % 64);
    pb.layout = GroupLayout::kContiguous;
    std::vector<int> offs(G + 1);
    for (int g = 0; g < G; ++g) offs[g + 1] = offs[g] + ((rng() % 3 == 0) ? 0 : int(rng() % 40));
    pb.rows = offs[G];
    pb.group_offsets = offs.data();
    static float fake_partials[1];
    static uint32_t fake_counters[1];
    const int slots = int(rng() % 2000);
    pb.sk = SplitKSpace{fake_partials, fake_counters, int64_t(1) << 40, slots, int(1 + rng() % 300)};
    const unsigned ctas = 1 + rng() % 300;
    using S1 = GroupedScheduler<8, 128, 1, 2, false>;
    using SK = GroupedScheduler<8, 128, 1, 2, true>;
    std::vector<int> tab(kMaxTableGroups);
    S1::build_table(pb, tab.data(), nullptr, 0, 0);
    const int k_blocks = pb.k / 128, units = G > 0 ? tab[G - 1] : 0;
    const int want = choose_k_splits(units, pb.sk.workers, k_blocks, SK::split_slots(pb.sk));
    std::map<std::tuple<int, int, int64_t, int>, std::vector<std::pair<int, int>>> ranges;  // unit -> (split, kb0)
    std::map<int, int> slot_seen;
    const char* why = nullptr;
    int splits = 0;
    for (unsigned c = 0; c < ctas && !why; ++c) {
      SK s(pb, tab.data(), {int(c), int(ctas), 0});
      splits = s.splits;
      if (s.splits != want) why = "splits differ from choose_k_splits";
      Tile t;
      while (!why && s.next(t)) {
        int kb0, kbn;
        s.k_range(t, kb0, kbn);
        if (kbn < 1 || kb0 < 0 || kb0 + kbn > k_blocks) why = "K range out of bounds";
        if (t.slot < 0 || t.slot >= units * s.splits || ++slot_seen[t.slot] > 1) why = "slot out of range or reused";
        ranges[{t.group, t.n_block, t.row0, t.rows}].push_back({t.slot % s.splits, kb0 * 1000 + kbn});
        if (int(unsigned(t.slot) % ctas) != int(c)) why = "split-unit not on CTA slot % grid";
      }
    }
    std::map<std::tuple<int, int, int64_t, int>, int> ref;
    S1 s1(pb, tab.data(), {0, 1, 0});
    Tile t;
    while (s1.next(t)) ref[{t.group, t.n_block, t.row0, t.rows}] += 1;
    if (!why && ref.size() != ranges.size()) why = "split units differ from the unsplit units";
    for (auto& kv : ranges) {
      if (why) break;
      if (!ref.count(kv.first)) { why = "a split unit the unsplit scheduler has not"; break; }
      auto v = kv.second;
      std::sort(v.begin(), v.end());
      if (int(v.size()) != splits) { why = "a unit without all its splits"; break; }
      int next = 0;
      for (int i = 0; i < splits && !why; ++i) {
        if (v[i].first != i || v[i].second / 1000 != next) why = "K ranges not a partition in split order";
        next += v[i].second % 1000;
      }
      if (!why && next != k_blocks) why = "K ranges do not cover K";
    }
    split_trials += splits > 1;
    if (why) {
      printf("FAIL split-K trial %d (G %d, n %d, k %d, ctas %u, splits %d): %s\n", trial, G, pb.n, pb.k, ctas, splits,
             why);
      return 1;
    }
  }
  if (split_trials < runs / 4) {
    printf("FAIL split-K: only %d of %d trials split\n", split_trials, runs);
    return 1;
  }
  printf("ok %d\n", 3 * runs);
  return 0;
}
