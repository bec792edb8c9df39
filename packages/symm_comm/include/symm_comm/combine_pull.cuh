// symm_comm/combine_pull.cuh — the pull EP combine (layout v8: cmb_in_rows > 0) as device functions over a
// Workers range. combine_pull_run_all is the whole phase; the standalone kernel (csrc/combine.cu) is
// begin_call -> combine_pull_run_all<.., Order::kKernelBoundary> -> combine_end over Workers::cta(); a
// fused kernel runs the same with Order::kInKernel after a grid barrier (contract below).
#pragma once
#include <stdint.h>
#include "symm_comm/barrier.cuh"
#include "symm_comm/combine.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

#if defined(__CUDACC__)
namespace symm {

// Every rank's producer wrote its expert outputs into its own cmb_in region (pool row order) before the
// call; each rank then READS the rows of its own tokens from the owners and reduces them in registers:
//   y[t] = BF16( sum over k in kmask[t], in order, of [w[t,k] *] cmb_in@owner(t,k)[row(t,k)] )
// with (owner, row) from cmb_map (written by the owners in the dispatch). No combine buffer, no per-token
// counters, no second pass: the local rows and the reduction overlap the remote reads, and a token's
// rows are read once. Same FP32 arithmetic and order as combine_reduce_item (the results are identical).
// Start contract (combine_pull_start): an owner signals combine_signal(epoch, pull = true, *) after every
// write a reader needs (its cmb_in rows, the cmb_map entries its dispatch stored into the readers,
// the readers' own kmask... from the same dispatch); a reader acquires (ld.acquire.sys) that signal of
// EVERY rank before its first cmb_map / cmb_in load (group barrier after the acquiring threads), so it
// sees them. What orders the owner's writes before its signal, by Order:
//   kKernelBoundary (standalone): they were made by EARLIER kernels on the owner's stream (the producer
//     of cmb_in, the dispatch), and the signal is red.relaxed.sys.max: the kernel boundary, not a release,
//     publishes them. Not justified by the PTX model, which has no kernel boundary (a grid ends after
//     its stores are acknowledged; peers read this GPU's memory through its L2); a launch with
//     programmatic dependent launch (which may start before the previous kernel ends) must not use it.
//     Why: the release's MEMBAR.SYS in group 0 sits on the handshake's path: -1.2 us at 1 and at 128
//     tokens (2 x H200, perf notes).
//   kInKernel (fused, same launch): the CALLER runs a grid barrier of all its groups (grid_barrier_gpu)
//     after the dispatch and the cmb_in writes and before combine_pull_start; group 0's signal is then
//     red.release.sys.max, cumulative over every group's writes through the barrier's gpu-scope
//     release / acquire (causality order is transitive across the two scopes).
// WAR: the owner's producer rewrites cmb_in only after its next dispatch passed the one-hop barrier,
// which needs this rank's arrival, i.e. after our combine ended.

// Thread r < R of every group: waits until rank r started this pull combine (its word >= epoch * 4).
// A word of this epoch without the pull bit is rank r's PUSH combine of this epoch: the ranks disagree on
// the mode (SYMM_ERR_COMBINE_MODE, what = r) — reported, never read as rows. Returns false on error /
// timeout.
__device__ __forceinline__ bool pull_wait_started(uint64_t local, const SymmLayout& L, uint64_t epoch, int r,
                                                  uint64_t deadline, const ErrSink& err) {
  if (r >= L.num_ranks) return true;
  // The mode check uses the word the wait observed (no second load; measured: handshake 1.1-1.3 -> 0.8-0.9
  // us at 128 tokens, 2 x H200). The same answer as a later read: a pull call of this epoch only ever
  // writes words with the pull bit set, a push call words without it, and a later epoch's word fails
  // the epoch test.
  uint64_t v = 0;
  if (!rank_wait(local, L, SYMM_OP_COMBINE, combine_signal(epoch, false, false), r, deadline, err,
                 SYMM_PHASE_COMBINE_PULL, /*detail = epochs*/ kCombineSignalEpochShift, &v))
    return false;
  if (combine_signal_epoch(v) == epoch && !combine_signal_pull(v)) {
    report_error(err, SYMM_ERR_COMBINE_MODE, SYMM_PHASE_COMBINE_PULL, r, (int32_t)combine_signal_pull(v));
    return false;
  }
  return true;
}

// One pull item: token t, 16-byte column c (= col * 32 + lane) of each of its rows. Split into load /
// check / issue / reduce so a warp can hold two items' loads in flight at once (combine_pull_run).
template <Order kOrder>
struct PullItem {
  int t = 0, c = 0;
  bool live = false;   // false: past the end of the list (nothing to do)
  uint32_t mask = 0;   // kmask[t]: the ks the dispatch sent
  int32_t where = -1;  // lane k < K: row k's (row * R + owner), from cmb_map
  float wl = 1.f;      // lane k < K: w[t, k] (1 without weights)

