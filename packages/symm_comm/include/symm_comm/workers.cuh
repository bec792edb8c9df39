// symm_comm/workers.cuh — who runs a device function. A standalone kernel passes "the CTA"; a fused
// kernel passes the warps it dedicates to communication (e.g. one warp group with its own named
// barrier). Every symm_comm __device__ function takes its state from the caller through this and
// explicit pointers: no globals, no blockIdx / threadIdx / gridDim / __syncthreads inside.
// Contract of a Workers range: every group has the same nwarps; all ngroups groups run the same phase
// on different data and are co-resident (cooperative launch, or one persistent CTA per SM); bar_id is a
// named barrier no other role of the CTA uses while the group runs a symm_comm phase (0: the group is
// the whole CTA, nwarps * 32 == blockDim.x, and sync() / sync_and() are __syncthreads(_and)).
// Functions that talk to every rank use thread r < num_ranks of a group: nthreads() >= num_ranks.
#pragma once
#include <stdint.h>
#include "symm_comm/ptx.cuh"

#if defined(__CUDACC__)
namespace symm {

struct Workers {
  int warp;     // warp index inside the group
  int nwarps;   // warps in the group
  int lane;     // lane in the warp
  int group;    // group index in the grid (groups do the same job on different data)
  int ngroups;  // groups in the grid
  int bar_id;   // named barrier of the group (0 with nwarps * 32 == blockDim.x: __syncthreads)
  bool any_pc;  // the threads may reach the group's barriers from different code locations (not .aligned)

  __device__ __forceinline__ int tid() const { return warp * 32 + lane; }
  __device__ __forceinline__ int nthreads() const { return nwarps * 32; }
  __device__ __forceinline__ int64_t gwarp() const { return (int64_t)group * nwarps + warp; }
  __device__ __forceinline__ int64_t total_warps() const { return (int64_t)ngroups * nwarps; }
  __device__ __forceinline__ int64_t gthread() const { return (int64_t)group * nthreads() + tid(); }
  __device__ __forceinline__ int64_t total_threads() const { return (int64_t)ngroups * nthreads(); }
  // bar_id 0 is the whole CTA (bar.sync 0 without a count, what __syncthreads emits). Inlined into a
  // caller with a constant Workers the branches fold away; a __noinline__ callee taking W by value (the
  // fused kernel's phases D / C) keeps them, a warp-uniform run-time branch.
  __device__ __forceinline__ void sync() const {
    if (any_pc) {
      __syncwarp();  // arrive as whole warps (a role's lanes may leave its loops apart; synccheck)
      ptx::barrier_sync_any(bar_id, nwarps * 32);
    } else if (bar_id == 0) __syncthreads();
    else {
      __syncwarp();  // an aligned barrier after lane-divergent code (rank r's thread alone): reconverge first
      ptx::named_barrier(bar_id, nwarps * 32);
    }
  }
  // Group barrier that returns the AND of pred over the group's threads (bar.red.and). A named group at
  // one code location: the aligned form after a __syncwarp (the group's warps arrive converged; the
  // non-aligned barrier.red drew compute-sanitizer synccheck's divergent-barrier reports there); any_pc:
  // the non-aligned form.
  __device__ __forceinline__ bool sync_and(bool pred) const {
    if (bar_id == 0 && !any_pc) return __syncthreads_and(pred) != 0;
    __syncwarp();
    return any_pc ? ptx::barrier_red_and<false>(bar_id, nwarps * 32, pred)
                  : ptx::barrier_red_and<true>(bar_id, nwarps * 32, pred);
  }
  __device__ __forceinline__ bool leader() const { return warp == 0 && lane == 0; }

  // The warps [first_warp, first_warp + nwarps) of every CTA as one group on named barrier bar_id (a fused
  // kernel's role); any_pc as the field says.
  static __device__ __forceinline__ Workers warps(int first_warp, int nwarps, int bar_id, bool any_pc) {
    Workers w;
    w.warp = int(threadIdx.x / 32) - first_warp;
    w.nwarps = nwarps;
    w.lane = threadIdx.x % 32;
    w.group = blockIdx.x;
    w.ngroups = gridDim.x;
    w.bar_id = bar_id;
    w.any_pc = any_pc;
    return w;
  }
  // The whole CTA as one group (standalone kernels).
  static __device__ __forceinline__ Workers cta() { return warps(0, int(blockDim.x / 32), 0, false); }
};

// Inclusive prefix sum of v over the lanes of a warp (all 32 lanes call it).
__device__ __forceinline__ int32_t warp_inclusive_scan(int32_t v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

}  // namespace symm
#endif
