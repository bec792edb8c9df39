// symm_comm/combine.cuh — EP combine as device functions. The standalone kernel (csrc/combine.cu):
//   start (zero the other parity's row counters, signal "started epoch" to every peer, wait until every
//   peer started epoch - 1) -> build_combine_schedule -> combine_run: ONE work list per rank, walked
//   round-robin by all warps, in which pushes and reductions are interleaved chunk by chunk:
//     push item   = one pool row, STORED (BF16) into its source's combine[parity][k][token], then the
//                   source's cmb_arr[parity][token] is bumped (red.release.sys);
//     reduce item = (token, 512-byte column chunk) of this rank: waits (ld.acquire.sys) until
//                   cmb_arr[parity][token] == popcount(kmask[token]), then y = BF16(sum over k in order).
//   List order: P_0, R_{-lag}, P_1, R_{1-lag}, ... where P_c = the rows of destination-token chunk c
//   (buckets written by dispatch, all destinations) and R_c = the reduce items of this rank's token
//   chunk c. Senders push destination chunks in ascending order, so a receiver's early chunks are
//   complete while later ones are still in flight: the reduction overlaps the transfer.
//   Deadlock-free: P_c is preceded in every list only by pushes and by reductions of chunks < c, and
//   R_c waits only for P_c of every rank; by induction over c every item completes (all warps resident:
//   cooperative launch). Results do not depend on the order (the sum is over k in slot order).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "symm_comm/barrier.cuh"
#include "symm_comm/copy.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/pool.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

// Shared-memory ints of the combine schedule (host and device; the formula lives in layout.cuh).
SYMM_LAYOUT_HD int64_t symm_combine_smem_ints(const SymmLayout* L) {
  return symm_combine_table_ints(L->num_ranks, L->num_chunks);
}

#if defined(__CUDACC__)
namespace symm {

struct CombineSchedule {
  int32_t* hist;     // [R * C]: rows of bucket (destination s, chunk c)
  int32_t* psz;      // [C]: rows of chunk c over all destinations
  int32_t* seg;      // [nseg + 1]: first list index of segment j (2x: P_x, 2x + 1: R_{x - lag})
  int32_t* scratch;  // [64]: [0..32] group_exclusive_scan's, [kTotalPush], [kChunksUsed]
  int32_t nseg, lag, ncol;
  static constexpr int kTotalPush = 40;   // scratch word: rows to push over all chunks
  static constexpr int kChunksUsed = 41;  // scratch word: highest destination chunk with a row, + 1

