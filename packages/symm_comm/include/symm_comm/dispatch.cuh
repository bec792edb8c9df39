// symm_comm/dispatch.cuh — expert-granular EP dispatch, as device functions a fused kernel can run
// inside its own warps (all state from the caller). The standalone kernel (csrc/dispatch.cu) is:
//   stage_inputs + clear_combine_buckets (+ push_metadata_* of metadata.cuh, concurrently in one warp
//   per CTA for large T; CTA 0 also zeroes the idle parity's pull counter) -> one-hop cross-rank
//   barrier -> build_pool_tables -> publish_layout (group 0) -> pad_blocks -> pull_rows.
// A fused kernel composing pull_rows must keep both side duties: the combine buckets it counts into
// are cleared in phase A, and its pull counter must be zero when the call starts (pull_rows below).
// Phase A (push of metadata): each source rank scans its topk_idx and writes, into the OWNER of each
//   expert (rank e / L), the count and the (token * K + k) of every slot of (local expert, source);
//   slots in row-major (token, k) order (metadata.cuh). The source also stages x / scales / weights in
//   its own buffer.
// Phase B (pull): each owner pulls the rows from the sources' staging into its expert-major pool,
//   source-interleaved, 16-byte coherent loads, and bumps arrivals[row / block_m] per row.
// (A push dispatch — sources storing rows straight into the owners' pools — and a per-call push / pull
// choice existed until layout v10; removed: the dedup pull is faster at every measured size (2 x
// H200: 1 / 128 / 4096 tokens pull 23.9 / 38.9 / 158.4 us, push 33.2 / 47.7 / 395.1), perf notes.)
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

