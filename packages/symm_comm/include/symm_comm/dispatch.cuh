// symm_comm/dispatch.cuh — expert-granular EP dispatch, as device functions over a Workers range (all
// state from the caller). dispatch_run is the whole phase: the standalone kernel (csrc/dispatch.cu) is
// begin_call -> dispatch_run -> end_call over Workers::cta(); a fused kernel calls the same three over
// its own Workers and a pool consumer waits per block with wait_block. dispatch_run is:
//   stage_inputs + clear_combine_buckets (dispatch_stage.cuh; + push_metadata_* of metadata.cuh,
//   concurrently in warp 0 of the first groups for large T; group 0 also zeroes the idle parity's pull
//   counter) -> one-hop cross-rank barrier -> build_pool_tables -> publish_layout (group 0) ->
//   pad_blocks -> pull_rows (dispatch_pull.cuh).
// A fused kernel composing the parts itself must keep both side duties: the combine buckets pull_rows
// counts into are cleared in phase A, and its pull counter must be zero when the call starts.
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
#include "symm_comm/barrier.cuh"
#include "symm_comm/dispatch_pull.cuh"
#include "symm_comm/dispatch_stage.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/metadata.cuh"
#include "symm_comm/pool.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

// Shared-memory ints dispatch_run needs per group (host and device): phase A's metadata (the one-pass
// counts, or the small-T ids) and phase B's tables use the same space one after the other.
// onepass: the one-pass metadata scan for large T (one count per expert in shared memory); false: the
// two-pass scan (the caller's choice when E counts do not fit its budget).
SYMM_LAYOUT_HD int64_t symm_dispatch_smem_ints(const SymmLayout* L, bool onepass) {
  const int64_t tables = symm_tables_smem_ints(L), meta = symm_meta_smem_ints(L);
  const int64_t ints = onepass && meta > tables ? meta : tables;
  return ints < symm::kMetaWarpMaxIds ? symm::kMetaWarpMaxIds : ints;
}