  __device__ __forceinline__ static CombineSchedule carve(int32_t* smem, const SymmLayout& L) {
    CombineSchedule s;
    s.hist = smem;
    s.psz = s.hist + L.num_ranks * L.num_chunks;
    s.seg = s.psz + L.num_chunks;
    s.scratch = s.seg + 4 * L.num_chunks + 1;
    s.nseg = s.lag = s.ncol = 0;
    return s;
  }
  __device__ __forceinline__ int32_t total() const { return seg[nseg]; }
};

// One CTA (all its threads), either mode: zeroes cmb_arr[parity ^ 1] (last read by our call epoch - 1,
// finished: stream order; next bumped by the peers' push call epoch + 1, which stores into it only after
// acquiring our "zeroed" signal of epoch), then fence.acq_rel.sys + bar.sync + a release of `signal`
// (combine_signal) into every rank: cumulative over the zeroing and over every earlier kernel on this
// stream. kMaxMerge (pull): the slot has a second writer in the same call (CTA 0's start signal), so the
// release is a red.max (the word never goes back); push: st.release.sys.
template <bool kMaxMerge = false>
__device__ __forceinline__ void combine_zero_next_and_signal(const uint64_t* s_peers, const SymmLayout& L, uint64_t local,
                                                     int parity, uint64_t signal) {
  uint32_t* other = cmb_arr(local, L, parity ^ 1);
  for (int i = threadIdx.x; i < L.max_tokens; i += blockDim.x) other[i] = 0u;
  ptx::fence_acq_rel_sys();
  __syncthreads();
  if constexpr (kMaxMerge)
    rank_signal_max(s_peers, L, SYMM_OP_COMBINE, signal, threadIdx.x);
  else
    rank_signal(s_peers, L, SYMM_OP_COMBINE, signal, threadIdx.x);
}

// End of a combine call, every CTA, every exit path: the last CTA out publishes the epoch (barrier.cuh)
// and writes stamp 9.
__device__ __forceinline__ void combine_end(uint64_t local, const SymmLayout& L, uint64_t epoch) {
  __syncthreads();
  if (threadIdx.x == 0 &&
      cta_end_publish_epoch(state_grid_bar(local, L, SYMM_OP_COMBINE), state_epoch(local, L) + SYMM_OP_COMBINE, epoch))
    stamp(local, L, 9);
}

// Builds the list (all threads of the group; every group builds the same one). The buckets were
// written by the last dispatch (an earlier launch on this stream; in push mode by the PEERS, so every
// dispatch-written word is read with coherent loads, never through the non-coherent path).
__device__ __forceinline__ void build_combine_schedule(const Workers& W, const SymmLayout& L, uint64_t local,
                                                       int num_tokens, int lag_mult, CombineSchedule& s) {
  const int C = L.num_chunks, R = L.num_ranks, chunk = L.combine_chunk;
  const int32_t* hg = cmb_hist(local, L);
  const int32_t cap = chunk * L.topk;  // a bucket never holds more (one row per (token, k))
#pragma unroll 1  // runs once per call: rolled (pool.cuh "Code size")
  for (int i = W.tid(); i < R * C; i += W.nthreads()) s.hist[i] = min(max(ptx::ld_relaxed_sys_s32(hg + i), 0), cap);
  if (W.tid() == 0) s.scratch[CombineSchedule::kTotalPush] = s.scratch[CombineSchedule::kChunksUsed] = 0;
  W.sync();
#pragma unroll 1
  for (int c = W.tid(); c < C; c += W.nthreads()) {
    int32_t p = 0;
#pragma unroll 1
    for (int r = 0; r < R; ++r) p += s.hist[r * C + c];
    s.psz[c] = p;
    if (p) {
      atomicAdd(s.scratch + CombineSchedule::kTotalPush, p);
      atomicMax(s.scratch + CombineSchedule::kChunksUsed, c + 1);
    }
  }
  W.sync();
  const int64_t total_push = s.scratch[CombineSchedule::kTotalPush];
  const int ncol = (L.hidden * 2 / 16 + 31) / 32;
  const int cred = (num_tokens + chunk - 1) / chunk;
  // Chunks actually used (this rank's tokens, and the highest destination chunk with a row to push):
  // the list, its scan and every item's segment search are sized by them, not by max_tokens (a
  // 128-token call in a 4096-token buffer: 2 x (8 + lag) segments instead of 2 x (256 + lag)).
  // Only empty segments are dropped: the order of the items is unchanged.
  const int cu = max(cred, s.scratch[CombineSchedule::kChunksUsed]);
  const int64_t per_chunk = cred ? (total_push + (int64_t)num_tokens * ncol + cred - 1) / cred : 1;
  // lag: reductions of chunk c are listed ~lag_mult x (warps in the grid) items after chunk c's pushes,
  // so a warp reaching one mostly finds its rows there: under load a push takes ~ (bytes in flight) /
  // (link bandwidth), many list items' worth (lag_mult 8 measured best, 2 too small).
  int64_t lag = lag_mult < 0 ? cu : (lag_mult * W.total_warps() + per_chunk - 1) / (per_chunk > 0 ? per_chunk : 1);
  if (lag > cu) lag = cu;  // a lag >= cu lists every reduction after every push either way
  s.lag = (int32_t)lag;
  s.ncol = ncol;
  s.nseg = 2 * (cu + s.lag);
  const int32_t* psz = s.psz;
  const int lg = s.lag;
  group_exclusive_scan(
      W, s.nseg,
      [&](int j) -> int32_t {
        const int x = j >> 1;
        if (!(j & 1)) return x < cu ? psz[x] : 0;
        const int c = x - lg;
        if (c < 0 || c >= cred) return 0;
        const int nt = num_tokens - c * chunk;
        return (nt < chunk ? nt : chunk) * ncol;
      },
      s.seg, s.scratch);
}

__device__ __forceinline__ void bf16x8_accumulate(float* acc, const int4& v, float w) {
  const uint32_t u[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // no FMA contraction: (w * v) rounded, then added — what an elementwise FP32 reference does
    acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(w, __uint_as_float(u[i] << 16)));
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(w, __uint_as_float(u[i] & 0xffff0000u)));
  }
}