// Checks the pool capacity; returns false (and reports, group 0 only) if the rows do not fit.
__device__ __forceinline__ bool check_capacity(const Workers& W, const SymmLayout& L, const PoolTables& t,
                                               bool masked, const ErrSink& err) {
  const int Lx = L.num_local_experts;
  if (masked) {
    // The first overflowing local expert, found while the tables were built (build_pool_tables).
    const int le = t.scratch[PoolTables::kMaskedOverflow];
    if (le < Lx) {
      if (W.group == 0 && W.tid() == 0)
        report_error(err, SYMM_ERR_MASKED_OVERFLOW, SYMM_PHASE_DISPATCH_LAYOUT, le, t.le_count[le]);
      return false;
    }
    return true;
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
// from_last: warps take the blocks from the grid's last warp down (which warp pads does not matter).
// aborted (the rows did not fit; nothing is pulled): every block gets block_m, no row is touched,
// so the counters stay in step with the epoch for the next call.
__device__ __forceinline__ void pad_blocks(const Workers& W, const SymmLayout& L, uint64_t local, const PoolTables& t,
                                           bool aborted = false, bool from_last = false) {
  const int32_t U = t.le_start[L.num_local_experts];
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  int32_t* row_src = at<int32_t>(local, L.off_row_src);
  const int bm = L.block_m;
  // from_last: block 0 on the grid's last warp, and so on down (a permutation of the warps)
  const int64_t b0 = from_last ? W.total_warps() - 1 - W.gwarp() : W.gwarp();
#pragma unroll 1
  for (int64_t b = b0; b < L.num_blocks; b += W.total_warps()) {
    const int64_t r0 = b * bm;
    uint32_t pad = 0;
    const bool empty = aborted || r0 >= U;  // no row of the block is written: nothing to publish
    if (empty) {
      pad = bm;
    } else {
#pragma unroll 1
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

// Phase B: pull every row this rank owns, sources interleaved (pool.cuh for_each_pool_row). The scale and weight loads
// are issued before the row's, and with 32 * 16 * UNROLL >= H bytes the whole row is one batch: one
// NVLink round trip per row instead of one per batch plus one each for scales and weight.
// Dedup (layout v7, metadata.cuh send_slot): only a token's LEADER row at this rank is pulled; its
// warp reads the row (and scales) once and stores them into the pool rows of all the token's ks here
// (lane j < K handles k = j: its pool row from meta_map, its weight, row_src, combine bucket entry and
// arrival bump). Non-leader items return after one local load. kNoDedup (a slot overflow this call):
// every row copies itself, as before v7.

// pull_ctr: null = static distribution (for_each_pool_row static stride); else the
// counter mode (one item per grab) when there are more than 2 work items per warp; pull_ctr = this
// call's counter (pull_counter(), zero at the call's start; a
// fused kernel that passes one must keep that rule: a counter left non-zero makes warps skip rows, and
// the consumers then time out on the arrival counters). Rows, slots, arrivals: identical either way.
// kDedup = false: the plain pull of one row per pool row (every entry decoded, fan-out flags ignored:
// what kNoDedup does), a whole row per batch (UNROLL 16 spill-free there): the small-T kernel, where
// the sources send plain ids (unless DispatchArgs::small_dedup) and one round trip per row is the latency that counts.
template <int UNROLL, bool kDedup = true>
__device__ __forceinline__ void pull_rows(const Workers& W, const SymmLayout& L, const uint64_t* peers, uint64_t local,
                                          const PoolTables& t, int parity, uint32_t* pull_ctr = nullptr) {
  const int K = L.topk, T = L.max_tokens, Lx = L.num_local_experts, R = L.num_ranks;
  const int64_t H = L.hidden, S = L.scale_cols;
  const int n16 = (int)(H / 16);
  uint8_t* px = at<uint8_t>(local, L.off_pool_x);
  float* ps = at<float>(local, L.off_pool_s);
  float* pw = at<float>(local, L.off_pool_w);
  int32_t* row_src = at<int32_t>(local, L.off_row_src);
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  const bool dedup = kDedup && t.scratch[PoolTables::kNoDedup] == 0;
  const uint32_t lanes_below = (1u << W.lane) - 1u;
  auto one_row = [&](int s, int32_t row, int le, int32_t slot) {
    const int32_t v = ptx::ld_relaxed_sys_s32(meta_slots(local, L, parity, le, s) + slot);
    if (v < 0 && dedup) return;  // a non-leader: its token's leader stores this row
    const int32_t flat = (v < 0 ? ~v : v) & ~kSlotFanOut;
    if (flat >= T * K) return;  // defensive: never index outside the staging
    const int32_t tok = flat / K, k = flat - tok * K;
    const uint64_t src = peers[s];
    if constexpr (!kDedup) {
      int32_t bslot = 0;  // combine bucket slot: issued first, off the row's path
      if (W.lane == 0) bslot = atomicAdd(cmb_hist(local, L) + s * L.num_chunks + tok / L.combine_chunk, 1);
      const int32_t* s_src = reinterpret_cast<const int32_t*>(stage_s(src, L, parity) + tok * S);
      HeldScales<true> sv;
      sv.load(s_src, S, W.lane);
      float wv = 0.f;
      if (W.lane == 0) wv = ptx::ld_f32_coherent(stage_w(src, L, parity) + flat);
      warp_copy_v4<UNROLL, Load::kCoherent>(reinterpret_cast<int4*>(px + (int64_t)row * H),
                                 reinterpret_cast<const int4*>(stage_x(src, L, parity) + tok * H), n16, W.lane);
      sv.store(reinterpret_cast<int32_t*>(ps + (int64_t)row * S), s_src, S, W.lane);
      if (W.lane == 0) {
        pw[row] = wv;
        row_src[row] = (s * T + tok) * K + k;
        if (bslot < L.combine_chunk * K) cmb_bucket(local, L, s, tok / L.combine_chunk)[bslot] = row;
        if (L.cmb_in_rows > 0) cmb_map(src, L)[flat] = row * R + L.rank;  // pull combine: see below
      }
      __syncwarp();
      if (W.lane == 0) ptx::red_add_release_gpu_u32(arr + row / L.block_m, 1u);
      return;
    }
    // fan: a leader whose token has other ks here (metadata.cuh kSlotFanOut); else one pool row.
    const bool lead = dedup && v >= 0 && (v & kSlotFanOut);
    // Lane j < K: meta_map entry j of the token (leader; lane k's is the mask of the others) and the
    // source's weight of k = j, issued with the scales' loads. The destinations are resolved before
    // the row's loads are issued (one local round trip): with the row in flight meanwhile, the
    // 128-register dispatch kernel spilled 96-232 bytes.
    int32_t mv = -1;
    float wv = 0.f;
    if (W.lane < K) {
      if (lead) mv = ptx::ld_relaxed_sys_s32(meta_map(local, L, parity, s) + tok * K + W.lane);
      if (lead || W.lane == k) wv = ptx::ld_f32_coherent(stage_w(src, L, parity) + tok * K + W.lane);
    }
    const int32_t* s_src = reinterpret_cast<const int32_t*>(stage_s(src, L, parity) + tok * S);
    HeldScales<true> sv;
    sv.load(s_src, S, W.lane);
    // Destinations: lane k = this row; lane j in the leader's mask = pool row of (token, j) here.
    const uint32_t km = lead ? (uint32_t)__shfl_sync(0xffffffffu, mv, k) : 0u;
    int32_t drow = -1;
    if (W.lane == k) {
      drow = row;
    } else if ((km >> W.lane) & 1u) {
      const int32_t le2 = mv / T, sl2 = mv - le2 * T;
      if (mv >= 0 && le2 < Lx && sl2 < t.cnt[le2 * R + s]) drow = t.pos[le2 * R + s] + sl2;
    }
    const uint32_t dmask = __ballot_sync(0xffffffffu, drow >= 0);
    // Combine push order: the rows join bucket (s, tok / chunk), one local atomic for all of them (the
    // combine kernel, a later launch on this stream, reads the buckets).
    int32_t bslot = 0;
    if (W.lane == 0) bslot = atomicAdd(cmb_hist(local, L) + s * L.num_chunks + tok / L.combine_chunk, __popc(dmask));
    bslot = __shfl_sync(0xffffffffu, bslot, 0) + __popc(dmask & lanes_below);
    const int4* xs = reinterpret_cast<const int4*>(stage_x(src, L, parity) + tok * H);
    constexpr int kFan = UNROLL;
    int4 xv[kFan];
    auto load_batch = [&](int base) {
#pragma unroll
      for (int u = 0; u < kFan; ++u) {
        const int i = base + u * 32 + W.lane;
        if (i < n16) xv[u] = ptx::ld_v4_coherent(xs + i);
      }
    };
    auto store_batch = [&](int base) {
      for (uint32_t m = dmask; m; m &= m - 1) {
        int4* xd = reinterpret_cast<int4*>(px + (int64_t)__shfl_sync(0xffffffffu, drow, __ffs(m) - 1) * H);
#pragma unroll
        for (int u = 0; u < kFan; ++u) {
          const int i = base + u * 32 + W.lane;
          if (i < n16) ptx::st_v4(xd + i, xv[u]);
        }
      }
    };
    for (int base = 0; base < n16; base += 32 * kFan) {
      load_batch(base);
      store_batch(base);
    }
    for (uint32_t m = dmask; m; m &= m - 1)
      sv.store(reinterpret_cast<int32_t*>(ps + (int64_t)__shfl_sync(0xffffffffu, drow, __ffs(m) - 1) * S), s_src,
               S, W.lane);
    if (drow >= 0) {
      pw[drow] = wv;
      row_src[drow] = (s * T + tok) * K + W.lane;
      if (bslot < L.combine_chunk * K) cmb_bucket(local, L, s, tok / L.combine_chunk)[bslot] = drow;
      // Pull combine (layout v8): tell the source where its (token, k) row lands here. A plain peer
      // store, read by the source's NEXT combine: it completes with this kernel (stream order on this
      // rank), before this rank's combine signals its start (red.max: relaxed in the standalone
      // kernel), which the source's pull combine acquires before reading cmb_map.
      // ASSUMPTION (not stated by the PTX memory model, which has no kernel boundary; true of the
      // hardware: a grid completes only after its stores are acknowledged): the kernel boundary, not the
      // later kernel's signal, publishes this kernel's peer stores. Everywhere else the
      // library publishes peer stores with an in-kernel fence + release. Known gap: with two dispatches
      // and no combine between, a late store of the first can land after the source's -1 of the
      // second; only a (t, k) the second did not place (a reported error) could then read a stale row.
      // WAR: the source read the previous values in its last combine, which finished before it arrived
      // at this call's one-hop barrier (passed above).
      if (L.cmb_in_rows > 0) cmb_map(src, L)[tok * K + W.lane] = drow * R + L.rank;
    }
    __syncwarp();
    if (drow >= 0) ptx::red_add_release_gpu_u32(arr + drow / L.block_m, 1u);
  };
  // Dynamic only with more than 2 items per warp: with fewer (<= 128 tokens at R = 2 on 132 x 16 warps)
  // every warp has at most 2 items and the grid's ~2k same-address atomics would cost ~1 us.
  const bool dynamic = pull_ctr && (int64_t)pool_work_items(L, t) > 2 * W.total_warps();
  for_each_pool_row(W, L, t, dynamic ? pull_ctr : nullptr, one_row);
}

}  // namespace symm
#endif
