// Standalone dispatch kernel: a thin composition of the device functions in symm_comm/dispatch.cuh
// and symm_comm/metadata.cuh. One cooperative launch: stage + phase A push -> one-hop cross-rank
// barrier -> phase B pull -> last CTA out publishes the epoch.
// Push calls: phase A without the staging copy -> one-hop barrier -> every owner's tables -> phase B push
// (this rank's rows into the owners) -> one-hop "done" barrier -> last CTA out publishes the epoch.
// Which calls push: SYMM_DISPATCH_PUSH=0 (default since layout v7) never: the pull reads a token's row
// once per owner (dedup) and beats the push 2.4-2.7x from 1024 tokens on (2 x H200); 2 per call, push
// iff some rank's num_tokens >= SYMM_PUSH_MIN_TOKENS (default 2048 at H 7168, K 8); 1 always push
// (symm_dispatch_kind, include/symm_comm/dispatch.cuh "per-call mode").
// The A/B environment knobs (SYMM_SMALL_DEDUP, SYMM_META_ONEPASS, SYMM_PULL_DYNAMIC, SYMM_BARRIER_FENCE,
// SYMM_PAD_LATE, SYMM_META_SPREAD) were removed 2026-12-01: their defaults are compiled in below; comments
// that name them describe the measured alternative.
#include <cuda_runtime.h>
#include <stdint.h>
#include "launch.h"
#include "symm_api.h"
#include "symm_comm/symm_comm.cuh"