  // The item's words: kmask (written by this rank's dispatch: ld_dispatch_word) and lane k's cmb_map
  // entry (peer-written in the dispatch: coherent load, after the start acquire) and weight.
  __device__ __forceinline__ void load(const SymmLayout& L, uint64_t local, int64_t q, int64_t total, int ncol,
                                       const float* topk_w, int lane) {
    live = q < total;
    if (!live) return;
    t = (int)(q / ncol);
    c = (int)(q - (int64_t)t * ncol) * 32 + lane;
    mask = ld_dispatch_word<kOrder>(at<uint32_t>(local, L.off_kmask) + t);
    if (lane < L.topk) {
      where = ptx::ld_relaxed_sys_s32(cmb_map(local, L) + (int64_t)t * L.topk + lane);
      if (topk_w) wl = __ldg(topk_w + (int64_t)t * L.topk + lane);
    }
  }
  // false (reported: SYMM_ERR_COMBINE_ROW, what = token, detail = k): a sent k without a valid row.
  __device__ __forceinline__ bool check(const SymmLayout& L, int lane, const ErrSink& err) const {
    const bool bad = live && lane < L.topk && ((mask >> lane) & 1u) &&
                     (where < 0 || where / L.num_ranks >= L.cmb_in_rows);
    const uint32_t badm = __ballot_sync(0xffffffffu, bad);
    if (badm && lane == 0) report_error(err, SYMM_ERR_COMBINE_ROW, SYMM_PHASE_COMBINE_PULL, t, __ffs(badm) - 1);
    return badm == 0;
  }
  // Loads of rows k0 .. k0 + KB - 1 (those sent), all in flight; `live` and `mask` are warp-uniform.
  template <int KB>
  __device__ __forceinline__ void issue(const SymmLayout& L, const uint64_t* peers, int k0, int4 (&v)[KB]) const {
    if (!live) return;
    const bool active = c < L.hidden * 2 / 16;  // only the tail lanes of the last column idle
#pragma unroll
    for (int u = 0; u < KB; ++u) {
      const int k = k0 + u;
      if (k < L.topk && ((mask >> k) & 1u)) {
        const int32_t wk = __shfl_sync(0xffffffffu, where, k);
        // a peer's row (or ours): coherent loads, after the acquire of its owner's start signal
        if (active)
          v[u] = ptx::ld_v4_coherent(reinterpret_cast<const int4*>(cmb_in_row(peers[wk % L.num_ranks], L,
                                                                              wk / L.num_ranks)) + c);
      }
    }
  }
  // acc += rows k0 .. k0 + KB - 1 in k order (the push combine's arithmetic: bitwise the same result).
  template <int KB>
  __device__ __forceinline__ void accumulate(const SymmLayout& L, int k0, const int4 (&v)[KB], float* acc) const {
    if (!live) return;
    const bool active = c < L.hidden * 2 / 16;
#pragma unroll
    for (int u = 0; u < KB; ++u) {
      const int k = k0 + u;
      if (k < L.topk && ((mask >> k) & 1u)) {
        const float w = __shfl_sync(0xffffffffu, wl, k);
        if (active) bf16x8_accumulate(acc, v[u], w);
      }
    }
  }
  __device__ __forceinline__ void store(const SymmLayout& L, uint16_t* y, const float* acc) const {
    if (live && c < L.hidden * 2 / 16)
      ptx::st_v4(reinterpret_cast<int4*>(y + (int64_t)t * L.hidden) + c, f32x8_to_bf16x8(acc));
  }
};

// Items (token, 512-byte column) in token-major order, item q -> warp q % total_warps (neighbouring warps
// share a token's cmb_map line). K <= KB: a warp takes its items two at a time (q, q + total_warps) and
// has both items' K row loads in flight before it reduces either: a small call has <= 2 items per warp
// (128 tokens: 3584 items on 2112 warps), and one item at a time left the second wave's loads waiting
// for the first wave's round trip. K > KB: one item at a time, KB rows per batch.
template <int KB, Order kOrder>
__device__ __forceinline__ void combine_pull_run(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                 uint64_t local, int num_tokens, const float* topk_w, uint16_t* y,
                                                 const ErrSink& err) {
  const int ncol = (L.hidden * 2 / 16 + 31) / 32;
  const int64_t total = (int64_t)num_tokens * ncol, step = W.total_warps();
  if (L.topk <= KB) {
    // The next pair's words (kmask, cmb_map) are loaded while this pair's rows are in flight: one dependent
    // round trip per pair instead of two (the words, then the rows they name).
    int64_t q = W.gwarp();
    PullItem<kOrder> a, b;
    a.load(L, local, q, total, ncol, topk_w, W.lane);
    b.load(L, local, q + step, total, ncol, topk_w, W.lane);
    while (a.live) {  // warp-uniform (q < total)
      if (!a.check(L, W.lane, err) || !b.check(L, W.lane, err)) return;
      int4 va[KB], vb[KB];
      a.template issue<KB>(L, peers, 0, va);
      b.template issue<KB>(L, peers, 0, vb);
      q += 2 * step;
      PullItem<kOrder> na, nb;
      na.load(L, local, q, total, ncol, topk_w, W.lane);
      nb.load(L, local, q + step, total, ncol, topk_w, W.lane);
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.f;
      a.template accumulate<KB>(L, 0, va, acc);
      a.store(L, y, acc);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.f;
      b.template accumulate<KB>(L, 0, vb, acc);
      b.store(L, y, acc);
      a = na;
      b = nb;
    }
    return;
  }
  // (the same prefetch of the next item's words, under the first batch's rows)
  int64_t q = W.gwarp();
  PullItem<kOrder> a;
  a.load(L, local, q, total, ncol, topk_w, W.lane);
  while (a.live) {
    if (!a.check(L, W.lane, err)) return;
    PullItem<kOrder> na;
    na.load(L, local, q + step, total, ncol, topk_w, W.lane);
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < L.topk; k0 += KB) {
      int4 v[KB];
      a.template issue<KB>(L, peers, k0, v);
      a.template accumulate<KB>(L, k0, v, acc);
    }
    a.store(L, y, acc);
    a = na;
    q += step;
  }
}

