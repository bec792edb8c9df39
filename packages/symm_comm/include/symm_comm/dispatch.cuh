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
// Mode: SYMM_DISPATCH_PUSH=0 (default since v7: the dedup pull is faster at every size) always pull;
//   2 = per call, push iff some rank's num_tokens >= min_tokens (section "per-call mode" below); 1 =
//   always push (process-wide, the same on all ranks).
// Push mode (DispatchArgs::push): no staging copy. Phase A also
//   writes every expert's count into every rank (meta_all) and keeps each id's slot locally
//   (push_slot); after the same one-hop barrier every rank computes EVERY owner's pool positions
//   (build_push_tables: the same integers the owner's build_pool_tables gives) and stores its own rows
//   from the user's x / scales / weights straight into the owners' pools (push_rows, 16-byte SM stores
//   to peer memory), with row_src, the combine bucket entry and the arrival bump (push v2: one system
//   fence and one red per (owner, block) per group of up to 4 rows a warp stored); then a second
//   one-hop barrier (signal row SYMM_SIG_DISPATCH_DONE; every CTA arrives, only CTA 0 waits) so no
//   owner's kernel ends before every source is done.
//   Every pool row, table and counter ends up identical to the pull path's (combine buckets: same
//   contents, the order inside a bucket is atomic order in both modes; combine does not depend on it).
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

