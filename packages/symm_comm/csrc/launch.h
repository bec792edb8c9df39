// Shared launcher helpers (host side).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <mutex>
#include "symm_api.h"
#include "symm_comm/layout.cuh"
#include "symm_comm/pool.cuh"

namespace symm_host {

// A failed runtime call is reported through the return code; clear it so the caller's next
// cudaGetLastError() (after a later, successful launch) does not report it again.
inline int clear_and_return(cudaError_t e) {
  cudaGetLastError();
  return (int)e;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline int check_layout(const SymmLayout* L) {
  if (!L || L->version != SYMM_LAYOUT_VERSION || L->num_ranks < 1 || L->num_ranks > 64 || L->total_bytes <= 0)
    return SYMM_ELAYOUT;
  return SYMM_OK;
}

// Cooperative launches: the kernels' CTAs wait on each other, and the driver guarantees they are all
// resident (a regular launch of the same grid measured no shorter launch gap; docs/perf-notes-symm_comm.md).
inline bool coop_launch() { return true; }

// SMs and co-resident CTAs per SM of `kernel` (threads, smem) on device `dev`; returns 0 or an error
// (cudaError_t > 0, SYMM_E* < 0). The device queries, the smem attribute and the occupancy query run
// once per (kernel, threads, smem, device), not on every call: they cost host time on the hot path.
template <typename Kernel>
int coop_shape(Kernel kernel, int threads, size_t smem, int dev, int* sms_out, int* per_sm_out) {
  struct Entry {
    const void* fn;
    size_t smem;
    int dev, threads, sms, per_sm;
  };
  static Entry cache[32];
  static int used = 0;
  static std::mutex mu;
  const void* fn = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < used; ++i) {
    const Entry& c = cache[i];
    if (c.fn == fn && c.smem == smem && c.dev == dev && c.threads == threads) {
      *sms_out = c.sms, *per_sm_out = c.per_sm;
      return SYMM_OK;
    }
  }
  int sms = 0, coop = 0, per_sm = 0;
  cudaError_t e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return clear_and_return(e);
  if ((e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev)) != cudaSuccess) return clear_and_return(e);
  if (!coop) return SYMM_ECOOP;
  if (smem > 48 * 1024 &&
      (e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) != cudaSuccess)
    return clear_and_return(e);
  if ((e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem)) != cudaSuccess)
    return clear_and_return(e);
  if (per_sm < 1) return SYMM_ECOOP;
  if (used < (int)(sizeof(cache) / sizeof(cache[0]))) cache[used++] = Entry{fn, smem, dev, threads, sms, per_sm};
  *sms_out = sms, *per_sm_out = per_sm;
  return SYMM_OK;
}

// Cooperative launch of `kernel` over min(num_sms, co-resident capacity) CTAs of `threads`.
template <typename Kernel, typename... Args>
int launch_coop(Kernel kernel, int threads, size_t smem, int num_sms, cudaStream_t stream, Args... args) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return clear_and_return(e);
  int sms = 0, per_sm = 0;
  if (const int rc = coop_shape(kernel, threads, smem, dev, &sms, &per_sm)) return rc;
  int grid = (num_sms > 0 && num_sms < sms) ? num_sms : sms;
  if (grid > sms * per_sm) grid = sms * per_sm;
  void* argv[] = {reinterpret_cast<void*>(&args)...};
  e = coop_launch() ? cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(threads),
                                                  argv, smem, stream)
                    : cudaLaunchKernel(reinterpret_cast<const void*>(kernel), dim3(grid), dim3(threads), argv, smem,
                                       stream);
  if (e != cudaSuccess) return clear_and_return(e);
  return (int)cudaGetLastError();
}

}  // namespace symm_host
