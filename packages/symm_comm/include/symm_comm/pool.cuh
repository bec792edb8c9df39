// symm_comm/pool.cuh — the expert-major pool layout, computed redundantly by every worker group from
// the per-(local expert, source) row counts (no extra grid barrier). Deterministic: inside a local
// expert's segment rows are ordered by source rank, then by the source's slot order (token, then k).
//   contiguous: expert le's segment starts at le_start[le] = sum_{l < le} align_up(count[l], block_m);
//   masked:     le_start[le] = le * max_m (capacity max_m rows per expert).
// pos[le][s] = first pool row of (le, s); src_prefix[s][le] = rows of source s in experts < le, used to
// enumerate work source-interleaved: work item q -> (source, j-th row of that source).
// Code size: code that runs once per call (these tables, the scans) is kept rolled (#pragma unroll 1)
// and the pull's per-row body is inlined once. Measured on H200 (experiments/icache_probe.py): an SM runs
// straight-line code it has not cached at only ~4-10 KB of SASS per us; the dispatch kernels had grown
// to 205-308 KB. Halving them gave -0.6..-0.8 us per 1-token call (L2 stays warm across calls), so
// this is about not letting the code grow back, not a large speed lever.
#pragma once
#include <stdint.h>
#include "symm_comm/layout.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

// Shared-memory ints the tables need (host and device).
SYMM_LAYOUT_HD int64_t symm_tables_smem_ints(const SymmLayout* L) {
  const int64_t Lx = L->num_local_experts, R = L->num_ranks;
  return 2 * Lx * R + R * (Lx + 1) + (Lx + 1) + Lx + 64;
}

#if defined(__CUDACC__)
namespace symm {

struct PoolTables {
  int32_t* cnt;         // [L * R]
  int32_t* pos;         // [L * R]
  int32_t* src_prefix;  // [R * (L + 1)]
  int32_t* le_start;    // [L + 1]; le_start[L] = rows used (U)
  int32_t* le_count;    // [L]
  int32_t* scratch;     // [64]: [kNoDedup], [kMaskedOverflow]
  // scratch word: 1 = some (le, source) count above max_tokens in this call (a slot overflow, already
  // reported by the source): its rows past max_tokens were never sent, so a leader may be missing;
  // the pull then copies every row itself (dispatch.cuh pull_rows) and no row is left unwritten.
  static constexpr int kNoDedup = 0;
  // scratch word (masked layout): the smallest local expert whose rows exceed max_m, or Lx if none;
  // set while the tables are built, so check_capacity is O(1) (was a loop over Lx in every thread:
  // ncu, 1 rank, masked 128 tokens: 256 dependent shared loads per warp, ~1/3 of the kernel's samples).
  static constexpr int kMaskedOverflow = 1;