// Start of a pull combine, all threads of every group: group 0 signals "started epoch, pulling" to every
// rank (itself included) at once (red.max, relaxed or released by kOrder: contract above). The zeroing
// of cmb_arr[parity ^ 1] that a push call epoch + 1 needs is done by the LAST group, with a second
// signal ("zeroed"; layout.cuh combine_signal): off the start (measured ~1 us when CTA 0 zeroed before
// its signal) and off the end (CTA 0 zeroing after its items: +0.45 us at 1 token, 2 x H200); in small
// calls the last group holds no item. Both signals go to the same slot, so both are red.max: the slot
// ends at "zeroed" whichever lands last. Then every group waits for every rank's start (thread r);
// returns the same bool in every thread of the group (false: error reported).
template <Order kOrder>
__device__ __forceinline__ bool combine_pull_start(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                   const CallStart& call) {
  const int parity = (int)(call.epoch & 1);
  if (W.group == 0)
    rank_signal_max(peers, L, SYMM_OP_COMBINE, combine_signal(call.epoch, true, false), W.tid(),
                    /*relaxed=*/kOrder == Order::kKernelBoundary);
  if (W.group == W.ngroups - 1)
    combine_zero_next_and_signal<true>(W, peers, L, call.local, parity, combine_signal(call.epoch, true, true));
  const bool started = pull_wait_started(call.local, L, call.epoch, W.tid(), call.deadline, call.err);
  // group barrier after thread r's acquire of rank r's signal: every thread's loads after it are
  // ordered after it.
  return W.sync_and(started);
}

// The whole pull combine of one call (layout cmb_in_rows > 0), all threads of every group (W.nthreads()
// >= num_ranks), no shared memory beyond the peer table. call: from begin_call(W, ..., SYMM_OP_COMBINE,
// ...). y: BF16 [num_tokens, H]. The caller ends the call with combine_end on every path.
template <int KB, Order kOrder>
__device__ __forceinline__ void combine_pull_run_all(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                     const CallStart& call, const float* topk_w, uint16_t* y,
                                                     int num_tokens) {
  const bool st0 = W.group == 0 && W.tid() == 0;  // stamps 6..8: group 0's view; 9: last group out
  if (st0) stamp(call.local, L, 6);
  const bool go = combine_pull_start<kOrder>(W, L, peers, call);
  if (st0) stamp(call.local, L, 7);
  if (go) combine_pull_run<KB, kOrder>(W, L, peers, call.local, num_tokens, topk_w, y, call.err);
  if (st0) stamp(call.local, L, 8);
}

}  // namespace symm
#endif
