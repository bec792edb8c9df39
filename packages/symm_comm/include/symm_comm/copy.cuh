// symm_comm/copy.cuh — warp-wide row copies with 16-byte vectors, many vectors in flight per lane,
// and a grid-wide byte copy. Load policy of the row copy (template parameter):
//   Load::kCoherent     ld.relaxed.sys (data a peer wrote, or peer memory) — never ld.global.nc;
//   Load::kLocalNc      ld.global.nc (local data written by an EARLIER kernel).
#pragma once
#include <stdint.h>
#include "symm_comm/ptx.cuh"

#if defined(__CUDACC__)
namespace symm {

enum class Load { kCoherent, kLocalNc };

template <Load kLoad>
__device__ __forceinline__ int4 ld_v4(const int4* p) {
  if constexpr (kLoad == Load::kCoherent) return ptx::ld_v4_coherent(p);
  else return ptx::ld_v4_local(p);
}

// One warp copies n16 16-byte vectors, UNROLL loads in flight per lane before the stores.
template <int UNROLL, Load kLoad>
__device__ __forceinline__ void warp_copy_v4(int4* dst, const int4* src, int n16, int lane) {
  for (int base = 0; base < n16; base += 32 * UNROLL) {
    int4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      if (i < n16) v[u] = ld_v4<kLoad>(src + i);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * 32 + lane;
      if (i < n16) ptx::st_v4(dst + i, v[u]);
    }
  }
}

// A row's per-128 scales (S words) held in registers across the row copy, so their load rides with
// the row's and their store follows it: lane l holds words l and l + 32 (all of them for S <= 64,
// i.e. H <= 8192); store() copies any words beyond those straight from src (H > 8192).
template <bool kCoherent>
struct HeldScales {
  static constexpr int kRegs = 2;
  int32_t v[kRegs];
  __device__ __forceinline__ void load(const int32_t* src, int64_t S, int lane) {
#pragma unroll
    for (int u = 0; u < kRegs; ++u) {
      const int i = u * 32 + lane;
      if (i < S) v[u] = kCoherent ? ptx::ld_relaxed_sys_s32(src + i) : __ldg(src + i);
    }
  }
  __device__ __forceinline__ void store(int32_t* dst, const int32_t* src, int64_t S, int lane) const;
};

// One warp copies n 4-byte words (small rows: scales).
template <bool kCoherent>
__device__ __forceinline__ void warp_copy_b32(uint32_t* dst, const uint32_t* src, int n, int lane) {
  for (int i = lane; i < n; i += 32) {
    uint32_t v;
    if constexpr (kCoherent) v = (uint32_t)ptx::ld_relaxed_sys_s32(reinterpret_cast<const int32_t*>(src + i));
    else v = __ldg(src + i);
    dst[i] = v;
  }
}

template <bool kCoherent>
__device__ __forceinline__ void HeldScales<kCoherent>::store(int32_t* dst, const int32_t* src, int64_t S, int lane) const {
#pragma unroll
  for (int u = 0; u < kRegs; ++u) {
    const int i = u * 32 + lane;
    if (i < S) dst[i] = v[u];
  }
  constexpr int kHeld = 32 * kRegs;
  if (S > kHeld)
    warp_copy_b32<kCoherent>(reinterpret_cast<uint32_t*>(dst + kHeld), reinterpret_cast<const uint32_t*>(src + kHeld),
                             (int)(S - kHeld), lane);
}

// All threads of the grid copy nbytes (dst, src 16-byte aligned; nbytes a multiple of 4). Each
// thread keeps kGridCopyUnroll loads in flight: one per thread cannot cover the HBM latency, and the
// stagers are 15 of 16 warps while the one-pass metadata runs.
constexpr int kGridCopyUnroll = 6;  // 8 spills in the dispatch kernel (128 registers)
__device__ __forceinline__ void grid_copy_bytes(void* dst, const void* src, int64_t nbytes, int64_t gtid,
                                                int64_t gthreads) {
  const int64_t n16 = nbytes / 16;
  const int4* s = reinterpret_cast<const int4*>(src);
  int4* d = reinterpret_cast<int4*>(dst);
  for (int64_t i0 = gtid; i0 < n16; i0 += kGridCopyUnroll * gthreads) {
    int4 v[kGridCopyUnroll];
#pragma unroll
    for (int u = 0; u < kGridCopyUnroll; ++u) {
      const int64_t i = i0 + u * gthreads;
      if (i < n16) v[u] = ptx::ld_v4_local(s + i);
    }
#pragma unroll
    for (int u = 0; u < kGridCopyUnroll; ++u) {
      const int64_t i = i0 + u * gthreads;
      if (i < n16) ptx::st_v4(d + i, v[u]);
    }
  }
  const uint32_t* s4 = reinterpret_cast<const uint32_t*>(src);
  uint32_t* d4 = reinterpret_cast<uint32_t*>(dst);
#pragma unroll 1
  for (int64_t i = n16 * 4 + gtid; i < nbytes / 4; i += gthreads) d4[i] = __ldg(s4 + i);
}

}  // namespace symm
#endif
