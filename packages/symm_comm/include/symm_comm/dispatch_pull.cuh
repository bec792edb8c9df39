// symm_comm/dispatch_pull.cuh — dispatch phase B on the owner: capacity check, the layout for the
// consumers, padding and the pull of the rows from the sources' staging into the expert-major pool,
// each row published by a red.release.gpu on its block's arrival counter (dispatch.cuh wait_block is
// the consumer's side). Inputs: the pool tables every group built (pool.cuh), after the one-hop
// cross-rank barrier (barrier.cuh) made the sources' metadata and staging visible.
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
// what kNoDedup does), a whole row per batch at H <= 4096 with UNROLL 16 (spill-free in the standalone
// kernel; the fused kernel at 80 registers passes 8): the small-T kernel, where the sources send plain ids
// (unless DispatchArgs::small_dedup) and one round trip per row is the latency that counts.
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
      // store, read by the source's NEXT combine, which acquires this rank's combine start signal
      // before reading cmb_map. What publishes the store (combine_pull.cuh, Order):
      //   kInKernel (a fused kernel: combine in this launch): a gpu-scope grid barrier of this rank's
      //     groups after the pull, then the start signal's red.release.sys (causality order, PTX model);
      //   kKernelBoundary (standalone): the combine is a later kernel on this rank's stream and its
      //     start signal is relaxed. ASSUMPTION (not stated by the PTX memory model, which has no kernel
      //     boundary; true of the hardware: a grid completes only after its stores are acknowledged):
      //     the kernel boundary, not the later kernel's signal, publishes this kernel's peer stores. Known gap: with two dispatches
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