namespace {
constexpr int kThreads = 512;  // 1 CTA per SM, up to 128 registers
// Pull: vectors per lane per batch. Dedup kernels (T * K > kMetaWarpMaxIds, or > kPlainPullMaxIds with
// SYMM_SMALL_DEDUP, the default): 7 = two batches (round
// trips) per row at H 7168; with the fan-out (one read, several pool rows) 14 spills 16-92 bytes in the
// 128-register kernel, and a one-row path with 14 or 16 beside it in the same kernel spilled more
// (v7, ptxas -v). Small-T kernels (plain pull, no fan-out code): 16, a whole row per batch.
constexpr int kPullUnroll = 7;
constexpr int kPullUnrollPlain = 16;
constexpr int64_t kMaxMetaSmem = 160 * 1024;  // one-pass metadata counts (E ints): up to 40960 experts
constexpr int kPushUnroll = 14;  // push: H 7168: 448 vectors = 14 per lane, one batch (16 spills)
constexpr int64_t kMaxPushSmem = 160 * 1024;  // pool + push tables; beyond it the pull path runs

// kKind (SYMM_KIND_*, dispatch.cuh "per-call mode"): PULL = the pull kernel, PUSH = the push kernel,
// AUTO = phase A for both, the mode decided after the one-hop barrier. Separate instantiations so the
// pull kernel's code (and register allocation) stays what it was.
// kDedup (PULL kind only; AUTO always, PUSH never): the pull with the dedup fan-out (pool.cuh / dispatch.cuh,
// layout v7), chosen by the host when this rank's T * K > kMetaWarpMaxIds (> symm::kPlainPullMaxIds with
// SYMM_SMALL_DEDUP (default) and K dividing 32: its sources then likely send fanned-out leaders); false = the plain pull (decodes any entry, one pool row per read). Either kernel
// is correct whatever the sources sent; the choice only moves time.
// The dispatch kernel's run-time switches (one int, bits): each names its environment knob.
enum DispatchKnob : int {
  kKnobDynamic = 1,      // SYMM_PULL_DYNAMIC (default on): pull rows (and push items) from a work counter
  kKnobAllFence = 2,     // SYMM_BARRIER_FENCE=1 (A/B): every thread fences before the one-hop barrier's arrival
  kKnobPadLate = 4,      // SYMM_PAD_LATE (default on): the pull's padding on the grid's last warps
  kKnobMetaPacked = 8,   // SYMM_META_SPREAD=0 (A/B): the small-T metadata's experts on the first CTAs' warps
};
template <typename IdxT, int kKind, bool kDedup = kKind != SYMM_KIND_PUSH>
__global__ void __launch_bounds__(kThreads, 1)
    symm_dispatch_kernel(SymmLayout L, const uint64_t* peers_g, symm::DispatchArgs a, int32_t* host_err,
                         uint64_t timeout_ns, int onepass, int knobs, int32_t push_min_tokens) {
  // knobs: DispatchKnob bits (kKnobDynamic also selects the dynamic distribution of the push items: same
  // counter word).
  using namespace symm;
  extern __shared__ int32_t smem[];
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const Workers W = Workers::cta();
  const CallStart call = begin_call(L, peers_g, s_peers, SYMM_OP_DISPATCH, host_err, timeout_ns);
  const uint64_t local = call.local, epoch = call.epoch, deadline = call.deadline;
  const ErrSink& err = call.err;
  a.parity = (int)(epoch & 1);
  a.push = kKind;  // a compile-time constant inside (the metadata's mode-specific stores fold away)
  const PoolTables t = PoolTables::carve(smem, L);

  const bool st0 = blockIdx.x == 0 && threadIdx.x == 0;  // stamps 0..4: CTA 0's view; 5: last CTA out
  if (st0) stamp(local, L, 0);
  // Pull work counters (pool.cuh, for_each_pool_row, counter mode): this call uses [parity]; CTA 0 zeroes
  // [parity ^ 1] for the next call. Race-free: no CTA of this call touches [parity ^ 1]; the previous
  // call (the last user of it) completed before this kernel started, and the next call (its next user)
  // starts after this kernel completed (stream order: the epoch protocol already needs calls in stream
  // order), so the plain store is visible to it. [parity] was zeroed by the previous call, or by
  // symm_reset_state (creation / resync, both words) — also after a timed-out call. Both modes use it.
  if (st0) *pull_counter(local, L, a.parity ^ 1) = 0u;
  publish_num_tokens(L, s_peers, a);  // every kind (the auto ranks' decision input; dispatch.cuh)
  // Phase A. Large T (the default): warp 0 of the first G CTAs pushes the metadata in one pass over
  // its CTA's token range (its shared memory: the tables' space, built only after the barrier) while
  // every other warp stages the inputs.
  const bool small = (int64_t)a.num_tokens * L.topk <= kMetaWarpMaxIds;
  const int G = (small || !onepass) ? 0 : (gridDim.x < SYMM_META_MAX_GROUPS ? (int)gridDim.x : SYMM_META_MAX_GROUPS);
  bool meta_ok = true;
  if (W.warp == 0 && (int)blockIdx.x < G) {
    meta_ok = push_metadata_onepass<IdxT>(W, L, s_peers, local, a, G, smem, deadline, err);
  } else {
    const Stagers sg = Stagers::of(W, G);
    clear_combine_buckets(sg, L, local);
    clear_push_hist(sg, L, local, a.parity);
    // PULL: staging copy + kmask; PUSH: kmask + bucket sizes, no copy; AUTO: all of it (T < threshold)
    stage_inputs<IdxT, kKind != SYMM_KIND_PUSH, kKind != SYMM_KIND_PULL>(sg, L, local, a, err);
  }
  // smem: free until the tables (after the barrier); bit 3: SYMM_META_SPREAD=0 (metadata.cuh)
  if (small) push_metadata_warp<IdxT>(W, L, s_peers, a, smem, err, (knobs & kKnobMetaPacked) == 0);
  else if (!onepass) push_metadata<IdxT>(W, L, s_peers, a, t.scratch, err);

  // One-hop cross-rank barrier (barrier.cuh): after it, every rank's metadata for us and staging
  // (its own CTAs' included) is visible. No grid barrier: our own CTAs are counted like a peer's.
  __syncthreads();  // stamp 1 = CTA 0's whole phase A (metadata warp and stagers)
  if (st0) stamp(local, L, 1);
  const bool all_fence = (knobs & kKnobAllFence) != 0;
  if (cta_rank_barrier_counted(s_peers, local, L, SYMM_OP_DISPATCH, epoch, deadline, err,
                               SYMM_PHASE_DISPATCH_RANKS, meta_ok, true, all_fence)) {
    if (st0) stamp(local, L, 2);
    // The call's mode: fixed by the kernel kind, or (AUTO) from every rank's num_tokens (same answer
    // in every CTA of every rank; dispatch.cuh decide_push). Stamp 11 records it (not a time).
    const bool push = kKind == SYMM_KIND_PUSH ||
                      (kKind == SYMM_KIND_AUTO && decide_push(L, local, a.parity, push_min_tokens));
    if (st0) state_stamps(local, L)[11] = SYMM_MODE_STAMP_SET | (kKind << 4) | (push ? 1 : 0);
    // Phase B
    build_pool_tables<kKind != SYMM_KIND_PUSH>(W, L, t, meta_count(local, L, a.parity), a.masked != 0);
    if (kKind != SYMM_KIND_PULL && push) {
      // Contract of the peer stores below: every owner d arrived at the one-hop barrier (acquired
      // above) only from inside its dispatch kernel of this epoch, so every earlier kernel on d's
      // stream (the previous combine reading cmb_hist / cmb_order / row_src, consumers of the pool)
      // has completed: nobody reads the regions we store into. The owner reads what we store only
      // after the "done" barrier below (or, a fused consumer, after acquiring arrivals[block]).
      const PushTables pt = PushTables::carve(smem + symm_tables_smem_ints(&L), L);
      build_push_tables(W, L, pt, meta_all(local, L, a.parity), a.masked != 0);
      if (!check_capacity(W, L, t, a.masked != 0, err)) {
        pad_blocks(W, L, local, t, /*aborted=*/true, /*sys_scope=*/true);
      } else {
        if (blockIdx.x == 0) publish_layout(W, L, local, t);
        pad_blocks(W, L, local, t, false, /*sys_scope=*/true);
      }
      if (st0) stamp(local, L, 3);
      push_bucket_counts(W, L, s_peers, local, pt, a.parity);
      push_rows<kPushUnroll, IdxT>(W, L, s_peers, local, a, pt, (knobs & kKnobDynamic) ? pull_counter(local, L, a.parity) : nullptr);
      __syncthreads();
      if (st0) stamp(local, L, 10);  // CTA 0 finished storing (stamp 10: push calls only)
      // Completion: this CTA's stores (bar.sync, then red.release.sys per
      // rank) -> every rank's signal row SYMM_SIG_DISPATCH_DONE. Only CTA 0 then waits (ld.acquire.sys,
      // time limit, phase DISPATCH_PUSH_DONE) until every CTA of every source finished storing into
      // this rank; the other CTAs arrive and go on to exit (push v2). Contract: the kernel completes
      // only after CTA 0 does, i.e. after CTA 0 acquired every source's arrival (each cumulative over
      // that CTA's stores into us); the kernel boundary then orders all of it before any later kernel
      // on this stream (combine, pool consumers). No CTA of this kernel reads what peers stored here.
      // The row also grows by 2^32 in pull calls (rank_arrive_whole), so "word >= epoch << 32" holds
      // across mode switches (barrier.cuh).
      cta_rank_barrier_counted(s_peers, local, L, SYMM_SIG_DISPATCH_DONE, epoch, deadline, err,
                               SYMM_PHASE_DISPATCH_PUSH_DONE, /*arrive=*/true, /*wait=*/blockIdx.x == 0, all_fence);
    } else {
      rank_arrive_whole(s_peers, L, SYMM_SIG_DISPATCH_DONE);  // keep the done row counted (every pull call)
      if (!check_capacity(W, L, t, a.masked != 0, err)) {
        pad_blocks(W, L, local, t, /*aborted=*/true);  // keep arrivals == epoch * block_m
      } else {
        if (blockIdx.x == 0) publish_layout(W, L, local, t);
        // bit 2 (SYMM_PAD_LATE): the padding (every block's) from the grid's LAST warp down; in a small
        // call those warps hold no pull item (the items sit on CTAs 0-63 at 128 tokens, and padding
        // the used blocks cost the first CTAs ~3 us before their pull, per-CTA stamps; measured
        // 2026-11-30: 1 token 21.95 -> 19.62 us). Any warp order is correct.
        pad_blocks(W, L, local, t, false, false, (knobs & kKnobPadLate) != 0);
        if (st0) stamp(local, L, 3);
        pull_rows<kDedup ? kPullUnroll : kPullUnrollPlain, kDedup>(W, L, s_peers, local, t, a.parity,
                               (knobs & kKnobDynamic) ? pull_counter(local, L, a.parity) : nullptr);
      }
    }
  }
  // Every exit path: the last CTA out publishes the epoch (barrier.cuh).
  if (st0) stamp(local, L, 4);
  __syncthreads();
  if (threadIdx.x == 0 &&
      cta_end_publish_epoch(state_grid_bar(local, L, SYMM_OP_DISPATCH), state_epoch(local, L) + SYMM_OP_DISPATCH, epoch))
    stamp(local, L, 5);
}

__global__ void symm_reset_kernel(SymmLayout L, uint64_t local, uint64_t e_d, uint64_t e_c) {
  using namespace symm;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    state_epoch(local, L)[SYMM_OP_DISPATCH] = e_d;
    state_epoch(local, L)[SYMM_OP_COMBINE] = e_c;
    for (int op = 0; op < SYMM_NUM_OPS; ++op) *state_grid_bar(local, L, op) = 0u;
    for (int i = 10; i < 12; ++i) state_stamps(local, L)[i] = 0;  // push-mode stamp (10); 11 unused
    *at<uint32_t>(local, L.off_state + SYMM_STATE_META_BAR) = 0u;  // a timed-out metadata barrier leaves it mid-count
    for (int p = 0; p < 2; ++p) *pull_counter(local, L, p) = 0u;  // a timed-out call may leave its counter used
    for (int w = 0; w < SYMM_ERR_WORDS; ++w) state_err(local, L)[w] = 0;
  }
  const int64_t nthr = (int64_t)gridDim.x * blockDim.x;
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  for (int64_t b = i; b < L.num_blocks; b += nthr) arr[b] = (uint32_t)(e_d * (uint64_t)L.block_m);
  // Signals as if every peer had completed (dispatch) / started (combine) the current epochs: run only
  // by the collective resync / at creation, when no kernel runs on any rank.
  for (int64_t r = i; r < L.num_ranks; r += nthr) {
    signals(local, L, SYMM_OP_DISPATCH)[r] = e_d << 32;
    signals(local, L, SYMM_OP_COMBINE)[r] = combine_signal(e_c, false, true);  // epoch e_c started, zeroed
    signals(local, L, SYMM_SIG_DISPATCH_DONE)[r] = e_d << 32;  // counted like the dispatch row
  }
  uint32_t* ca = cmb_arr(local, L, 0);
  for (int64_t j = i; j < 2 * L.cmb_arr_half / 4; j += nthr) ca[j] = 0u;
  int32_t* h = cmb_hist(local, L);
  for (int64_t j = i; j < (int64_t)L.num_ranks * L.num_chunks; j += nthr) h[j] = 0;
  int32_t* ph = push_hist(local, L, 0, 0);  // both parities, both counters (a timed-out call leaves them used)
  for (int64_t j = i; j < 4 * (int64_t)L.num_ranks * L.num_chunks; j += nthr) ph[j] = 0;
}
}  // namespace

