// Standalone combine kernel: a thin composition of symm_comm/combine.cuh.
// One cooperative launch, no grid barrier and no cross-rank barrier on the data path:
//   start handshake -> schedule -> pushes interleaved with per-token-counted reductions -> the last CTA
//   out publishes the epoch.
// The A/B environment knobs (SYMM_COMBINE_START_RELAXED, SYMM_COMBINE_LAG, SYMM_SPIN_NS) were removed
// 2026-12-01: their defaults are compiled in below; comments that name them describe the alternative.
#include <cuda_runtime.h>
#include <stdint.h>
#include "launch.h"
#include "symm_api.h"
#include "symm_comm/symm_comm.cuh"

namespace {
constexpr int kThreads = 512;  // 1 CTA per SM, up to 128 registers
constexpr int kPushUnroll = 13;  // H 7168: 28 vectors per lane = 13 + 13 + 2 (14 spills with the run-time schedule knobs)
constexpr int kReduceK = 8;

__global__ void __launch_bounds__(kThreads, 1)
    symm_combine_kernel(SymmLayout L, const uint64_t* peers_g, const uint16_t* expert_out, int64_t out_rows,
                        const float* topk_w, uint16_t* y, int num_tokens, int32_t* host_err, uint64_t timeout_ns,
                        int lag_mult, int spin_ns) {
  using namespace symm;
  extern __shared__ int32_t smem[];
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const Workers W = Workers::cta();
  const CallStart call = begin_call(L, peers_g, s_peers, SYMM_OP_COMBINE, host_err, timeout_ns);
  const uint64_t local = call.local, epoch = call.epoch, deadline = call.deadline;
  const ErrSink& err = call.err;
  const int parity = (int)(epoch & 1);
  const bool st0 = blockIdx.x == 0 && threadIdx.x == 0;  // stamps 6..8: CTA 0's view; 9: last CTA out
  if (st0) stamp(local, L, 6);

  // Start handshake (replaces the barrier between push and reduce).
  //  - CTA 0: combine_zero_next_and_signal (zeroes cmb_arr[parity ^ 1], then signals[combine][rank] := epoch in
  //    every peer: "this rank finished call epoch - 1").
  //  - WAR guard: peer r reads its half `parity` (rows and counters) in call epoch - 2, so we store
  //    into it only after acquiring r's signal >= epoch - 1; bar.sync orders every thread's stores
  //    after that acquire.
  if (blockIdx.x == 0) combine_zero_next_and_signal(s_peers, L, local, parity, combine_signal(epoch, false, true));
  // The schedule reads only local data of the last dispatch (an earlier launch) and stores nothing
  // into a peer, so it is built BEFORE the wait below: the peers' start signals travel meanwhile.
  CombineSchedule sched = CombineSchedule::carve(smem, L);
  build_combine_schedule(W, L, local, num_tokens, lag_mult, sched);
  const int32_t used = __ldg(at<int32_t>(local, L.off_exp_offsets) + L.num_local_experts);  // from dispatch
  const bool with_data = (int64_t)used <= out_rows;
  if (!with_data && blockIdx.x == 0 && threadIdx.x == 0)
    report_error(err, SYMM_ERR_OUT_ROWS, SYMM_PHASE_COMBINE_PUSH, used, (int32_t)out_rows);

  // (either mode: a pull call c - 1 read no combine half; its last CTA signals "zeroed" once it zeroed)
  const bool started = rank_wait(local, L, SYMM_OP_COMBINE, combine_signal(epoch - 1, false, true), threadIdx.x,
                                 deadline, err, SYMM_PHASE_COMBINE_RANKS,
                                 /*detail = epochs*/ kCombineSignalEpochShift);
  // WAR guard (above): every thread's peer stores in combine_run come after this bar.sync, which
  // follows thread r's ld.acquire.sys of rank r's signal.
  const bool go = __syncthreads_and(started);
  if (st0) stamp(local, L, 7);
  if (go)
    combine_run<kPushUnroll, kReduceK>(W, L, s_peers, local, parity, sched, expert_out, with_data, topk_w, y,
                                       (uint32_t)spin_ns, deadline, err);
  if (st0) stamp(local, L, 8);
  combine_end(local, L, epoch);  // every exit path
}
// Pull combine (layout v8, combine.cuh "pull combine"): start signal -> wait for every rank's -> read and
// reduce. One cooperative launch (every CTA waits for the signals: all must be resident).
__global__ void __launch_bounds__(kThreads, 1)
    symm_combine_pull_kernel(SymmLayout L, const uint64_t* peers_g, const float* topk_w, uint16_t* y, int num_tokens,
                             int32_t* host_err, uint64_t timeout_ns, int start_relaxed) {
  using namespace symm;
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const Workers W = Workers::cta();
  const CallStart call = begin_call(L, peers_g, s_peers, SYMM_OP_COMBINE, host_err, timeout_ns);
  const uint64_t local = call.local, epoch = call.epoch, deadline = call.deadline;
  const ErrSink& err = call.err;
  const int parity = (int)(epoch & 1);
  const bool st0 = blockIdx.x == 0 && threadIdx.x == 0;
  if (st0) stamp(local, L, 6);
  // CTA 0 signals "started epoch, pulling" to every rank (itself included) at once: red.release.sys.max,
  // cumulative over every earlier kernel on this stream (cmb_in's producer, the dispatch's cmb_map
  // stores into peers). The zeroing of cmb_arr[parity ^ 1] that a push call epoch + 1 needs is done by
  // the LAST CTA, before its items, with a second signal ("zeroed"; layout.cuh combine_signal): off the
  // start (measured ~1 us when CTA 0 zeroed before its signal) and off the end (CTA 0 zeroing after its
  // items: +0.45 us at 1 token, 2 x H200); in small calls the last CTA holds no item. Both signals go to
  // the same slot, so both are red.max: the slot ends at "zeroed" whichever lands last.
  // start_relaxed (default; SYMM_COMBINE_START_RELAXED=0 restores the release for A/B): red.relaxed.sys.max.
  // This kernel has written nothing the readers need before the signal, and the earlier kernels' writes
  // (cmb_in's producer, the dispatch's cmb_map peer stores) are complete at the kernel boundary (a grid
  // ends after its stores are acknowledged; peers read this GPU's memory through its L2). Not justified by
  // the PTX model, which has no kernel boundary; a fused kernel, or a launch with programmatic dependent
  // launch (which may start before the previous kernel ends), must release instead. Why: the release's
  // MEMBAR.SYS in CTA 0 sits on the handshake's path: -1.2 us at 1 and at 128 tokens (2 x H200, perf notes).
  if (blockIdx.x == 0)
    rank_signal_max(s_peers, L, SYMM_OP_COMBINE, combine_signal(epoch, true, false), threadIdx.x, start_relaxed != 0);
  if (blockIdx.x == gridDim.x - 1)
    combine_zero_next_and_signal<true>(s_peers, L, local, parity, combine_signal(epoch, true, true));
  const bool started = pull_wait_started(local, L, epoch, threadIdx.x, deadline, err);
  // bar.sync after thread r's acquire of rank r's signal: every thread's loads below are ordered after it.
  const bool go = __syncthreads_and(started);
  if (st0) stamp(local, L, 7);
  if (go) combine_pull_run<kReduceK>(W, L, s_peers, local, num_tokens, topk_w, y, err);
  if (st0) stamp(local, L, 8);
  combine_end(local, L, epoch);
}
}  // namespace