#if defined(__CUDACC__)
namespace symm {

// The whole dispatch of one call, all threads of every group (W.nthreads() >= num_ranks). call: from
// begin_call(W, ..., SYMM_OP_DISPATCH, ...); peers: the group's copy of the peer table (begin_call's
// s_peers); smem: smem_ints ints of the group's shared memory (>= symm_dispatch_smem_ints(&L,
// onepass), else SYMM_ERR_SMEM is reported and nothing is done: the peers then time out), free for the
// whole call; after it returns the group's PoolTables (PoolTables::carve(smem, L)) hold this call's
// pool layout, which a fused kernel's scheduler may read (the group built it: no ordering needed;
// exp_offsets / exp_counts in global memory are written by group 0 with plain stores and are for LATER
// launches). Returns true in every thread iff the rows of this call are being pulled (the barrier
// passed and they fit); false: an error was reported. Every pool block's arrival counter still reaches
// epoch * block_m unless the call stopped before or at the cross-rank barrier (then it needs resync()).
// Ordering it provides to later phases of the same launch: each pool block's rows through its arrival
// counter only (wait_block); anything else this call wrote (row_src, pool_w, cmb_hist, cmb_order, the
// peers' cmb_map, kmask) needs a grid barrier of the groups (grid_barrier_gpu) before a reader in this
// launch, and for the peers the combine's start signal released after it (combine_pull.cuh).
// Template: kUnroll vectors per lane per row batch, kDedup the pull with the dedup fan-out (dispatch_pull.cuh).
template <typename IdxT, int kUnroll, bool kDedup>
__device__ __forceinline__ bool dispatch_run(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                             const CallStart& call, DispatchArgs a, int32_t* smem, int64_t smem_ints,
                                             bool onepass) {
  const uint64_t local = call.local, epoch = call.epoch, deadline = call.deadline;
  const ErrSink& err = call.err;
  const int64_t need = symm_dispatch_smem_ints(&L, onepass);
  if (smem_ints < need) {  // group-uniform; before any arrival, so no peer reads a half-done call
    if (W.group == 0 && W.tid() == 0) report_error(err, SYMM_ERR_SMEM, SYMM_PHASE_DISPATCH_SCAN, (int32_t)smem_ints, (int32_t)need);
    return false;
  }
  a.parity = (int)(epoch & 1);
  const PoolTables t = PoolTables::carve(smem, L);

  const bool st0 = W.group == 0 && W.tid() == 0;  // stamps 0..4: group 0's view; 5: last group out (caller)
  if (st0) stamp(local, L, 0);
  // Pull work counters (pool.cuh, for_each_pool_row, counter mode): this call uses [parity]; group 0
  // zeroes [parity ^ 1] for the next call. Race-free: no group of this call touches [parity ^ 1]; the
  // previous call (the last user of it) completed before this launch started, and the next call (its
  // next user) starts in a later launch (stream order: the epoch protocol already needs calls in stream
  // order; a dispatch runs at most once per launch), so the plain store is visible to it. [parity] was
  // zeroed by the previous call, or by symm_reset_state (creation / resync, both words).
  if (st0) *pull_counter(local, L, a.parity ^ 1) = 0u;
  // Phase A. Large T (the default): warp 0 of the first G groups pushes the metadata in one pass over
  // its group's token range (its shared memory: the tables' space, built only after the barrier) while
  // every other warp stages the inputs.
  const bool small = (int64_t)a.num_tokens * L.topk <= kMetaWarpMaxIds;
  const int G = (small || !onepass) ? 0 : (W.ngroups < SYMM_META_MAX_GROUPS ? W.ngroups : SYMM_META_MAX_GROUPS);
  bool meta_ok = true;
  if (W.warp == 0 && W.group < G) {
    meta_ok = push_metadata_onepass<IdxT>(W, L, peers, local, a, G, smem, deadline, err);
  } else {
    const Stagers sg = Stagers::of(W, G);
    clear_combine_buckets(sg, L, local);
    stage_inputs<IdxT>(sg, L, local, a, err);
  }
  // smem: free until the tables (after the barrier)
  if (small) push_metadata_warp<IdxT>(W, L, peers, a, smem, err);
  else if (!onepass) push_metadata<IdxT>(W, L, peers, a, t.scratch, err);

  // One-hop cross-rank barrier (barrier.cuh): after it, every rank's metadata for us and staging
  // (its own groups' included) is visible. No grid barrier: our own groups are counted like a peer's.
  W.sync();  // stamp 1 = group 0's whole phase A (metadata warp and stagers)
  if (st0) stamp(local, L, 1);
  bool pulled = false;
  if (rank_barrier_counted(W, peers, local, L, SYMM_OP_DISPATCH, epoch, deadline, err, SYMM_PHASE_DISPATCH_RANKS,
                           meta_ok)) {
    if (st0) stamp(local, L, 2);
    // Phase B
    build_pool_tables(W, L, t, meta_count(local, L, a.parity), a.masked != 0);
    if (!check_capacity(W, L, t, a.masked != 0, err)) {
      pad_blocks(W, L, local, t, /*aborted=*/true);  // keep arrivals == epoch * block_m
    } else {
      if (W.group == 0) publish_layout(W, L, local, t);
      // The padding (every block's) from the grid's LAST warp down; in a small call those warps hold no
      // pull item (the items sit on CTAs 0-63 at 128 tokens, and padding the used blocks cost the first
      // CTAs ~3 us before their pull, per-CTA stamps; measured 2026-11-30: 1 token 21.95 -> 19.62 us).
      // Any warp order is correct.
      pad_blocks(W, L, local, t, false, /*from_last=*/true);
      if (st0) stamp(local, L, 3);
      // Rows from a work counter (pool.cuh for_each_pool_row; the static stride measured slower).
      pull_rows<kUnroll, kDedup>(W, L, peers, local, t, a.parity, pull_counter(local, L, a.parity));
      pulled = true;
    }
  }
  if (st0) stamp(local, L, 4);
  return pulled;
}

// ---- a pool consumer's side of the arrivals ----------------------------------------------------------
// One thread (a GEMM producer before it loads pool block `block`'s rows) spins until the block's
// arrival counter reaches this call's value. Counting (dispatch_pull.cuh): every pulled row adds 1
// with red.release.gpu after its warp's row stores (x, scales, weight, row_src), pad_blocks adds the
// block's padding rows (block_m for an unused block or an aborted call), and symm_reset_state sets
// every counter to epoch * block_m: so the block of call `call.epoch` is complete iff
// arrivals[block] == epoch * block_m (mod 2^32; the counter is never reset and only grows, by exactly
// block_m per call). Acquire at gpu scope (every writer is a thread of this GPU: the pull's warps store
// locally what they read from the peers), by the waiting thread itself. Time limit: call.deadline;
// returns false after reporting (SYMM_ERR_TIMEOUT, phase POOL_WAIT, what = block, detail = the value
// seen). The caller must then issue fence.proxy.async.global before a TMA (async proxy) read of the
// rows, which were written through the generic proxy; its ordinary loads need nothing more.
__device__ __forceinline__ bool wait_block(const SymmLayout& L, const CallStart& call, int64_t block) {
  const uint32_t* ctr = at<uint32_t>(call.local, L.off_arrivals) + block;
  const uint32_t want = (uint32_t)(call.epoch * (uint64_t)L.block_m);
  uint32_t v;
  int spins = 0;
  // signed distance: the counter is at most block_m behind want during the call (wraps mod 2^32)
  while ((int32_t)((v = ptx::ld_acquire_gpu_u32(ctr)) - want) < 0) {
    if ((++spins & 15) == 0 && timed_out(call.deadline)) {
      report_error(call.err, SYMM_ERR_TIMEOUT, SYMM_PHASE_POOL_WAIT, (int32_t)block, (int32_t)v);
      return false;
    }
  }
  return true;
}

}  // namespace symm
#endif