// Default auto threshold (SYMM_PUSH_MIN_TOKENS unset): push iff some rank has >= kPushMinIdBytes /
// (K * H) tokens (2048 at H 7168, K 8). From the 2 x H200 measurements (push v2 vs pull, bench/comm.py):
// push - pull = +9.6 us at 1 token, +9.5 at 128, -12.6 at 4096; a linear fit (fixed ~+10 us: second
// cross-rank hop + every owner's tables; variable ~-5.6 ns per token at H 7168, K 8: the staging copy
// and the faster write direction, both proportional to the rows' bytes) crosses at ~1800 tokens. 2048
// is the first power of two past it (predicted -1.5 us there); below, pull; the bytes scale the same
// way at other H, K. docs/perf-notes-symm_comm.md section 2 (measured before the pull dedup).
constexpr int64_t kPushMinIdBytes = 2048LL * 8 * 7168;

extern "C" int symm_dispatch_kind(const SymmLayout* layout, int num_tokens, int mode, int min_tokens_env,
                                  int32_t* min_tokens_out) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  const SymmLayout& L = *layout;
  const int64_t per_tok = (int64_t)L.topk * L.hidden;
  const int64_t dflt = per_tok > 0 ? (kPushMinIdBytes + per_tok - 1) / per_tok : 1;
  const int32_t min_tokens = min_tokens_env >= 0 ? min_tokens_env : (int32_t)(dflt < 1 ? 1 : dflt);
  if (min_tokens_out) *min_tokens_out = min_tokens;
  const int64_t push_tables = symm_tables_smem_ints(&L) + symm::symm_push_smem_ints(&L);
  if (mode == 0 || push_tables * 4 > kMaxPushSmem) return SYMM_KIND_PULL;  // push needs its tables in smem
  if (mode == 1) return SYMM_KIND_PUSH;
  if (L.max_tokens < min_tokens) return SYMM_KIND_PULL;  // no rank can reach the threshold: no decision
  return num_tokens >= min_tokens ? SYMM_KIND_PUSH : SYMM_KIND_AUTO;
}