// Stagers: stage this rank's x / scales / weights into its own buffer half `parity` (kCopy: pull and
// auto kinds), build the per-token mask of valid k, and report out-of-range expert ids. kHist (push and
// auto kinds): push_hist[parity][0][d][c] += rows of token chunk c routed to owner d (local atomics; the
// half was zeroed by the previous call or symm_reset_state; final after the one-hop barrier, whose
// arrivals include this rank's own CTAs).
template <typename IdxT, bool kCopy = true, bool kHist = false>
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
  // PULL kernel only (!kHist): the AUTO kernel sits at its register limit (this spilled 4 bytes there).
  constexpr bool kSpread = !kHist;
  // 32-bit: nt (threads of the grid) and the shifts (< T * (K + S + 1)) fit.
  auto from_end = [&](int64_t shift) -> int64_t {
    const int n = (int)nt, v = n - 1 - (int)gt - (int)(shift % n);
    return v < 0 ? v + n : v;
  };
  if constexpr (kCopy) {
    float* sw = stage_w(local, L, a.parity);
    // x, scales, weights through ONE inlined copy loop (pool.cuh "Code size"); a source already in
    // place (the caller staged into the buffer itself) is skipped.
#pragma unroll 1
    for (int j = 0; j < 3; ++j) {
      void* dst = j == 0 ? (void*)stage_x(local, L, a.parity) : j == 1 ? (void*)stage_s(local, L, a.parity) : (void*)sw;
      const void* src = j == 0 ? a.x : j == 1 ? (const void*)a.scales : (const void*)a.topk_w;
      const int64_t bytes = j == 0 ? T * H : j == 1 ? T * S * 4 : T * K * 4;
      const int64_t tid = (j == 0 || !kSpread) ? gt : from_end(j == 2 ? T : T + (T * K * 4 + 15) / 16);
      if (src && src != dst) grid_copy_bytes(dst, src, bytes, tid, nt);
    }
    if (!a.topk_w) {
#pragma unroll 1
      for (int64_t i = gt; i < T * K; i += nt) sw[i] = 0.f;
    }
  }
  int32_t* hist = push_hist(local, L, a.parity, 0);
  const int Lx = L.num_local_experts, C = L.num_chunks;
  // kmask: the ids of a token are loaded kIdxBatch at a time (one latency, not K in a row).
  constexpr int kIdxBatch = 8;
  uint32_t* kmask = at<uint32_t>(local, L.off_kmask);
  // Pull combine (layout v8): this call's owners store where each (token, k) row lands into cmb_map in
  // phase B; -1 first, so a row no owner wrote (an error reported in this call) is never read. Ordered
  // before the owners' stores by the one-hop barrier (our arrival is cumulative over these stores).
  int32_t* cmap = L.cmb_in_rows > 0 ? cmb_map(local, L) : nullptr;
  for (int64_t t = kSpread ? nt - 1 - gt : gt; t < T; t += nt) {  // kSpread: from the grid's end (above)
    uint32_t m = 0;
    for (int k0 = 0; k0 < K; k0 += kIdxBatch) {
      int64_t e[kIdxBatch];
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) e[u] = k0 + u < K ? load_idx<IdxT>(a.topk_idx, t * K + k0 + u) : -1;
#pragma unroll
      for (int u = 0; u < kIdxBatch; ++u) {
        const int k = k0 + u;
        if (e[u] >= 0 && e[u] < L.num_experts) {
          m |= 1u << k;
          if (kHist) atomicAdd(hist + (int)(e[u] / Lx) * C + (int)(t / L.combine_chunk), 1);
        } else if (e[u] != -1)
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

// sys_scope (push mode): the arrival counters are also bumped by the peers (red.release.sys), so the
// padding bumps use system scope too (atomics of mixed scopes on one word are not morally strong).
// Padding: one warp per pool block; marks padding rows row_src = -1 and adds the number of padding
// rows of the block to its arrival counter (valid rows are added by pull_rows), so every block's
// counter grows by exactly block_m per dispatch: arrivals[b] == epoch * block_m when complete.
// from_last: warps take the blocks from the grid's last warp down (which warp pads does not matter).
// aborted (the rows did not fit; nothing is pulled): every block gets block_m, no row is touched,
// so the counters stay in step with the epoch for the next call.
__device__ __forceinline__ void pad_blocks(const Workers& W, const SymmLayout& L, uint64_t local, const PoolTables& t,
                                           bool aborted = false, bool sys_scope = false, bool from_last = false) {
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
    if (W.lane == 0 && pad) {
      // push mode, a block no row of which is written (beyond the used rows, or aborted): a relaxed
      // sys-scope bump, no fence (it publishes no data; consumers of such a block read nothing).
      if (sys_scope && empty) ptx::red_add_relaxed_sys_u32(arr + b, pad);
      else if (sys_scope) ptx::red_add_release_sys_u32(arr + b, pad);
      else ptx::red_add_release_gpu_u32(arr + b, pad);
    }
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

// pull_ctr: null = static distribution (for_each_pool_row static stride, SYMM_PULL_DYNAMIC=0); else the
// counter mode (one item per grab) when there are more than 2 work items per warp; pull_ctr = this
// call's counter (pull_counter(), zero at the call's start; a
// fused kernel that passes one must keep that rule: a counter left non-zero makes warps skip rows, and
// the consumers then time out on the arrival counters). Rows, slots, arrivals: identical either way.
// kDedup = false: the plain pull of one row per pool row (every entry decoded, fan-out flags ignored:
// what kNoDedup does), a whole row per batch (UNROLL 16 spill-free there): the small-T kernel, where
// the sources send plain ids (unless SYMM_SMALL_DEDUP) and one round trip per row is the latency that counts.
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
      // rank), before this rank's combine signals its start (red.max: relaxed by default, release with
      // SYMM_COMBINE_START_RELAXED=0), which the source's pull combine acquires before reading cmb_map.
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


// ==== per-call mode (SYMM_DISPATCH_PUSH=2; the default is 0, pull) ======================================
// Rule: a call pushes iff max over ranks s of num_tokens(s) >= min_tokens (host: symm_dispatch_kind,
// identical on every rank: same layout, same environment). The host launches, per rank:
//   kind PULL (0): SYMM_DISPATCH_PUSH=0, push impossible (shared memory), or max_tokens < min_tokens
//                  (no rank can reach the threshold): the pull kernel, no decision in the kernel;
//   kind PUSH (1): SYMM_DISPATCH_PUSH=1, or auto with THIS rank's num_tokens >= min_tokens: this rank
//                  knows the max reaches the threshold, so the call pushes on every rank: push-only
//                  phase A (no staging copy);
//   kind AUTO (2): auto with this rank's num_tokens < min_tokens: phase A for both modes (staging copy,
//                  slots to the owners, local slot map, counts to every rank: the extra cost is small
//                  because T is below the threshold), then decide_push after the one-hop barrier.
// Consistency: pull is decided only if EVERY rank's T < min_tokens, i.e. every rank ran a PULL or AUTO
// phase A (staged, sent its slots); push is decided iff some rank's T >= min_tokens, and then every
// rank ran a PUSH or AUTO phase A (local slot map, counts in meta_all). No extra host sync, no extra
// cross-rank hop: the decision input rides on the one-hop barrier that both modes have.

// Phase A, every kind: thread r < R of CTA 0 stores this call's num_tokens into rank r's
// meta_all[parity][E][rank] (plain store). Ordered before r's read (decide_push) by the one-hop
// barrier: bar.sync, then the CTA's red.release.sys arrival (cumulative: barrier.cuh), acquired by
// r's thread (this rank) with ld.acquire.sys. WAR on the parity half: as meta_all's counts (call e + 2
// of this rank writes it only after r passed call e + 1's barrier, i.e. finished call e).
__device__ __forceinline__ void publish_num_tokens(const SymmLayout& L, const uint64_t* peers, const DispatchArgs& a) {
  if (blockIdx.x == 0 && (int)threadIdx.x < L.num_ranks)
    meta_all(peers[threadIdx.x], L, a.parity)[(int64_t)L.num_experts * L.num_ranks + L.rank] = a.num_tokens;
}

// After the one-hop barrier, all threads of the CTA (uniform result, bar.sync inside): thread r < R
// reads rank r's num_tokens (same thread that acquired r's arrival in cta_rank_barrier_counted, so the
// load is ordered after it), push iff any is >= min_tokens. Every CTA of every rank reads the same R
// words of this call: the same answer everywhere.
__device__ __forceinline__ bool decide_push(const SymmLayout& L, uint64_t local, int parity, int32_t min_tokens) {
  bool big = false;
  if ((int)threadIdx.x < L.num_ranks)
    big = ptx::ld_relaxed_sys_s32(meta_all(local, L, parity) + (int64_t)L.num_experts * L.num_ranks + threadIdx.x) >=
          min_tokens;
  return __syncthreads_or(big) != 0;
}

// ==== push mode ======================================================================================
// Shared-memory ints of the push tables (host and device): pos [E], ok [R], le_start per owner [R][L + 1].
SYMM_LAYOUT_HD int64_t symm_push_smem_ints(const SymmLayout* L) {
  return (int64_t)L->num_experts + L->num_ranks + (int64_t)L->num_ranks * (L->num_local_experts + 1);
}

// Every owner's pool positions of THIS source's rows: pos[e] = first pool row of (e, this rank) at the
// owner d = e / L (= the owner's PoolTables pos[le][rank]); ok[d] = d's rows fit (the owner's
// check_capacity gives the same answer from the same counts: the source never stores into an owner
// that overflows, so "nothing written on overflow" holds at the owner).
struct PushTables {
  int32_t* pos;       // [E]
  int32_t* ok;        // [R]
  int32_t* le_start;  // [R][L + 1]
  __device__ __forceinline__ static PushTables carve(int32_t* smem, const SymmLayout& L) {
    PushTables p;
    p.pos = smem;
    p.ok = p.pos + L.num_experts;
    p.le_start = p.ok + L.num_ranks;
    return p;
  }
};

// All threads of the group. counts: meta_all[parity] ([E][R], written by every source in phase A,
// ordered before this by the one-hop barrier; read coherently). Counts are clamped to [0, T] as
// build_pool_tables does, so every integer equals the owner's.
// Two passes (push v2): (1) every thread of the group takes experts e (E <= a few per thread) and
// loads its R counts in batches of kTabBatch independent loads (one latency per batch, not R in a
// row): le_count -> le_start[d][le] (for now), pre -> pos[e]; (2) one warp per owner scans. Was: one
// warp per owner did everything (R warps busy, Lx / 32 x R dependent loads each).
constexpr int kTabBatch = 8;
__device__ __forceinline__ void build_push_tables(const Workers& W, const SymmLayout& L, const PushTables& p,
                                                  const int32_t* counts, bool masked) {
  const int Lx = L.num_local_experts, R = L.num_ranks, T = L.max_tokens, me = L.rank, E = L.num_experts;
  for (int e = W.tid(); e < E; e += W.nthreads()) {
    int32_t tot = 0, pre = 0;
    for (int s0 = 0; s0 < R; s0 += kTabBatch) {
      int32_t c[kTabBatch];
#pragma unroll
      for (int u = 0; u < kTabBatch; ++u) c[u] = s0 + u < R ? ptx::ld_relaxed_sys_s32(counts + (int64_t)e * R + s0 + u) : 0;
#pragma unroll
      for (int u = 0; u < kTabBatch; ++u) {
        const int32_t v = c[u] < 0 ? 0 : (c[u] > T ? T : c[u]);
        tot += v;
        if (s0 + u < me) pre += v;
      }
    }
    const int d = e / Lx;
    p.le_start[d * (Lx + 1) + (e - d * Lx)] = tot;  // le_count for now
    p.pos[e] = pre;
  }
  W.sync();
  for (int d = W.warp; d < R; d += W.nwarps) {
    int32_t* ls = p.le_start + d * (Lx + 1);
    bool bad = false;
    for (int le = W.lane; le < Lx; le += 32) bad |= ls[le] > L.max_m;
    __syncwarp();
    bool ok;
    if (masked) {
      for (int le = W.lane; le < Lx; le += 32) ls[le] = le * L.max_m;
      ok = !__any_sync(0xffffffffu, bad);
    } else {
      const int bm = L.block_m;
      // in place: each lane reads its element before any lane writes (shuffles in between)
      warp_exclusive_scan(Lx, [&](int i) { return (ls[i] + bm - 1) / bm * bm; }, ls, W.lane);
      __syncwarp();
      ok = (int64_t)ls[Lx] <= L.pool_rows;
    }
    __syncwarp();
    for (int le = W.lane; le < Lx; le += 32) p.pos[d * Lx + le] += ls[le];
    if (W.lane == 0) p.ok[d] = ok ? 1 : 0;
  }
  W.sync();
}

// Phase A of push mode (the stagers, instead of stage_inputs): kmask + bad-id reports + bucket sizes
// (push_hist[parity][0]), no copy.
template <typename IdxT>
__device__ __forceinline__ void stage_push(const Stagers& st, const SymmLayout& L, uint64_t local,
                                           const DispatchArgs& a, const ErrSink& err) {
  stage_inputs<IdxT, /*kCopy=*/false, /*kHist=*/true>(st, L, local, a, err);
}

// Both modes, phase A (stagers): zeroes push_hist[parity ^ 1] (both counters) for the next call. No CTA
// of this call touches that half; the previous call (its last user) completed before this one started
// and the next one starts after this one completed (stream order). Done in pull calls too, so mixing
// modes between calls keeps the halves zeroed.
__device__ __forceinline__ void clear_push_hist(const Stagers& st, const SymmLayout& L, uint64_t local, int parity) {
  int32_t* h = push_hist(local, L, parity ^ 1, 0);
  const int64_t n = 2 * (int64_t)L.num_ranks * L.num_chunks;  // [which][R][C] of that parity: contiguous
  for (int64_t i = st.gt; i < n; i += st.nt) h[i] = 0;
}

// Phase B of push mode, all threads of the grid (i = W.gthread()): the final combine bucket sizes of
// (this source, chunk c) into every owner's cmb_hist[rank][c] (one writer per (source, chunk) bucket
// at each owner; an owner that overflows gets 0, as its pull would). Plain stores: the owner reads them
// in a later kernel, ordered by the completion barrier (bar.sync + red.release.sys here,
// ld.acquire.sys there). WAR: the owner zeroed cmb_hist in its phase A and its previous combine (the
// last reader) ended before its dispatch started, both before its one-hop barrier arrival we acquired.
__device__ __forceinline__ void push_bucket_counts(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                   uint64_t local, const PushTables& p, int parity) {
  const int R = L.num_ranks, C = L.num_chunks;
  const int32_t* hist = push_hist(local, L, parity, 0);
  for (int64_t i = W.gthread(); i < (int64_t)R * C; i += W.total_threads()) {
    const int d = (int)(i / C), c = (int)(i - (int64_t)d * C);
    const int32_t v = p.ok[d] ? ptx::ld_relaxed_gpu_s32(hist + i) : 0;
    cmb_hist(peers[d], L)[L.rank * C + c] = v;
  }
}

// Phase B of push mode: every valid (token, k) of this rank, item q = token * K + k, stored into the
// owner d = e / L at pool row pos[e] + slot: x row (16-byte loads of the user's tensor, 16-byte
// stores to the owner; d == rank: a plain local copy), scales, weight, row_src, the combine bucket entry
// cmb_bucket[rank][chunk][bslot] (bslot from the source-local push_hist[parity][1], one writer per
// bucket), then the arrival bump at the owner.
// Push v2: a warp takes a GROUP of g consecutive items (g = 4 when there are >= 8 items per warp, 2
// when >= 4, else 1). Lane j < g resolves item q0 + j (id, slot, row, bucket slot, weight: all in
// parallel); the warp stores the group's rows one after the other (each row: 14 loads then 14
// stores), lane j stores its row's weight / row_src / bucket entry; then ONE publication per group:
//   every lane fence.acq_rel.sys (its own stores of all g rows), __syncwarp, and for each distinct
//   (owner, block) among the group's rows one lane (the lowest, __match_any_sync) does
//   red.release.sys arrivals[block] += (rows of the group in that block).
// A consumer that acquires (ld.acquire.sys) arrivals[b] == epoch * block_m therefore sees every row of
// block b, as before; only the number of red operations and system fences changes (per group, not
// per row). Counter semantics unchanged: every block grows by exactly block_m per dispatch.
// ctr: null = static stride over the groups; else this call's work counter (pull_counter(parity),
// zero at the call's start; same rules as pull_rows), counting GROUPS, used when groups > 2 x warps.
constexpr int kPushGroupMax = 4;
template <int UNROLL, typename IdxT>
__device__ __forceinline__ void push_rows(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                          uint64_t local, const DispatchArgs& a, const PushTables& p,
                                          uint32_t* ctr) {
  const int K = L.topk, T = L.max_tokens, Lx = L.num_local_experts, C = L.num_chunks;
  const int64_t H = L.hidden, S = L.scale_cols;
  const int32_t N = a.num_tokens * K;  // < 2^31 (symm_layout_compute)
  const int32_t* my_slot = push_slot(local, L);
  int32_t* bctr = push_hist(local, L, a.parity, 1);
  const uint8_t* xin = static_cast<const uint8_t*>(a.x);
  const int64_t warps = W.total_warps();
  const int g = (int64_t)N >= 2 * kPushGroupMax * warps ? kPushGroupMax : ((int64_t)N >= 4 * warps ? 2 : 1);
  const int32_t ngroups = (N + g - 1) / g;
  auto one_group = [&](int32_t q0) {
    // ---- lane j < g: item q0 + j
    const int32_t q = q0 + W.lane;
    bool valid = false;
    int d = 0;
    int32_t row = 0, tok = 0;
    if (W.lane < g && q < N) {
      const int64_t e = load_idx<IdxT>(a.topk_idx, q);
      if (e >= 0 && e < L.num_experts) {  // -1 sends nothing; out of range: reported in phase A
        // written in phase A by (maybe) another CTA, ordered by the one-hop barrier: coherent load
        const int32_t slot = ptx::ld_relaxed_gpu_s32(my_slot + q);
        d = (int)(e / Lx);
        // slot overflow (reported in phase A; the pull drops these too); owner overflows: nothing is
        // stored into it (it reports)
        if (slot >= 0 && slot < T && p.ok[d]) {
          valid = true;
          row = p.pos[e] + slot;
          tok = q / K;
        }
      }
    }
    const unsigned vmask = __ballot_sync(0xffffffffu, valid);
    if (!vmask) return;
    float wv = 0.f;
    int32_t bslot = 0;
    if (valid) {
      if (a.topk_w) wv = __ldg(a.topk_w + q);
      bslot = atomicAdd(bctr + d * C + tok / L.combine_chunk, 1);
    }
    // ---- the group's rows, one after the other (the whole warp per row)
    for (unsigned m = vmask; m; m &= m - 1) {
      const int j = __ffs(m) - 1;
      const int dj = __shfl_sync(0xffffffffu, d, j);
      const int32_t rj = __shfl_sync(0xffffffffu, row, j);
      const int32_t tj = __shfl_sync(0xffffffffu, tok, j);
      const uint64_t dst = peers[dj];
      const int32_t* s_src = reinterpret_cast<const int32_t*>(a.scales) + (int64_t)tj * S;
      HeldScales<false> sv;
      sv.load(s_src, S, W.lane);
      warp_copy_v4<UNROLL, Load::kLocalOrdered>(reinterpret_cast<int4*>(at<uint8_t>(dst, L.off_pool_x) + (int64_t)rj * H),
                           reinterpret_cast<const int4*>(xin + (int64_t)tj * H), (int)(H / 16), W.lane);
      sv.store(at<int32_t>(dst, L.off_pool_s) + (int64_t)rj * S, s_src, S, W.lane);
    }
    // ---- per-row words, lane j for its own row
    if (valid) {
      const uint64_t dst = peers[d];
      const int32_t k = q - tok * K;
      const int c = tok / L.combine_chunk;
      at<float>(dst, L.off_pool_w)[row] = wv;
      at<int32_t>(dst, L.off_row_src)[row] = (L.rank * T + tok) * K + k;
      if (L.cmb_in_rows > 0) cmb_map(local, L)[q] = row * L.num_ranks + d;  // pull combine (local here)
      if (bslot < L.combine_chunk * K) cmb_bucket(dst, L, L.rank, c)[bslot] = row;
    }
    // ---- one publication for the group (contract above)
    ptx::fence_acq_rel_sys();
    __syncwarp();
    const int32_t blk = row / L.block_m;
    const uint64_t key = valid ? (((uint64_t)(uint32_t)d << 32) | (uint32_t)blk) : ~0ull;
    const unsigned same = __match_any_sync(0xffffffffu, key);
    if (valid && W.lane == __ffs(same) - 1)
      ptx::red_add_release_sys_u32(at<uint32_t>(peers[d], L.off_arrivals) + blk, (uint32_t)__popc(same));
  };
  if (ctr && (int64_t)ngroups > 2 * warps) {
    for (;;) {
      int32_t gi = 0;
      if (W.lane == 0) gi = (int32_t)ptx::atom_add_relaxed_gpu_u32(ctr, 1u);
      gi = __shfl_sync(0xffffffffu, gi, 0);
      if (gi >= ngroups) break;
      one_group(gi * g);
    }
  } else {
    for (int64_t gi = W.gwarp(); gi < ngroups; gi += warps) one_group((int32_t)gi * g);
  }
}

}  // namespace symm
#endif
