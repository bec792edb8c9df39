// Compile-only assembly of the fused kernel's parts (built to PTX by CI, never launched): one
// persistent kernel in which warpgroup 0 runs symm_comm's dispatch pull worker over its own Workers
// range (its own named barrier), the next two warpgroups run fp4_gemm's register-path mainloop with
// the L1 epilogue's configuration, and the megamoe scheduler / workspace layout hand out the tasks.
// It proves the headers compose in one translation unit (one PTX layer, one constants header, no
// symbol clashes, parts that take their threads from the caller); the real fused kernel (issue: the
// fused MegaMoE kernel) adds the ordering between them (arrivals, L1 readiness) and the epilogues.
#include <cuda.h>
#include <cuda_runtime.h>

#include "fp4_gemm/epilogue.cuh"
#include "fp4_gemm/mainloop.cuh"
#include "megamoe/layout.cuh"
#include "megamoe/scheduler.cuh"
#include "symm_comm/symm_comm.cuh"

namespace megamoe_check {

using Cfg = fp4_gemm::MainloopConfig<128, 8, fp4_gemm::WeightPath::kRegs, 1, false, true>;
constexpr int kThreads = 128 + fp4_gemm::kMathThreads;
// The kernel's one named-barrier list: 0 __syncthreads, 1 the L1 epilogue, 6 the dispatch warpgroup.
constexpr uint32_t kL1Barrier = 1;
constexpr int kDispatchBarrier = 6;

struct Params {
  MoeLayout M;
  const uint64_t* peers;
  fp4_gemm::GroupedProblem pb;
  fp4_gemm::WeightOperand w;
  fp4_gemm::L1Args l1;
  moe::WavePlan plan;
  moe::ErrSink err;
  uint64_t timeout_ns;
};

__global__ void __launch_bounds__(kThreads, 1) fused_compose_check(const __grid_constant__ CUtensorMap tmap,
                                                                     const Params p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  fp4_gemm::SmemView<Cfg> sm{smem};
  const int tid = threadIdx.x;
  fp4_gemm::init_pipeline(sm, tid, kThreads);
  __syncthreads();
  if (tid < 128) {
    // dispatch worker: warps 0-3 of every CTA, the grid's CTAs as its groups
    const symm::Workers W{tid / 32, 4, tid % 32, (int)blockIdx.x, (int)gridDim.x, kDispatchBarrier};
    const uint64_t local = p.peers[p.M.symm.rank];
    const symm::PoolTables t = symm::PoolTables::carve(reinterpret_cast<int32_t*>(sm.stash()), p.M.symm);
    symm::pull_rows<7, true>(W, p.M.symm, p.peers, local, t, 0, nullptr);
    if (tid == 0) {
      moe::MoeScheduler s(p.plan, symm::at<int32_t>(local, p.M.symm.off_exp_offsets),
                          symm::at<int32_t>(local, p.M.symm.off_exp_counts), p.M.symm.num_local_experts,
                          p.M.symm.block_m, blockIdx.x, gridDim.x);
      moe::Task task;
      while (s.next(task)) moe::l1_ready(local, p.M)[task.pool_block] += 0;
    }
  } else {
    const int wg = (tid - 128) / 128, tid_in_wg = tid % 128;
    fp4_gemm::GroupedScheduler<Cfg::kBlockN, fp4_gemm::WL::kBlockRows, Cfg::kClusterN, Cfg::kPairN> sched(p.pb);
    auto epilogue = [&](const fp4_gemm::Tile& t, const float (&acc)[Cfg::kAccRegs], uint32_t) {
      fp4_gemm::store_l1_pair<Cfg::kBlockN, Cfg::kStagedStore, Cfg::kStoreRowBytes>(
          acc, p.w.row_scale + int64_t(t.group) * p.pb.n, p.l1, p.pb.n, t.row0, t.rows, t.n_block, wg, tid_in_wg,
          sm.epilogue(), sm.l1_scales(), sm.stash(), sm.store_tile(0), kL1Barrier);
    };
    fp4_gemm::mma_stream_regs<Cfg>(sm, p.pb, p.w, sched, wg, tid_in_wg, p.err, p.timeout_ns, epilogue);
  }
  (void)tmap;
}

}  // namespace megamoe_check
