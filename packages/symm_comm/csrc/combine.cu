// Standalone combine kernels: begin_call -> combine_push_run_all / combine_pull_run_all -> combine_end
// (symm_comm/combine.cuh, combine_pull.cuh) over the whole CTA.
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
  const CallStart call = begin_call(W, L, peers_g, s_peers, SYMM_OP_COMBINE, host_err, timeout_ns);
  // Order::kKernelBoundary: the dispatch and expert_out's producer are earlier kernels on this stream.
  combine_push_run_all<kPushUnroll, kReduceK, Order::kKernelBoundary>(W, L, s_peers, call, smem, expert_out, out_rows,
                                                                      topk_w, y, num_tokens, lag_mult, (uint32_t)spin_ns);
  combine_end(W, call.local, L, call.epoch);  // every exit path
}
// Pull combine (layout v8, combine_pull.cuh): start signal -> wait for every rank's -> read and reduce.
// One cooperative launch (every CTA waits for the signals: all must be resident). Order::kKernelBoundary:
// cmb_in's producer and the dispatch are earlier kernels on this stream, so the start signal is relaxed
// (combine_pull.cuh: the release's MEMBAR.SYS cost 1.2 us on the handshake path).
__global__ void __launch_bounds__(kThreads, 1)
    symm_combine_pull_kernel(SymmLayout L, const uint64_t* peers_g, const float* topk_w, uint16_t* y, int num_tokens,
                             int32_t* host_err, uint64_t timeout_ns) {
  using namespace symm;
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const Workers W = Workers::cta();
  const CallStart call = begin_call(W, L, peers_g, s_peers, SYMM_OP_COMBINE, host_err, timeout_ns);
  combine_pull_run_all<kReduceK, Order::kKernelBoundary>(W, L, s_peers, call, topk_w, y, num_tokens);
  combine_end(W, call.local, L, call.epoch);
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
  return symm_host::launch_coop(symm_combine_pull_kernel, kThreads, 0, num_sms, stream, L, peers, topk_w,
                                static_cast<uint16_t*>(y), num_tokens, host_err, (uint64_t)timeout_ns);
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
