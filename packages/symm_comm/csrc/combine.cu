// Standalone combine kernel: a thin composition of symm_comm/combine.cuh.
// One cooperative launch: peer stores -> grid barrier -> cross-rank barrier -> reduction over k.
#include <cuda_runtime.h>
#include <stdint.h>
#include "launch.h"
#include "symm_api.h"
#include "symm_comm/symm_comm.cuh"

namespace {
constexpr int kThreads = 512;  // 1 CTA per SM, up to 128 registers
constexpr int kPushUnroll = 16;  // a whole BF16 row (H <= 4096) or half of one (H <= 8192) per batch
constexpr int kReduceK = 8;

__global__ void __launch_bounds__(kThreads, 1)
    symm_combine_kernel(SymmLayout L, const uint64_t* peers_g, const uint16_t* expert_out, int64_t out_rows,
                        const float* topk_w, uint16_t* y, int num_tokens, int32_t* host_err, uint64_t timeout_ns) {
  using namespace symm;
  extern __shared__ int32_t smem[];
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  __shared__ int s_flag;
  const Workers W = Workers::cta();
  const uint64_t deadline = ptx::globaltimer() + timeout_ns;
  load_peers(s_peers, peers_g, L.num_ranks, threadIdx.x, blockDim.x);
  __syncthreads();
  const uint64_t local = s_peers[L.rank];
  const uint64_t epoch = ptx::ld_relaxed_gpu_u64(state_epoch(local, L) + SYMM_OP_COMBINE) + 1;
  const int parity = (int)(epoch & 1);
  const ErrSink err{state_err(local, L), host_err, L.rank, (uint32_t)epoch};
  const PoolTables t = PoolTables::carve(smem, L);

  build_pool_tables(W, L, t, at<int32_t>(local, L.off_src_counts), at<int32_t>(local, L.off_exp_offsets), false);
  const int32_t used = t.le_start[L.num_local_experts];
  if ((int64_t)used > out_rows) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      report_error(err, SYMM_ERR_OUT_ROWS, SYMM_PHASE_COMBINE_PUSH, used, (int32_t)out_rows);
  } else {
    push_rows<kPushUnroll, false>(W, L, s_peers, local, t, parity, expert_out);
  }

  ptx::fence_acq_rel_sys();
  __syncthreads();
  if (threadIdx.x == 0)
    s_flag = grid_barrier_leader(state_grid_bar(local, L, SYMM_OP_COMBINE), blockIdx.x == 0, gridDim.x, deadline, err,
                                 SYMM_PHASE_COMBINE_GRID);
  __syncthreads();
  if (!s_flag) return;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) ptx::st_relaxed_gpu_u64(state_epoch(local, L) + SYMM_OP_COMBINE, epoch);
    rank_signal(s_peers, L, SYMM_OP_COMBINE, epoch, threadIdx.x);
  }
  const bool ok = rank_wait(local, L, SYMM_OP_COMBINE, epoch, threadIdx.x, deadline, err, SYMM_PHASE_COMBINE_RANKS);
  if (!__syncthreads_and(ok)) return;

  reduce_tokens<kReduceK>(W, L, local, parity, num_tokens, topk_w, y);
}
}  // namespace

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
  const size_t smem = (size_t)symm_tables_smem_ints(&L) * 4;
  return symm_host::launch_coop(symm_combine_kernel, kThreads, smem, num_sms, stream, L, peers,
                                static_cast<const uint16_t*>(expert_out), out_rows, topk_w, static_cast<uint16_t*>(y),
                                num_tokens, host_err, (uint64_t)timeout_ns);
}
