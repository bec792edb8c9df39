// Standalone dispatch kernel: begin_call -> dispatch_run -> end_call (symm_comm/dispatch.cuh) over the
// whole CTA. One cooperative launch: stage + phase A push of metadata -> one-hop cross-rank barrier ->
// phase B pull -> last CTA out publishes the epoch.
// (The push and auto dispatch kinds and their environment switches were removed in layout v10: the
// dedup pull is faster at every measured size, docs/perf-notes-symm_comm.md.)
#include <cuda_runtime.h>
#include <stdint.h>
#include "launch.h"
#include "symm_api.h"
#include "symm_comm/symm_comm.cuh"

namespace {
constexpr int kThreads = 512;  // 1 CTA per SM, up to 128 registers
// Pull: vectors per lane per batch. Dedup kernels (T * K > kPlainPullMaxIds with small_dedup, the
// default): 7 = two batches (round trips) per row at H 7168; with the fan-out (one read, several pool
// rows) 14 spills 16-92 bytes in the 128-register kernel, and a one-row path with 14 or 16 beside it in
// the same kernel spilled more (v7, ptxas -v). Small-T kernels (plain pull, no fan-out code): 16, a
// whole row per batch.
constexpr int kPullUnroll = 7;
constexpr int kPullUnrollPlain = 16;
constexpr int64_t kMaxMetaSmem = 160 * 1024;  // one-pass metadata counts (E ints): up to 40960 experts

// kDedup: the pull with the dedup fan-out (pool.cuh / dispatch.cuh, layout v7), chosen by the host when
// this rank's T * K > kPlainPullMaxIds (small_dedup, K dividing 32: its sources then likely send
// fanned-out leaders; else > kMetaWarpMaxIds); false = the plain pull (decodes any entry, one pool row per
// read). Either kernel is correct whatever the sources sent; the choice only moves time.
template <typename IdxT, bool kDedup>
__global__ void __launch_bounds__(kThreads, 1)
    symm_dispatch_kernel(SymmLayout L, const uint64_t* peers_g, symm::DispatchArgs a, int32_t* host_err,
                         uint64_t timeout_ns, int onepass, int64_t smem_ints) {
  using namespace symm;
  extern __shared__ int32_t smem[];
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const Workers W = Workers::cta();
  const CallStart call = begin_call(W, L, peers_g, s_peers, SYMM_OP_DISPATCH, host_err, timeout_ns);
  dispatch_run<IdxT, kDedup ? kPullUnroll : kPullUnrollPlain, kDedup>(W, L, s_peers, call, a, smem, smem_ints,
                                                                      onepass != 0);
  // Every exit path: the last CTA out publishes the epoch (barrier.cuh).
  if (end_call(W, call.local, L, SYMM_OP_DISPATCH, call.epoch)) stamp(call.local, L, 5);
}

__global__ void symm_reset_kernel(SymmLayout L, uint64_t local, uint64_t e_d, uint64_t e_c) {
  using namespace symm;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    state_epoch(local, L)[SYMM_OP_DISPATCH] = e_d;
    state_epoch(local, L)[SYMM_OP_COMBINE] = e_c;
    for (int op = 0; op < SYMM_NUM_OPS; ++op) *state_grid_bar(local, L, op) = 0u;
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
  }
  uint32_t* ca = cmb_arr(local, L, 0);
  for (int64_t j = i; j < 2 * L.cmb_arr_half / 4; j += nthr) ca[j] = 0u;
  int32_t* h = cmb_hist(local, L);
  for (int64_t j = i; j < (int64_t)L.num_ranks * L.num_chunks; j += nthr) h[j] = 0;
}
}  // namespace

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
  symm::DispatchArgs a{x, scales, topk_idx, topk_w, num_tokens, masked ? 1 : 0, 0, small_dedup};
  // The one-pass metadata scan for large T keeps one count per expert in shared memory; beyond
  // kMaxMetaSmem the older two-pass scan runs.
  const int onepass = symm_meta_smem_ints(&L) * 4 <= kMaxMetaSmem;
  const int64_t ints = symm_dispatch_smem_ints(&L, onepass != 0);
  const size_t smem = (size_t)ints * 4;
  // The plain pull kernel when this rank's own ids are few (small T: the sources then send plain ids).
  const bool small_dedup_sent = small_dedup && L.topk > 0 && 32 % L.topk == 0;  // metadata.cuh push_metadata_warp
  const bool plain =
      (int64_t)num_tokens * L.topk <= (small_dedup_sent ? symm::kPlainPullMaxIds : symm::kMetaWarpMaxIds);
  auto kernel = idx_bytes == 8 ? (plain ? symm_dispatch_kernel<int64_t, false> : symm_dispatch_kernel<int64_t, true>)
                               : (plain ? symm_dispatch_kernel<int32_t, false> : symm_dispatch_kernel<int32_t, true>);
  return symm_host::launch_coop(kernel, kThreads, smem, num_sms, stream, L, peers, a, host_err, (uint64_t)timeout_ns,
                                onepass, ints);
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
