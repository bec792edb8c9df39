// symm_comm/combine.cuh — the push EP combine as device functions over a Workers range, and the row
// arithmetic both combines share (the pull combine is combine_pull.cuh). combine_push_run_all is the
// whole phase; the standalone kernel (csrc/combine.cu) is begin_call -> combine_push_run_all -> combine_end
// over Workers::cta(). combine_push_run_all is:
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
//   cooperative launch, or a persistent fused kernel). Results do not depend on the order (the sum is
//   over k in slot order).
// Inputs written by the dispatch and the expert GEMM (row_src, cmb_hist / cmb_order, exp_offsets, kmask,
// expert_out): Order::kKernelBoundary (standalone) reads the local ones through the non-coherent path,
// written by earlier launches; Order::kInKernel (fused, same launch) reads them coherently, and the
// CALLER must order every group's writes of them before the call (grid_barrier_gpu after the dispatch
// and the GEMM epilogues). The peer-facing protocol (start signal, row counters) is explicit either way.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "symm_comm/barrier.cuh"
#include "symm_comm/copy.cuh"
#include "symm_comm/metadata.cuh"
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

// One group (all its threads), either mode: zeroes cmb_arr[parity ^ 1] (last read by our call epoch - 1,
// finished: an earlier launch; next bumped by the peers' push call epoch + 1, which stores into it only
// after acquiring our "zeroed" signal of epoch), then fence.acq_rel.sys + group barrier + a release of
// `signal` (combine_signal) into every rank: cumulative over the zeroing, over this group's earlier
// writes and over every earlier kernel on this stream. kMaxMerge (pull): the slot has a second writer
// in the same call (group 0's start signal), so the release is a red.max (the word never goes back);
// push: st.release.sys.
template <bool kMaxMerge = false>
__device__ __forceinline__ void combine_zero_next_and_signal(const Workers& W, const uint64_t* s_peers,
                                                             const SymmLayout& L, uint64_t local, int parity,
                                                             uint64_t signal) {
  uint32_t* other = cmb_arr(local, L, parity ^ 1);
  for (int i = W.tid(); i < L.max_tokens; i += W.nthreads()) other[i] = 0u;
  ptx::fence_acq_rel_sys();
  W.sync();
  if constexpr (kMaxMerge)
    rank_signal_max(s_peers, L, SYMM_OP_COMBINE, signal, W.tid());
  else
    rank_signal(s_peers, L, SYMM_OP_COMBINE, signal, W.tid());
}

// End of a combine call (either kind), all threads of every group, every exit path: the last group out
// publishes the epoch (barrier.cuh end_call) and writes stamp 9.
__device__ __forceinline__ void combine_end(const Workers& W, uint64_t local, const SymmLayout& L, uint64_t epoch) {
  if (end_call(W, local, L, SYMM_OP_COMBINE, epoch)) stamp(local, L, 9);
}

// A local word written by the dispatch (kmask, exp_offsets): the non-coherent path when an earlier
// launch wrote it, a coherent load (after the caller's grid barrier) when this launch did.
template <Order kOrder>
__device__ __forceinline__ uint32_t ld_dispatch_word(const uint32_t* p) {
  if constexpr (kOrder == Order::kKernelBoundary) return __ldg(p);
  else return (uint32_t)ptx::ld_relaxed_gpu_s32(reinterpret_cast<const int32_t*>(p));
}

// Builds the list (all threads of the group; every group builds the same one). The buckets were
// written by the last dispatch's groups with atomics (coherent loads here, whatever the Order).
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
template <int UNROLL, Order kOrder>
__device__ __forceinline__ void combine_push_item(const SymmLayout& L, const uint64_t* peers, uint64_t local,
                                                  int parity, int32_t row, const uint16_t* expert_out,
                                                  bool with_data, int lane) {
  const int K = L.topk, T = L.max_tokens;
  // written by the last dispatch: coherent load
  const int32_t code = ptx::ld_relaxed_sys_s32(at<int32_t>(local, L.off_row_src) + row);
  if (code < 0) return;  // never for a bucketed row; defensive
  const int32_t k = code % K, st = code / K;
  const int32_t tok = st % T, s = st / T;
  if (s >= L.num_ranks) return;
  if (with_data)
    // expert_out: the GEMM's output, non-coherent only when an earlier launch wrote it
    warp_copy_v4<UNROLL, kOrder == Order::kKernelBoundary ? Load::kLocalNc : Load::kCoherent>(reinterpret_cast<int4*>(combine_row(peers[s], L, parity, k, tok)),
                                reinterpret_cast<const int4*>(expert_out + (int64_t)row * L.hidden),
                                L.hidden * 2 / 16, lane);
  ptx::fence_acq_rel_sys();
  __syncwarp();
  if (lane == 0) ptx::red_add_release_sys_u32(cmb_arr(peers[s], L, parity) + tok, 1u);
}