  __device__ __forceinline__ static PoolTables carve(int32_t* smem, const SymmLayout& L) {
    const int Lx = L.num_local_experts, R = L.num_ranks;
    PoolTables t;
    t.cnt = smem;
    t.pos = t.cnt + Lx * R;
    t.src_prefix = t.pos + Lx * R;
    t.le_start = t.src_prefix + R * (Lx + 1);
    t.le_count = t.le_start + Lx + 1;
    t.scratch = t.le_count + Lx;
    return t;
  }
  __device__ __forceinline__ int32_t src_total(const SymmLayout& L, int s) const {
    return src_prefix[s * (L.num_local_experts + 1) + L.num_local_experts];
  }
};

// Exclusive scan of value(i), i < n, by ONE warp; out[n] = total.
template <typename F>
__device__ __forceinline__ void warp_exclusive_scan(int n, F value, int32_t* out, int lane) {
  int32_t carry = 0;
#pragma unroll 1  // cold code: unrolled copies only cost instruction fetch (pool.cuh "Code size")
  for (int base = 0; base < n; base += 32) {
    const int i = base + lane;
    const int32_t v = i < n ? value(i) : 0;
    const int32_t incl = warp_inclusive_scan(v, lane);
    if (i < n) out[i] = carry + incl - v;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) out[n] = carry;
}

// Exclusive scan of value(i), i < n, by ALL threads of the group (each scans a contiguous run, then
// warp + cross-warp scans); out[n] = total. scratch: >= 33 ints of group-private shared memory.
// value() must read only memory that is stable across the call (it is evaluated twice).
template <typename F>
__device__ __forceinline__ void group_exclusive_scan(const Workers& W, int n, F value, int32_t* out,
                                                     int32_t* scratch) {
  const int nt = W.nthreads(), tid = W.tid();
  const int per = (n + nt - 1) / nt;
  const int beg = min(n, tid * per), end = min(n, beg + per);
  int32_t sum = 0;
#pragma unroll 1
  for (int i = beg; i < end; ++i) sum += value(i);
  const int32_t incl = warp_inclusive_scan(sum, W.lane);
  if (W.lane == 31) scratch[W.warp] = incl;
  W.sync();
  if (W.warp == 0) {
    const int32_t v = W.lane < W.nwarps ? scratch[W.lane] : 0;
    const int32_t inc2 = warp_inclusive_scan(v, W.lane);
    if (W.lane < W.nwarps) scratch[W.lane] = inc2 - v;
    if (W.lane == 31) scratch[32] = inc2;
  }
  W.sync();
  int32_t run = scratch[W.warp] + incl - sum;
#pragma unroll 1
  for (int i = beg; i < end; ++i) {
    out[i] = run;
    run += value(i);
  }
  if (tid == 0) out[n] = scratch[32];
  W.sync();
}

// Largest le in [0, n) with arr[le] <= j (arr non-decreasing, arr[0] <= j < arr[n]).
__device__ __forceinline__ int find_segment(const int32_t* arr, int n, int32_t j) {
  int lo = 0, hi = n;
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (arr[mid] <= j) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Builds the tables. counts: [L][R] rows (global memory; read coherently, a peer may have written
// it; raw totals, clamped here to max_tokens, kNoDedup set if any was above). Segment starts: masked
// le * max_m; contiguous the block_m-aligned prefix. All threads of the group call it.
__device__ __forceinline__ void build_pool_tables(const Workers& W, const SymmLayout& L, const PoolTables& t,
                                                  const int32_t* counts, bool masked) {
  const int Lx = L.num_local_experts, R = L.num_ranks, T = L.max_tokens;
  if (W.tid() == 0) {  // set below, after a sync
    t.scratch[PoolTables::kNoDedup] = 0;
    t.scratch[PoolTables::kMaskedOverflow] = Lx;
  }
  // The counts are read from global memory once: a count above T is kept as T + 1 in shared memory
  // and clamped by the second loop, which also sets the flag (a second coherent read of the raw counts
  // there cost one more L2 round trip on every CTA's critical path: the tables 2.0 -> 1.6 us,
  // stamps of next/icache-probe, 2 x H200).
#pragma unroll 1
  for (int i = W.tid(); i < Lx * R; i += W.nthreads()) {
    int32_t c = ptx::ld_relaxed_sys_s32(counts + i);
    t.cnt[i] = c < 0 ? 0 : (c > T ? T + 1 : c);
  }
  W.sync();
#pragma unroll 1
  for (int le = W.tid(); le < Lx; le += W.nthreads()) {
    int32_t c = 0;
    bool over = false;
#pragma unroll 1
    for (int s = 0; s < R; ++s) {
      int32_t v = t.cnt[le * R + s];
      if (v > T) {  // only this thread touches entries le * R + s until the next sync
        over = true;
        v = T;
        t.cnt[le * R + s] = v;
      }
      c += v;
    }
    t.le_count[le] = c;
    if (over) t.scratch[PoolTables::kNoDedup] = 1;
    if (masked && c > L.max_m) atomicMin(t.scratch + PoolTables::kMaskedOverflow, le);
  }
  W.sync();
#pragma unroll 1
  for (int job = W.warp; job < R + 1; job += W.nwarps) {
    if (job == 0) {
      if (masked) {
#pragma unroll 1
        for (int i = W.lane; i <= Lx; i += 32) t.le_start[i] = i * L.max_m;
      } else {
        const int32_t* cnts = t.le_count;
        const int bm = L.block_m;
        warp_exclusive_scan(Lx, [&](int i) { return (cnts[i] + bm - 1) / bm * bm; }, t.le_start, W.lane);
      }
    } else {
      const int s = job - 1;
      const int32_t* c = t.cnt;
      warp_exclusive_scan(Lx, [&](int le) { return c[le * R + s]; }, t.src_prefix + s * (Lx + 1), W.lane);
    }
  }
  W.sync();
#pragma unroll 1
  for (int le = W.tid(); le < Lx; le += W.nthreads()) {
    int32_t p = t.le_start[le];
#pragma unroll 1
    for (int s = 0; s < R; ++s) {
      t.pos[le * R + s] = p;
      p += t.cnt[le * R + s];
    }
  }
  W.sync();
}

// Maps work item j of source s (0 <= j < src_total(s)) to its pool row.
__device__ __forceinline__ int32_t pool_row_of(const SymmLayout& L, const PoolTables& t, int s, int32_t j, int* le_out,
                                               int32_t* slot_out) {
  const int Lx = L.num_local_experts;
  const int32_t* pre = t.src_prefix + s * (Lx + 1);
  const int le = find_segment(pre, Lx, j);
  const int32_t slot = j - pre[le];
  *le_out = le;
  *slot_out = slot;
  return t.pos[le * L.num_ranks + s] + slot;
}

// Work items of the interleaved order: R * (largest per-source row count).
__device__ __forceinline__ int32_t pool_work_items(const SymmLayout& L, const PoolTables& t) {
  int32_t max_total = 0;
  for (int s = 0; s < L.num_ranks; ++s) max_total = max(max_total, t.src_total(L, s));
  return L.num_ranks * max_total;
}

// Work item q -> source s = (q + rank) % R, j = q / R -> fn(s, row, le, slot) if source s has a j-th row.
template <class Fn>
__device__ __forceinline__ void pool_item(const SymmLayout& L, const PoolTables& t, int32_t q, Fn&& fn) {
  const int s = (q + L.rank) % L.num_ranks;
  const int32_t j = q / L.num_ranks;
  if (j >= t.src_total(L, s)) return;
  int le;
  int32_t slot;
  const int32_t row = pool_row_of(L, t, s, j, &le, &slot);
  fn(s, row, le, slot);
}

// Calls fn(s, row, le, slot) for every pool row of the last dispatch, one warp per row, in work-item
// order (pool_item): the warps in flight at any time spread over all sources, so every NVLink link
// stays busy. Two ways to hand out the items, one loop (fn is inlined ONCE: see "Code size" above):
//   ctr == nullptr: static stride, warp w takes items w, w + total_warps, ...
//   ctr != nullptr: warps grab one item at a time from a local counter (dispatch's pull). Why: the
//     static stride (total warps) is a multiple of R on every usual grid (132 CTAs x 16 warps), so a
//     warp always pulls from ONE source: for R = 2 half the warps copy only local rows
//     (HBM, done early) and the remote rows are split statically over the other half; a warp that the
//     fabric serves slowly cannot hand its rows to one that is served fast (measured: CTA finish times
//     spread 224..400 us at 4096 tokens). With the counter every warp pulls from every source and the
//     fast ones take more rows.
// ctr: u32 in this rank's own memory, 0 when the call starts (dispatch zeroes the idle parity's
// counter, csrc/dispatch.cu); it may end above nq. Memory ordering: the counter only hands out indices
// into tables every group built itself (shared memory); no data is published through it, so relaxed
// gpu-scope atomics suffice, and the rows' own publication (arrivals red.release) is unchanged.
// One grab per item, after the previous item: the atomic's local round trip (~1 us) is not
// hidden (see ptx::atom_add_relaxed_gpu_u32), but while thousands of warps have rows in flight it
// does not cost link throughput; at the end a warp holds no reserved work while others are idle.
template <class Fn>
__device__ __forceinline__ void for_each_pool_row(const Workers& W, const SymmLayout& L, const PoolTables& t,
                                                  uint32_t* ctr, Fn&& fn) {
  const int32_t nq = pool_work_items(L, t);  // R * T * K < 2^31 (symm_layout_compute)
  const int32_t step = W.total_warps();
  int32_t q = (int32_t)W.gwarp();  // q < nq + step < 2^31
#pragma unroll 1
  for (;;) {
    if (ctr) {
      int32_t cur = 0;
      if (W.lane == 0) cur = (int32_t)ptx::atom_add_relaxed_gpu_u32(ctr, 1u);
      q = __shfl_sync(0xffffffffu, cur, 0);
    }
    if (q >= nq) break;  // counter mode: every later grab is past nq too
    pool_item(L, t, q, fn);
    q += step;  // static stride (counter mode: overwritten by the next grab)
  }
}

// Is pool row r (r < U) a real row (not padding)?
__device__ __forceinline__ bool pool_row_valid(const SymmLayout& L, const PoolTables& t, int32_t r) {
  const int Lx = L.num_local_experts;
  if (r >= t.le_start[Lx]) return false;
  const int le = find_segment(t.le_start, Lx, r);
  return r - t.le_start[le] < t.le_count[le];
}

}  // namespace symm
#endif
