// symm_comm/dispatch.cuh — expert-granular EP dispatch, as device functions a fused kernel can run
// inside its own warps (all state from the caller). The standalone kernel (csrc/dispatch.cu) is:
//   stage_inputs + clear_combine_buckets (+ push_metadata_* of metadata.cuh, concurrently in one warp
//   per CTA for large T; CTA 0 also zeroes the idle parity's pull counter) -> one-hop cross-rank
//   barrier -> build_pool_tables -> publish_layout (group 0) -> pad_blocks -> pull_rows.
// A fused kernel composing pull_rows must keep both side duties: the combine buckets it counts into
// are cleared in phase A, and its pull counter must be zero when the call starts (pull_rows below).
// Phase A (push): each source rank scans its topk_idx and writes, into the OWNER of each expert
//   (rank e / L), the count and the (token * K + k) of every slot of (local expert, source); slots in
//   row-major (token, k) order (metadata.cuh). The source also stages x / scales / weights in its own
//   buffer.
// Phase B (pull): each owner pulls the rows from the sources' staging into its expert-major pool,
//   source-interleaved, 16-byte coherent loads, and bumps arrivals[row / block_m] per row.
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
  uint8_t* sx = stage_x(local, L, a.parity);
  if (a.x != sx) grid_copy_bytes(sx, a.x, T * H, gt, nt);
  float* ss = stage_s(local, L, a.parity);
  if (a.scales != ss) grid_copy_bytes(ss, a.scales, T * S * 4, gt, nt);
  float* sw = stage_w(local, L, a.parity);
  if (a.topk_w) {
    if (a.topk_w != sw) grid_copy_bytes(sw, a.topk_w, T * K * 4, gt, nt);
  } else {
    for (int64_t i = gt; i < T * K; i += nt) sw[i] = 0.f;
  }
  // kmask: the ids of a token are loaded kIdxBatch at a time (one latency, not K in a row).
  constexpr int kIdxBatch = 8;
  uint32_t* kmask = at<uint32_t>(local, L.off_kmask);
  for (int64_t t = gt; t < T; t += nt) {
    uint32_t m = 0;
    for (int k0 = 0; k0 < K; k0 += kIdxBatch) {
      int64_t e[kIdxBatch];
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) e[u] = k0 + u < K ? load_idx<IdxT>(a.topk_idx, t * K + k0 + u) : -1;
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) {
        const int k = k0 + u;
        if (e[u] >= 0 && e[u] < L.num_experts) m |= 1u << k;
        else if (e[u] != -1)
          report_error(err, SYMM_ERR_BAD_EXPERT, SYMM_PHASE_DISPATCH_SCAN, (int32_t)(t * K + k), (int32_t)e[u]);
      }
    }
    kmask[t] = m;
  }
}

// Phase A: clears this dispatch's combine buckets (cmb_hist). Local; ordered before any CTA's pull
// (which counts into them) by the cross-rank barrier, whose arrivals include this rank's own CTAs.
__device__ __forceinline__ void clear_combine_buckets(const Stagers& st, const SymmLayout& L, uint64_t local) {
  int32_t* h = cmb_hist(local, L);
  const int64_t n = (int64_t)L.num_ranks * L.num_chunks;
  for (int64_t i = st.gt; i < n; i += st.nt) h[i] = 0;
}

// Checks the pool capacity; returns false (and reports, group 0 only) if the rows do not fit.
__device__ __forceinline__ bool check_capacity(const Workers& W, const SymmLayout& L, const PoolTables& t,
                                               bool masked, const ErrSink& err) {
  const int Lx = L.num_local_experts;
  if (masked) {
    bool ok = true;
    for (int le = 0; le < Lx; ++le) {
      if (t.le_count[le] > L.max_m) {
        if (W.group == 0 && W.tid() == 0)
          report_error(err, SYMM_ERR_MASKED_OVERFLOW, SYMM_PHASE_DISPATCH_LAYOUT, le, t.le_count[le]);
        ok = false;
        break;
      }
    }
    return ok;
  }
  if ((int64_t)t.le_start[Lx] > L.pool_rows) {
    if (W.group == 0 && W.tid() == 0)
      report_error(err, SYMM_ERR_POOL_OVERFLOW, SYMM_PHASE_DISPATCH_LAYOUT, t.le_start[Lx], (int32_t)L.pool_rows);
    return false;
  }
  return true;
}

// Group 0 publishes the layout for consumers and for combine (local memory).
__device__ __forceinline__ void publish_layout(const Workers& W, const SymmLayout& L, uint64_t local,
                                               const PoolTables& t) {
  const int Lx = L.num_local_experts, R = L.num_ranks;
  int32_t* ec = at<int32_t>(local, L.off_exp_counts);
  int32_t* eo = at<int32_t>(local, L.off_exp_offsets);
  int32_t* sc = at<int32_t>(local, L.off_src_counts);
  for (int i = W.tid(); i < Lx; i += W.nthreads()) ec[i] = t.le_count[i];
  for (int i = W.tid(); i <= Lx; i += W.nthreads()) eo[i] = t.le_start[i];
  for (int i = W.tid(); i < Lx * R; i += W.nthreads()) sc[i] = t.cnt[i];
}