// Reduce item: y[t, 16-byte column c16 of each lane] = BF16( sum_{k in kmask[t], in order} w[t,k] * row_k ).
// Waits (warp-uniform, time limit) until all popcount(kmask[t]) rows of token t arrived. Returns false
// on timeout (error reported: phase COMBINE_ARRIVE, what = t, detail = rows seen).
template <int KB, Order kOrder>
__device__ __forceinline__ bool combine_reduce_item(const SymmLayout& L, uint64_t local, int parity, int t, int col,
                                                    const float* topk_w, uint16_t* y, int lane, uint32_t spin_ns,
                                                    uint64_t deadline, const ErrSink& err) {
  const int K = L.topk;
  const int n16 = L.hidden * 2 / 16;
  const uint32_t mask = ld_dispatch_word<kOrder>(at<uint32_t>(local, L.off_kmask) + t);  // written by the dispatch
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
template <int UNROLL, int KB, Order kOrder>
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
      // written by the last dispatch: coherent load
      const int32_t row = ptx::ld_relaxed_sys_s32(cmb_bucket(local, L, dst, x) + o);
      combine_push_item<UNROLL, kOrder>(L, peers, local, parity, row, expert_out, with_data, W.lane);
    } else {
      const int t = (x - s.lag) * chunk + o / s.ncol;
      if (!combine_reduce_item<KB, kOrder>(L, local, parity, t, o % s.ncol, topk_w, y, W.lane, spin_ns, deadline, err))
        return;
    }
  }
}

// The whole push combine of one call, all threads of every group (W.nthreads() >= num_ranks). call:
// from begin_call(W, ..., SYMM_OP_COMBINE, ...); peers: the group's peer table; smem: the group's
// symm_combine_smem_ints(&L) ints (the schedule). expert_out: BF16 [out_rows, H] in pool row order.
// lag_mult, spin_ns: schedule constants (speed only, csrc/combine.cu). The caller ends the call with
// combine_end on every path.
template <int UNROLL, int KB, Order kOrder>
__device__ __forceinline__ void combine_push_run_all(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                     const CallStart& call, int32_t* smem, const uint16_t* expert_out,
                                                     int64_t out_rows, const float* topk_w, uint16_t* y, int num_tokens,
                                                     int lag_mult, uint32_t spin_ns) {
  const uint64_t local = call.local, epoch = call.epoch, deadline = call.deadline;
  const ErrSink& err = call.err;
  const int parity = (int)(epoch & 1);
  const bool st0 = W.group == 0 && W.tid() == 0;  // stamps 6..8: group 0's view; 9: last group out
  if (st0) stamp(local, L, 6);

  // Start handshake (replaces the barrier between push and reduce).
  //  - group 0: combine_zero_next_and_signal (zeroes cmb_arr[parity ^ 1], then signals[combine][rank] :=
  //    epoch in every peer: "this rank finished call epoch - 1").
  //  - WAR guard: peer r reads its half `parity` (rows and counters) in call epoch - 2, so we store
  //    into it only after acquiring r's signal >= epoch - 1; the group barrier orders every thread's
  //    stores after that acquire.
  if (W.group == 0) combine_zero_next_and_signal(W, peers, L, local, parity, combine_signal(epoch, false, true));
  // The schedule reads only local data of the last dispatch and stores nothing into a peer, so it is
  // built BEFORE the wait below: the peers' start signals travel meanwhile.
  CombineSchedule sched = CombineSchedule::carve(smem, L);
  build_combine_schedule(W, L, local, num_tokens, lag_mult, sched);
  const int32_t used = (int32_t)ld_dispatch_word<kOrder>(at<uint32_t>(local, L.off_exp_offsets) + L.num_local_experts);
  const bool with_data = (int64_t)used <= out_rows;
  if (!with_data && W.group == 0 && W.tid() == 0)
    report_error(err, SYMM_ERR_OUT_ROWS, SYMM_PHASE_COMBINE_PUSH, used, (int32_t)out_rows);

  // (either mode: a pull call c - 1 read no combine half; its last group signals "zeroed" once it zeroed)
  const bool started = rank_wait(local, L, SYMM_OP_COMBINE, combine_signal(epoch - 1, false, true), W.tid(),
                                 deadline, err, SYMM_PHASE_COMBINE_RANKS,
                                 /*detail = epochs*/ kCombineSignalEpochShift);
  // WAR guard (above): every thread's peer stores in combine_run come after this group barrier, which
  // follows thread r's ld.acquire.sys of rank r's signal.
  const bool go = W.sync_and(started);
  if (st0) stamp(local, L, 7);
  if (go) combine_run<UNROLL, KB, kOrder>(W, L, peers, local, parity, sched, expert_out, with_data, topk_w, y, spin_ns,
                                          deadline, err);
  if (st0) stamp(local, L, 8);
}

}  // namespace symm
#endif
