// symm_comm/dispatch_stage.cuh — dispatch phase A, the local part: the stagers' split of the grid's
// threads, the staging copy of x / scales / weights into this rank's buffer (read by the owners in
// phase B), the per-token k masks, the bad-id reports and the combine buckets' clearing. The metadata
// push to the owners is metadata.cuh; dispatch.cuh assembles the phases.
#pragma once
#include <stdint.h>
#include "symm_comm/copy.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/metadata.cuh"
#include "symm_comm/pool.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

#if defined(__CUDACC__)
namespace symm {

// The threads that stage the inputs, as one flat index gt in [0, nt): every thread of the grid except
// warp 0 of the first `meta_groups` groups (those run push_metadata_onepass meanwhile; 0: all threads).
struct Stagers {
  int64_t gt, nt;
  __device__ __forceinline__ static Stagers of(const Workers& W, int meta_groups) {
    const int64_t g = W.group, nthr = W.nthreads(), mg = meta_groups;
    const int64_t skipped_before = (g < mg ? g : mg) * 32;  // metadata lanes in groups before this one
    const int64_t own = g < mg ? W.tid() - 32 : W.tid();    // -1..-32: this thread is a metadata lane
    return Stagers{g * nthr - skipped_before + own, W.total_threads() - mg * 32};
  }
};

// Stagers: stage this rank's x / scales / weights into its own buffer half `parity`, build the
// per-token mask of valid k, and report out-of-range expert ids.
template <typename IdxT>
__device__ __forceinline__ void stage_inputs(const Stagers& st, const SymmLayout& L, uint64_t local,
                                             const DispatchArgs& a, const ErrSink& err) {
  const int64_t T = a.num_tokens, H = L.hidden, K = L.topk, S = L.scale_cols;
  const int64_t gt = st.gt, nt = st.nt;
  // Who does what: x takes the stager threads from the start; the token masks, then the weights, then
  // the scales take them from the END (index nt - 1 - gt, shifted by the work before them). Why: with
  // every source starting at thread 0, the first threads (CTA 0's, which then also run the small-T
  // metadata) ran the x copy, the scale copy, the weight copy and the id loads one after the other:
  // four dependent round trips, ~2.8 us of CTA 0's phase A at 1 and at 128 tokens (stamps, 2 x H200).
  // Now a small call gives a thread at most one of them (measured: CTA 0's phase A 3.6 -> 2.9-3.0 us at 1
  // token, 7.5 -> 6.4-6.8 at 128). Any shift is a bijection on [0, nt).
  // 32-bit: nt (threads of the grid) and the shifts (< T * (K + S + 1)) fit.
  auto from_end = [&](int64_t shift) -> int64_t {
    const int n = (int)nt, v = n - 1 - (int)gt - (int)(shift % n);
    return v < 0 ? v + n : v;
  };
  {
    float* sw = stage_w(local, L, a.parity);
    // x, scales, weights through ONE inlined copy loop (pool.cuh "Code size"); a source already in
    // place (the caller staged into the buffer itself) is skipped.
#pragma unroll 1
    for (int j = 0; j < 3; ++j) {
      void* dst = j == 0 ? (void*)stage_x(local, L, a.parity) : j == 1 ? (void*)stage_s(local, L, a.parity) : (void*)sw;
      const void* src = j == 0 ? a.x : j == 1 ? (const void*)a.scales : (const void*)a.topk_w;
      const int64_t bytes = j == 0 ? T * H : j == 1 ? T * S * 4 : T * K * 4;
      const int64_t tid = j == 0 ? gt : from_end(j == 2 ? T : T + (T * K * 4 + 15) / 16);
      if (src && src != dst) grid_copy_bytes(dst, src, bytes, tid, nt);
    }
    if (!a.topk_w) {
#pragma unroll 1
      for (int64_t i = gt; i < T * K; i += nt) sw[i] = 0.f;
    }
  }
  // kmask: the ids of a token are loaded kIdxBatch at a time (one latency, not K in a row).
  constexpr int kIdxBatch = 8;
  uint32_t* kmask = at<uint32_t>(local, L.off_kmask);
  // Pull combine (layout v8): this call's owners store where each (token, k) row lands into cmb_map in
  // phase B; -1 first, so a row no owner wrote (an error reported in this call) is never read. Ordered
  // before the owners' stores by the one-hop barrier (our arrival is cumulative over these stores).
  int32_t* cmap = L.cmb_in_rows > 0 ? cmb_map(local, L) : nullptr;
  for (int64_t t = nt - 1 - gt; t < T; t += nt) {  // from the grid's end (above)
    uint32_t m = 0;
    for (int k0 = 0; k0 < K; k0 += kIdxBatch) {
      int64_t e[kIdxBatch];
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) e[u] = k0 + u < K ? load_idx<IdxT>(a.topk_idx, t * K + k0 + u) : -1;
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) {
        const int k = k0 + u;
        if (e[u] >= 0 && e[u] < L.num_experts)
          m |= 1u << k;
        else if (e[u] != -1)
          report_error(err, SYMM_ERR_BAD_EXPERT, SYMM_PHASE_DISPATCH_SCAN, (int32_t)(t * K + k), (int32_t)e[u]);
      }
    }
    kmask[t] = m;
    if (cmap)
      for (int k = 0; k < K; ++k) cmap[t * K + k] = -1;
  }
}

// Phase A: clears this dispatch's combine buckets (cmb_hist). Local; ordered before any CTA's pull
// (which counts into them) by the cross-rank barrier, whose arrivals include this rank's own CTAs.
__device__ __forceinline__ void clear_combine_buckets(const Stagers& st, const SymmLayout& L, uint64_t local) {
  int32_t* h = cmb_hist(local, L);
  const int64_t n = (int64_t)L.num_ranks * L.num_chunks;
  for (int64_t i = st.gt; i < n; i += st.nt) h[i] = 0;
}

}  // namespace symm
#endif