extern "C" int symm_dispatch(const SymmLayout* layout, const uint64_t* peers, const void* x, const float* scales,
                             const void* topk_idx, int idx_bytes, const float* topk_w, int num_tokens, int masked,
                             int num_sms, int64_t timeout_ns, int32_t* host_err, cudaStream_t stream) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  const SymmLayout& L = *layout;
  if (!peers || num_tokens < 0 || num_tokens > L.max_tokens || (idx_bytes != 4 && idx_bytes != 8) || timeout_ns <= 0)
    return SYMM_EINVAL;
  if (num_tokens > 0 && (!x || !scales || !topk_idx)) return SYMM_EINVAL;
  if (!symm_host::aligned16(x) || !symm_host::aligned16(scales) || !symm_host::aligned16(topk_w) ||
      !symm_host::aligned16(peers))
    return SYMM_EALIGN;
  // Small T sends the dedup encoding too, and the dedup pull
  // kernel runs from T * K > kPlainPullMaxIds on (the plain one below it: nothing to deduplicate at a
  // few tokens, and its one round trip per row is shorter). Measured 2026-11-30 (2 x H200, same lease):
  // 128 tokens 34.94 -> 32.16 us. Ranks may differ: either pull kernel decodes either encoding.
  constexpr int small_dedup = 1;
  symm::DispatchArgs a{x, scales, topk_idx, topk_w, num_tokens, masked ? 1 : 0, 0, 0, small_dedup};
  // The one-pass metadata scan for large T keeps one count per expert in shared memory; beyond
  // kMaxMetaSmem the older two-pass scan runs.
  const int64_t tables = symm_tables_smem_ints(&L), meta = symm_meta_smem_ints(&L);
  const int onepass = meta * 4 <= kMaxMetaSmem;
  // Mode (dispatch.cuh, "per-call mode"): SYMM_DISPATCH_PUSH=0 (default) always pull, 2 auto per call,
  // 1 always push; SYMM_PUSH_MIN_TOKENS the auto threshold (default from the layout). Read once per
  // process; both MUST be the same on every rank (the kernel kinds of one call must agree on the mode).
  static const int mode_env = symm_host::env_int("SYMM_DISPATCH_PUSH", 0);
  static const int min_tokens_env = symm_host::env_int("SYMM_PUSH_MIN_TOKENS", -1);
  int32_t min_tokens = 0;
  const int kind = symm_dispatch_kind(&L, num_tokens, mode_env, min_tokens_env, &min_tokens);
  a.push = kind;
  const int64_t push_tables = tables + symm::symm_push_smem_ints(&L);
  const int64_t need = kind != SYMM_KIND_PULL ? push_tables : tables;
  // Shared memory: phase A's metadata (the one-pass counts, or the small-T ids) and phase B's tables
  // use the same space one after the other.
  int64_t ints = onepass && meta > need ? meta : need;
  if (ints < symm::kMetaWarpMaxIds) ints = symm::kMetaWarpMaxIds;
  const size_t smem = (size_t)ints * 4;
  // SYMM_PULL_DYNAMIC=0: the old static row distribution of the pull (A/B, fallback). 1 (default):
  // warps take one work item at a time from a local counter (pool.cuh, for_each_pool_row, counter mode).
  // (2, two items per grab, was dropped with the single-copy row loop: it measured no better.)
  // (SYMM_SPREAD, the static distributions warp-major over the CTAs, measured slower: 35.46 vs
  // 34.96 us at 128 tokens; removed.) SYMM_PAD_LATE (default 1; 0 for A/B): the pull's padding on the
  // grid's last warps.
  // SYMM_BARRIER_FENCE=1 and SYMM_META_SPREAD=0: A/B knobs (DispatchKnob).
  // The measured defaults (the A/B environment knobs that selected the others are gone; the kernel
  // still takes the bits as an argument, to be folded into compile-time code with the push kinds).
  constexpr int knobs = kKnobDynamic | kKnobPadLate;
  // The plain pull kernel when this rank's own ids are few (small T: the sources then send plain ids).
  const bool small_dedup_sent = small_dedup && L.topk > 0 && 32 % L.topk == 0;  // metadata.cuh push_metadata_warp
  const bool plain =
      (int64_t)num_tokens * L.topk <= (small_dedup_sent ? symm::kPlainPullMaxIds : symm::kMetaWarpMaxIds);
  using K64P = decltype(&symm_dispatch_kernel<int64_t, SYMM_KIND_PULL>);
  K64P kernel = nullptr;
  if (idx_bytes == 8)
    kernel = kind == SYMM_KIND_PUSH   ? symm_dispatch_kernel<int64_t, SYMM_KIND_PUSH>
             : kind == SYMM_KIND_AUTO ? symm_dispatch_kernel<int64_t, SYMM_KIND_AUTO>
             : plain                  ? symm_dispatch_kernel<int64_t, SYMM_KIND_PULL, false>
                                      : symm_dispatch_kernel<int64_t, SYMM_KIND_PULL>;
  else
    kernel = kind == SYMM_KIND_PUSH   ? symm_dispatch_kernel<int32_t, SYMM_KIND_PUSH>
             : kind == SYMM_KIND_AUTO ? symm_dispatch_kernel<int32_t, SYMM_KIND_AUTO>
             : plain                  ? symm_dispatch_kernel<int32_t, SYMM_KIND_PULL, false>
                                      : symm_dispatch_kernel<int32_t, SYMM_KIND_PULL>;
  return symm_host::launch_coop(kernel, kThreads, smem, num_sms, stream, L, peers, a, host_err, (uint64_t)timeout_ns,
                                onepass, knobs, min_tokens);
}

extern "C" int symm_reset_state(const SymmLayout* layout, void* local_base, uint64_t dispatch_epoch,
                                uint64_t combine_epoch, cudaStream_t stream) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  if (!local_base) return SYMM_EINVAL;
  const int threads = 256;
  int64_t n = layout->num_blocks > 2 * layout->cmb_arr_half / 4 ? layout->num_blocks : 2 * layout->cmb_arr_half / 4;
  int blocks = (int)((n + threads - 1) / threads);
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  symm_reset_kernel<<<blocks, threads, 0, stream>>>(*layout, reinterpret_cast<uint64_t>(local_base), dispatch_epoch,
                                                     combine_epoch);
  return (int)cudaGetLastError();
}