__device__ __forceinline__ int4 f32x8_to_bf16x8(const float* acc) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    u[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_int4((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
}

// Push item: pool row `row` (BF16 [H] of expert_out) -> its source's combine[parity][k][token].
// Contract: every lane fences its row stores (fence.acq_rel.sys), the warp syncs, then lane 0's
// red.release.sys adds 1 to the destination's cmb_arr[parity][token]; a reader whose ld.acquire.sys
// sees the count sees the row. with_data = false (expert_out too small, error reported): only the
// counter is bumped, so the peers' reductions do not hang (they read stale rows, as before).
template <int UNROLL>
__device__ __forceinline__ void combine_push_item(const SymmLayout& L, const uint64_t* peers, uint64_t local,
                                                  int parity, int32_t row, const uint16_t* expert_out,
                                                  bool with_data, int lane) {
  const int K = L.topk, T = L.max_tokens;
  // written by the last dispatch (an earlier launch; push mode: by a peer): coherent load
  const int32_t code = ptx::ld_relaxed_sys_s32(at<int32_t>(local, L.off_row_src) + row);
  if (code < 0) return;  // never for a bucketed row; defensive
  const int32_t k = code % K, st = code / K;
  const int32_t tok = st % T, s = st / T;
  if (s >= L.num_ranks) return;
  if (with_data)
    warp_copy_v4<UNROLL, Load::kLocalNc>(reinterpret_cast<int4*>(combine_row(peers[s], L, parity, k, tok)),
                                reinterpret_cast<const int4*>(expert_out + (int64_t)row * L.hidden),
                                L.hidden * 2 / 16, lane);
  ptx::fence_acq_rel_sys();
  __syncwarp();
  if (lane == 0) ptx::red_add_release_sys_u32(cmb_arr(peers[s], L, parity) + tok, 1u);
}

// Reduce item: y[t, 16-byte column c16 of each lane] = BF16( sum_{k in kmask[t], in order} w[t,k] * row_k ).
// Waits (warp-uniform, time limit) until all popcount(kmask[t]) rows of token t arrived. Returns false
// on timeout (error reported: phase COMBINE_ARRIVE, what = t, detail = rows seen).
template <int KB>
__device__ __forceinline__ bool combine_reduce_item(const SymmLayout& L, uint64_t local, int parity, int t, int col,
                                                    const float* topk_w, uint16_t* y, int lane, uint32_t spin_ns,
                                                    uint64_t deadline, const ErrSink& err) {
  const int K = L.topk;
  const int n16 = L.hidden * 2 / 16;
  const uint32_t mask = __ldg(at<uint32_t>(local, L.off_kmask) + t);  // written by dispatch (earlier launch)
  // lane k holds w[t, k] (K <= 32): one coalesced load, broadcast by shuffles in the sum
  const float wl = (topk_w && lane < K) ? __ldg(topk_w + (int64_t)t * K + lane) : 1.f;
  const uint32_t need = (uint32_t)__popc(mask);
  const uint32_t* ctr = cmb_arr(local, L, parity) + t;
  uint32_t got;
  int spins = 0;
  // Every lane acquires the counter itself, so its own row loads below are ordered after it.
  while (!__all_sync(0xffffffffu, (got = ptx::ld_acquire_sys_u32(ctr)) >= need)) {
    bool late = false;
    ++spins;  // warp-uniform
    if (lane == 0 && (spins & 15) == 0) late = timed_out(deadline);
    // back off: leave issue slots and L2 bandwidth to the pushes
    if (spins > 2) ptx::nanosleep(spin_ns);
    if (__shfl_sync(0xffffffffu, late, 0)) {
      if (lane == 0) report_error(err, SYMM_ERR_TIMEOUT, SYMM_PHASE_COMBINE_ARRIVE, t, (int32_t)got);
      return false;
    }
  }
  const int c = col * 32 + lane;
  const bool active = c < n16;  // mask and k loop are warp-uniform; only the tail lanes idle
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
  for (int k0 = 0; k0 < K; k0 += KB) {
    int4 v[KB];
#pragma unroll
    for (int u = 0; u < KB; ++u) {
      const int k = k0 + u;
      // peer-written: coherent (ld.relaxed.sys), after this lane's acquire of the counter
      if (active && k < K && ((mask >> k) & 1u))
        v[u] = ptx::ld_v4_coherent(reinterpret_cast<const int4*>(combine_row(local, L, parity, k, t)) + c);
    }
#pragma unroll
    for (int u = 0; u < KB; ++u) {
      const int k = k0 + u;
      if (k < K && ((mask >> k) & 1u)) {
        const float w = __shfl_sync(0xffffffffu, wl, k);
        if (active) bf16x8_accumulate(acc, v[u], w);
      }
    }
  }
  if (active) ptx::st_v4(reinterpret_cast<int4*>(y + (int64_t)t * L.hidden) + c, f32x8_to_bf16x8(acc));
  return true;
}

// Walks the list: item q -> warp q % total_warps. Push buckets of a chunk go destinations
// rank+1, rank+2, ..., rank (remote links first, the local copy last).
template <int UNROLL, int KB>
__device__ __forceinline__ void combine_run(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                            uint64_t local, int parity, const CombineSchedule& s,
                                            const uint16_t* expert_out, bool with_data, const float* topk_w,
                                            uint16_t* y, uint32_t spin_ns, uint64_t deadline, const ErrSink& err) {
  const int C = L.num_chunks, R = L.num_ranks, chunk = L.combine_chunk;
  const int32_t total = s.total();
  for (int64_t q = W.gwarp(); q < total; q += W.total_warps()) {
    const int j = find_segment(s.seg, s.nseg, (int32_t)q);
    int32_t o = (int32_t)q - s.seg[j];
    const int x = j >> 1;
    if (!(j & 1)) {
      int dst = L.rank;
      for (int i = 1; i <= R; ++i) {
        const int d = (L.rank + i) % R;
        const int32_t n = s.hist[d * C + x];
        if (o < n) {
          dst = d;
          break;
        }
        o -= n;
      }
      // written by the last dispatch (an earlier launch; push mode: by a peer): coherent load
      const int32_t row = ptx::ld_relaxed_sys_s32(cmb_bucket(local, L, dst, x) + o);
      combine_push_item<UNROLL>(L, peers, local, parity, row, expert_out, with_data, W.lane);
    } else {
      const int t = (x - s.lag) * chunk + o / s.ncol;
      if (!combine_reduce_item<KB>(L, local, parity, t, o % s.ncol, topk_w, y, W.lane, spin_ns, deadline, err))
        return;
    }
  }
}

// ==== pull combine (layout v8: cmb_in_rows > 0) ==========================================================
// Every rank's producer wrote its expert outputs into its own cmb_in region (pool row order) before the
// call; each rank then READS the rows of its own tokens from the owners and reduces them in registers:
//   y[t] = BF16( sum over k in kmask[t], in order, of [w[t,k] *] cmb_in@owner(t,k)[row(t,k)] )
// with (owner, row) from cmb_map (written by the owners in the dispatch). No combine buffer, no per-token
// counters, no second pass: the local rows and the reduction overlap the remote reads, and a token's
// rows are read once. Same FP32 arithmetic and order as combine_reduce_item (the results are identical).
// Start contract (csrc/combine.cu): an owner signals combine_signal(epoch, pull = true, *) (red.relaxed.sys.max
// by default: the kernel boundary, not a release, publishes the earlier kernels' writes; a fused kernel
// that writes cmb_in itself must use the release) only from inside its combine kernel, i.e. after every
// earlier kernel on its stream (the producer of cmb_in, and the dispatch that stored our cmb_map entries) completed; a reader
// acquires (ld.acquire.sys) that signal of EVERY rank before its first cmb_map / cmb_in load (bar.sync
// after the acquiring threads), so it sees both. WAR: the owner's producer rewrites cmb_in only after its
// next dispatch passed the one-hop barrier, which needs this rank's arrival, i.e. after our combine ended.

// Thread r < R of every CTA: waits until rank r started this pull combine (its word >= epoch * 4).
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
struct PullItem {
  int t = 0, c = 0;
  bool live = false;   // false: past the end of the list (nothing to do)
  uint32_t mask = 0;   // kmask[t]: the ks the dispatch sent
  int32_t where = -1;  // lane k < K: row k's (row * R + owner), from cmb_map
  float wl = 1.f;      // lane k < K: w[t, k] (1 without weights)

  // The item's words: kmask (written by the dispatch, an earlier launch) and lane k's cmb_map entry
  // (peer-written in the dispatch: coherent load, after the start acquire) and weight.
  __device__ __forceinline__ void load(const SymmLayout& L, uint64_t local, int64_t q, int64_t total, int ncol,
                                       const float* topk_w, int lane) {
    live = q < total;
    if (!live) return;
    t = (int)(q / ncol);
    c = (int)(q - (int64_t)t * ncol) * 32 + lane;
    mask = __ldg(at<uint32_t>(local, L.off_kmask) + t);
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
template <int KB>
__device__ __forceinline__ void combine_pull_run(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                 uint64_t local, int num_tokens, const float* topk_w, uint16_t* y,
                                                 const ErrSink& err) {
  const int ncol = (L.hidden * 2 / 16 + 31) / 32;
  const int64_t total = (int64_t)num_tokens * ncol, step = W.total_warps();
  if (L.topk <= KB) {
    for (int64_t q = W.gwarp(); q < total; q += 2 * step) {
      PullItem a, b;
      a.load(L, local, q, total, ncol, topk_w, W.lane);
      b.load(L, local, q + step, total, ncol, topk_w, W.lane);
      if (!a.check(L, W.lane, err) || !b.check(L, W.lane, err)) return;
      int4 va[KB], vb[KB];
      a.issue<KB>(L, peers, 0, va);
      b.issue<KB>(L, peers, 0, vb);
      float acc[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.f;
      a.accumulate<KB>(L, 0, va, acc);
      a.store(L, y, acc);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = 0.f;
      b.accumulate<KB>(L, 0, vb, acc);
      b.store(L, y, acc);
    }
    return;
  }
  for (int64_t q = W.gwarp(); q < total; q += step) {
    PullItem a;
    a.load(L, local, q, total, ncol, topk_w, W.lane);
    if (!a.check(L, W.lane, err)) return;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < L.topk; k0 += KB) {
      int4 v[KB];
      a.issue<KB>(L, peers, k0, v);
      a.accumulate<KB>(L, k0, v, acc);
    }
    a.store(L, y, acc);
  }
}

}  // namespace symm
#endif
