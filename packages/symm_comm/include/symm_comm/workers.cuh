// symm_comm/workers.cuh — who runs a device function. A standalone kernel passes "the CTA"; a fused
// kernel passes the warps it dedicates to communication (e.g. one warp group with its own named
// barrier). Every symm_comm __device__ function takes its state from the caller through this and
// explicit pointers: no globals, no blockIdx/threadIdx inside.
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

  __device__ __forceinline__ int tid() const { return warp * 32 + lane; }
  __device__ __forceinline__ int nthreads() const { return nwarps * 32; }
  __device__ __forceinline__ int64_t gwarp() const { return (int64_t)group * nwarps + warp; }
  __device__ __forceinline__ int64_t total_warps() const { return (int64_t)ngroups * nwarps; }
  __device__ __forceinline__ int64_t gthread() const { return (int64_t)group * nthreads() + tid(); }
  __device__ __forceinline__ int64_t total_threads() const { return (int64_t)ngroups * nthreads(); }
  __device__ __forceinline__ void sync() const { ptx::named_barrier(bar_id, nwarps * 32); }

  // The whole CTA as one group (standalone kernels).
  static __device__ __forceinline__ Workers cta() {
    Workers w;
    w.warp = threadIdx.x / 32;
    w.nwarps = blockDim.x / 32;
    w.lane = threadIdx.x % 32;
    w.group = blockIdx.x;
    w.ngroups = gridDim.x;
    w.bar_id = 0;
    return w;
  }
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