// Padding: one warp per pool block; marks padding rows row_src = -1 and adds the number of padding
// rows of the block to its arrival counter (valid rows are added by pull_rows), so every block's
// counter grows by exactly block_m per dispatch: arrivals[b] == epoch * block_m when complete.
// aborted (the rows did not fit; nothing is pulled): every block gets block_m, no row is touched,
// so the counters stay in step with the epoch for the next call.
__device__ __forceinline__ void pad_blocks(const Workers& W, const SymmLayout& L, uint64_t local, const PoolTables& t,
                                           bool aborted = false) {
  const int32_t U = t.le_start[L.num_local_experts];
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  int32_t* row_src = at<int32_t>(local, L.off_row_src);
  const int bm = L.block_m;
  for (int64_t b = W.gwarp(); b < L.num_blocks; b += W.total_warps()) {
    const int64_t r0 = b * bm;
    uint32_t pad = 0;
    if (aborted || r0 >= U) {
      pad = bm;
    } else {
      for (int i = W.lane; i < bm; i += 32) {
        const int32_t r = (int32_t)(r0 + i);
        if (!pool_row_valid(L, t, r)) {
          ++pad;
          if (r < U) row_src[r] = -1;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) pad += __shfl_xor_sync(0xffffffffu, pad, o);
    }
    __syncwarp();
    if (W.lane == 0 && pad) ptx::red_add_release_gpu_u32(arr + b, pad);
  }
}

// Phase B: pull every row this rank owns, sources interleaved (for_each_pool_row_interleaved). The scale and weight loads
// are issued before the row's, and with 32 * 16 * UNROLL >= H bytes the whole row is one batch: one
// NVLink round trip per row instead of one per batch plus one each for scales and weight.
constexpr int kPullScaleRegs = 2;  // scale words per lane held across the row copy (S <= 64: H <= 8192)

// pull_ctr: null = static distribution (for_each_pool_row_interleaved, SYMM_PULL_DYNAMIC=0); else the
// dynamic one (for_each_pool_row_dynamic) when there are more than 2 work items per warp, pull_chunk
// (1 or 2) items per grab; pull_ctr = this call's counter (pull_counter(), zero at the call's start; a
// fused kernel that passes one must keep that rule: a counter left non-zero makes warps skip rows, and
// the consumers then time out on the arrival counters). Rows, slots, arrivals: identical either way.
template <int UNROLL>
__device__ __forceinline__ void pull_rows(const Workers& W, const SymmLayout& L, const uint64_t* peers, uint64_t local,
                                          const PoolTables& t, int parity, uint32_t* pull_ctr = nullptr,
                                          int pull_chunk = 1) {
  const int K = L.topk, T = L.max_tokens;
  const int64_t H = L.hidden, S = L.scale_cols;
  uint8_t* px = at<uint8_t>(local, L.off_pool_x);
  float* ps = at<float>(local, L.off_pool_s);
  float* pw = at<float>(local, L.off_pool_w);
  int32_t* row_src = at<int32_t>(local, L.off_row_src);
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  auto one_row = [&](int s, int32_t row, int le, int32_t slot) {
    const int32_t flat = ptx::ld_relaxed_sys_s32(meta_slots(local, L, parity, le, s) + slot);
    if (flat < 0 || flat >= T * K) return;  // defensive: never index outside the staging
    const int32_t tok = flat / K, k = flat - tok * K;
    // Combine push order: this row joins bucket (s, tok / chunk). Local relaxed atomics; the combine
    // kernel (a later launch on this stream) reads the buckets. Issued first: off the row's path.
    int32_t bslot = 0;
    if (W.lane == 0) bslot = atomicAdd(cmb_hist(local, L) + s * L.num_chunks + tok / L.combine_chunk, 1);
    const uint64_t src = peers[s];
    const int32_t* s_src = reinterpret_cast<const int32_t*>(stage_s(src, L, parity) + tok * S);
    int32_t* s_dst = reinterpret_cast<int32_t*>(ps + row * S);
    int32_t sv[kPullScaleRegs];
#pragma unroll
    for (int u = 0; u < kPullScaleRegs; ++u) {
      const int i = u * 32 + W.lane;
      if (i < S) sv[u] = ptx::ld_relaxed_sys_s32(s_src + i);
    }
    float wv = 0.f;
    if (W.lane == 0) wv = ptx::ld_f32_coherent(stage_w(src, L, parity) + flat);
    warp_copy_v4<UNROLL, true>(reinterpret_cast<int4*>(px + row * H),
                               reinterpret_cast<const int4*>(stage_x(src, L, parity) + tok * H), (int)(H / 16), W.lane);
#pragma unroll
    for (int u = 0; u < kPullScaleRegs; ++u) {
      const int i = u * 32 + W.lane;
      if (i < S) s_dst[i] = sv[u];
    }
    constexpr int kHeld = 32 * kPullScaleRegs;  // scales beyond these (H > 8192) are copied afterwards
    if (S > kHeld)
      warp_copy_b32<true>(reinterpret_cast<uint32_t*>(s_dst + kHeld), reinterpret_cast<const uint32_t*>(s_src + kHeld),
                          (int)(S - kHeld), W.lane);
    if (W.lane == 0) {
      pw[row] = wv;
      row_src[row] = (s * T + tok) * K + k;
      if (bslot < L.combine_chunk * K) cmb_bucket(local, L, s, tok / L.combine_chunk)[bslot] = row;
    }
    __syncwarp();
    if (W.lane == 0) ptx::red_add_release_gpu_u32(arr + row / L.block_m, 1u);
  };
  // Dynamic only with more than 2 items per warp: with fewer (<= 128 tokens at R = 2 on 132 x 16 warps)
  // the static stride is already balanced and the grid's ~2k same-address atomics would cost ~1 us.
  if (pull_ctr && (int64_t)pool_work_items(L, t) > 2 * W.total_warps()) {
    if (pull_chunk == 2) for_each_pool_row_dynamic<2>(W, L, t, pull_ctr, one_row);
    else for_each_pool_row_dynamic<1>(W, L, t, pull_ctr, one_row);
  } else {
    for_each_pool_row_interleaved(W, L, t, one_row);
  }
}

}  // namespace symm
#endif