extern "C" int symm_combine_pull(const SymmLayout* layout, const uint64_t* peers, const float* topk_w, void* y,
                                 int num_tokens, int num_sms, int64_t timeout_ns, int32_t* host_err,
                                 cudaStream_t stream) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  const SymmLayout& L = *layout;
  if (!peers || L.cmb_in_rows <= 0 || num_tokens < 0 || num_tokens > L.max_tokens || timeout_ns <= 0)
    return SYMM_EINVAL;
  if (num_tokens > 0 && !y) return SYMM_EINVAL;
  if (!symm_host::aligned16(y) || !symm_host::aligned16(topk_w) || !symm_host::aligned16(peers)) return SYMM_EALIGN;
  constexpr int start_relaxed = 1;  // the relaxed start signal (kernel boundary publishes: see the kernel)
  return symm_host::launch_coop(symm_combine_pull_kernel, kThreads, 0, num_sms, stream, L, peers, topk_w,
                                static_cast<uint16_t*>(y), num_tokens, host_err, (uint64_t)timeout_ns, start_relaxed);
}

extern "C" int symm_combine(const SymmLayout* layout, const uint64_t* peers, const void* expert_out, int64_t out_rows,
                            const float* topk_w, void* y, int num_tokens, int num_sms, int64_t timeout_ns,
                            int32_t* host_err, cudaStream_t stream) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  const SymmLayout& L = *layout;
  if (!peers || num_tokens < 0 || num_tokens > L.max_tokens || out_rows < 0 || timeout_ns <= 0) return SYMM_EINVAL;
  if (num_tokens > 0 && !y) return SYMM_EINVAL;
  if (out_rows > 0 && !expert_out) return SYMM_EINVAL;
  if (!symm_host::aligned16(expert_out) || !symm_host::aligned16(y) || !symm_host::aligned16(topk_w) ||
      !symm_host::aligned16(peers))
    return SYMM_EALIGN;
  const size_t smem = (size_t)symm_combine_smem_ints(&L) * 4;
  // Schedule knobs (no effect on results or on the protocol): reductions listed lag_mult x (warps in
  // the grid) list items after their chunk's pushes (< 0: after all pushes); counter-wait sleep (ns).
  // Defaults measured on 2x H200 at 4096 tokens (docs/perf-notes-symm_comm.md section 3): lag 2 / 64 ns
  // 805 us, lag 2 / 1000 ns 799 us, lag 8 / 1000 ns 732 us, all pushes first 834 us.
  constexpr int lag_mult = 8;
  constexpr int spin_ns = 1000;
  return symm_host::launch_coop(symm_combine_kernel, kThreads, smem, num_sms, stream, L, peers,
                                static_cast<const uint16_t*>(expert_out), out_rows, topk_w, static_cast<uint16_t*>(y),
                                num_tokens, host_err, (uint64_t)timeout_ns, lag_mult, spin_ns);
}
