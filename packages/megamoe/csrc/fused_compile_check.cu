// Compile-only assembly of the fused kernel's parts (built to PTX by CI, never launched): one
// persistent kernel (384 threads, one CTA per SM) that runs symm_comm's whole dispatch (dispatch_run)
// on all its threads, then warpgroup 0 waits per pool block (wait_block) and walks the megamoe
// scheduler while the next two warpgroups run fp4_gemm's register-path mainloop with the L1
// epilogue's configuration, then a gpu-scope grid barrier and symm_comm's pull combine with
// Order::kInKernel on all threads, then both ops' end_call.
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
// The kernel's one named-barrier list: 0 __syncthreads (also symm_comm's phases: their Workers are the
// whole CTA), 1 the L1 epilogue.
constexpr uint32_t kL1Barrier = 1;

struct Params {
  MoeLayout M;
  const uint64_t* peers;
  fp4_gemm::GroupedProblem pb;
  fp4_gemm::WeightOperand w;
  fp4_gemm::L1Args l1;
  moe::WavePlan plan;
  int* err;
  int32_t* host_err;       // symm_comm's error mirror
  uint32_t* grid_bar;      // the fused kernel's grid-barrier word between the GEMMs and the combine
  const void* x;           // dispatch inputs (symm::DispatchArgs)
  const float* scales;
  const int32_t* topk_idx;
  const float* topk_w;
  int num_tokens;
  uint16_t* y;             // BF16 [num_tokens, H]: the combine's output
  uint64_t timeout_ns;
};

__global__ void __launch_bounds__(kThreads, 1) fused_compose_check(const __grid_constant__ CUtensorMap tmap,
                                                                     const Params p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  fp4_gemm::SmemView<Cfg> sm{smem};
  __shared__ uint64_t s_peers[SYMM_MAX_RANKS];
  const int tid = threadIdx.x;
  const SymmLayout& L = p.M.symm;
  // symm_comm's phases run on every thread of the CTA (Workers::cta(): 12 warps, barrier 0). Both ops'
  // epochs come from earlier launches (barrier.cuh begin_call), so both calls start here.
  const symm::Workers W = symm::Workers::cta();
  const symm::CallStart dcall = symm::begin_call(W, L, p.peers, s_peers, SYMM_OP_DISPATCH, p.host_err, p.timeout_ns);
  const symm::CallStart ccall = symm::begin_call(W, L, p.peers, s_peers, SYMM_OP_COMBINE, p.host_err, p.timeout_ns);
  // The dispatch's scratch: the mainloop's stash (a real kernel aliases it with the ring's stages, in a
  // union that names the phases, and sizes it with symm_dispatch_smem_ints).
  const symm::DispatchArgs a{p.x, p.scales, p.topk_idx, p.topk_w, p.num_tokens, 0, 0, 1};
  symm::dispatch_run<int32_t, 7, true>(W, L, s_peers, dcall, a, reinterpret_cast<int32_t*>(sm.stash()),
                                       symm_dispatch_smem_ints(&L, true), true);
  fp4_gemm::init_pipeline(sm, tid, kThreads);
  __syncthreads();
  if (tid < 128) {
    const uint64_t local = dcall.local;
    if (tid == 0) {
      moe::MoeScheduler s(p.plan, symm::at<int32_t>(local, p.M.symm.off_exp_offsets),
                          symm::at<int32_t>(local, p.M.symm.off_exp_counts), p.M.symm.num_local_experts,
                          p.M.symm.block_m, blockIdx.x, gridDim.x);
      moe::Task task;
      while (s.next(task)) {
        // the block's rows (acquire); a TMA load of them would follow fence.proxy.async.global
        if (!symm::wait_block(L, dcall, task.pool_block)) break;
        moe::l1_ready(local, p.M)[task.pool_block] += 0;
      }
    }
  } else {
    const int wg = (tid - 128) / 128, tid_in_wg = tid % 128;
    fp4_gemm::GroupedScheduler<Cfg::kBlockN, fp4_gemm::WL::kBlockRows, Cfg::kClusterN, Cfg::kPairN> sched(p.pb);
    auto epilogue = [&](const fp4_gemm::Tile& t, const float (&acc)[Cfg::kAccRegs], uint32_t) {
      fp4_gemm::store_l1_pair<Cfg::kBlockN, Cfg::kStagedStore, Cfg::kStoreRowBytes>(
          acc, p.w.row_scale + int64_t(t.group) * p.pb.n, p.l1, p.pb.n, t.row0, t.rows, t.n_block, wg, tid_in_wg,
          sm.epilogue(), sm.l1_scales(), sm.stash(), sm.store_tile(0), kL1Barrier);
    };
    fp4_gemm::mma_stream_regs<Cfg>(sm, p.pb, p.w, sched, wg, tid_in_wg, p.err, epilogue);
  }
  // Every group's writes the peers' pull combine reads (cmb_in rows, the dispatch's cmb_map stores)
  // before group 0's released start signal (combine_pull.cuh, Order::kInKernel).
  if (symm::grid_barrier_gpu(W, p.grid_bar, ccall.deadline, ccall.err, SYMM_PHASE_GRID))
    symm::combine_pull_run_all<8, symm::Order::kInKernel>(W, L, s_peers, ccall, p.topk_w, p.y, p.num_tokens);
  symm::end_call(W, dcall.local, L, SYMM_OP_DISPATCH, dcall.epoch);
  symm::combine_end(W, ccall.local, L, ccall.epoch);
  (void)tmap;
}

}  // namespace megamoe_check
