// Standalone dispatch kernel: a thin composition of the device functions in symm_comm/dispatch.cuh.
// One cooperative launch: stage + phase A push -> grid barrier -> cross-rank barrier -> phase B pull.
#include <cuda_runtime.h>
#include <stdint.h>
#include "launch.h"
#include "symm_api.h"
#include "symm_comm/symm_comm.cuh"

namespace {
constexpr int kThreads = 512;  // 1 CTA per SM, up to 128 registers
constexpr int kPullUnroll = 16;  // a whole row (H <= 8192) per lane batch: one round trip per row

template <typename IdxT>
__global__ void __launch_bounds__(kThreads, 1)
    symm_dispatch_kernel(SymmLayout L, const uint64_t* peers_g, symm::DispatchArgs a, int32_t* host_err,
                         uint64_t timeout_ns) {
  using namespace symm;
  extern __shared__ int32_t smem[];
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  __shared__ int s_flag;
  const Workers W = Workers::cta();
  const uint64_t deadline = ptx::globaltimer() + timeout_ns;
  load_peers(s_peers, peers_g, L.num_ranks, threadIdx.x, blockDim.x);
  __syncthreads();
  const uint64_t local = s_peers[L.rank];
  const uint64_t epoch = ptx::ld_relaxed_gpu_u64(state_epoch(local, L) + SYMM_OP_DISPATCH) + 1;
  a.parity = (int)(epoch & 1);
  const ErrSink err{state_err(local, L), host_err, L.rank, (uint32_t)epoch};
  const PoolTables t = PoolTables::carve(smem, L);

  // Phase A
  stage_inputs<IdxT>(W, L, local, a, err);
  push_metadata<IdxT>(W, L, s_peers, a, t.scratch, err);

  // Grid barrier, then cross-rank barrier.
  ptx::fence_acq_rel_sys();
  __syncthreads();
  if (threadIdx.x == 0)
    s_flag = grid_barrier_leader(state_grid_bar(local, L, SYMM_OP_DISPATCH), blockIdx.x == 0, gridDim.x, deadline,
                                 err, SYMM_PHASE_DISPATCH_GRID);
  __syncthreads();
  if (!s_flag) return;
  if (blockIdx.x == 0) {
    if (threadIdx.x == 0) ptx::st_relaxed_gpu_u64(state_epoch(local, L) + SYMM_OP_DISPATCH, epoch);
    rank_signal(s_peers, L, SYMM_OP_DISPATCH, epoch, threadIdx.x);
  }
  const bool ok = rank_wait(local, L, SYMM_OP_DISPATCH, epoch, threadIdx.x, deadline, err, SYMM_PHASE_DISPATCH_RANKS);
  if (!__syncthreads_and(ok)) return;

  // Phase B
  build_pool_tables(W, L, t, meta_count(local, L, a.parity), nullptr, a.masked != 0);
  if (!check_capacity(W, L, t, a.masked != 0, err)) {
    pad_blocks(W, L, local, t, /*aborted=*/true);  // keep arrivals == epoch * block_m
    return;
  }
  if (blockIdx.x == 0) publish_layout(W, L, local, t);
  pad_blocks(W, L, local, t);
  pull_rows<kPullUnroll>(W, L, s_peers, local, t, a.parity);
}

__global__ void symm_reset_kernel(SymmLayout L, uint64_t local, uint64_t e_d, uint64_t e_c) {
  using namespace symm;
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i == 0) {
    state_epoch(local, L)[SYMM_OP_DISPATCH] = e_d;
    state_epoch(local, L)[SYMM_OP_COMBINE] = e_c;
    for (int op = 0; op < SYMM_NUM_OPS; ++op) *state_grid_bar(local, L, op) = 0u;
    for (int w = 0; w < SYMM_ERR_WORDS; ++w) state_err(local, L)[w] = 0;
  }
  uint32_t* arr = at<uint32_t>(local, L.off_arrivals);
  for (int64_t b = i; b < L.num_blocks; b += (int64_t)gridDim.x * blockDim.x)
    arr[b] = (uint32_t)(e_d * (uint64_t)L.block_m);
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
  symm::DispatchArgs a{x, scales, topk_idx, topk_w, num_tokens, masked ? 1 : 0, 0, 0};
  const size_t smem = (size_t)symm_tables_smem_ints(&L) * 4;
  if (idx_bytes == 8)
    return symm_host::launch_coop(symm_dispatch_kernel<int64_t>, kThreads, smem, num_sms, stream, L, peers, a,
                                  host_err, (uint64_t)timeout_ns);
  return symm_host::launch_coop(symm_dispatch_kernel<int32_t>, kThreads, smem, num_sms, stream, L, peers, a, host_err,
                                (uint64_t)timeout_ns);
}

extern "C" int symm_reset_state(const SymmLayout* layout, void* local_base, uint64_t dispatch_epoch,
                                uint64_t combine_epoch, cudaStream_t stream) {
  int rc = symm_host::check_layout(layout);
  if (rc) return rc;
  if (!local_base) return SYMM_EINVAL;
  const int threads = 256;
  int blocks = (int)((layout->num_blocks + threads - 1) / threads);
  if (blocks < 1) blocks = 1;
  if (blocks > 1024) blocks = 1024;
  symm_reset_kernel<<<blocks, threads, 0, stream>>>(*layout, reinterpret_cast<uint64_t>(local_base), dispatch_epoch,
                                                     combine_epoch);
  return (int)cudaGetLastError();
}
