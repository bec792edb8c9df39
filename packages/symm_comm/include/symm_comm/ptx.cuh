// symm_comm/ptx.cuh — cross-GPU memory-model PTX wrappers (system / gpu scope atomics, acquire
// loads, release stores, fences, %globaltimer) and 16-byte vector loads/stores.
// symm_comm owns these concepts; other packages include this header instead of re-declaring them.
// Every function is a thin inline wrapper: no state, no hidden synchronisation.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define SYMM_HD __host__ __device__ __forceinline__
#define SYMM_DEV __device__ __forceinline__
#else
#define SYMM_HD inline
#define SYMM_DEV inline
#endif

#if defined(__CUDACC__)
namespace symm {
namespace ptx {

// ---- timers ---------------------------------------------------------------------------------
SYMM_DEV uint64_t globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
SYMM_DEV void nanosleep(uint32_t ns) { asm volatile("nanosleep.u32 %0;" ::"r"(ns)); }

// ---- fences ---------------------------------------------------------------------------------
SYMM_DEV void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
SYMM_DEV void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
SYMM_DEV void fence_sc_sys() { asm volatile("fence.sc.sys;" ::: "memory"); }

// ---- acquire loads / release stores (system scope: visible to / from peer GPUs) --------------
SYMM_DEV uint64_t ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV uint32_t ld_acquire_sys_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV uint32_t ld_acquire_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV int32_t ld_relaxed_sys_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV int32_t ld_relaxed_gpu_s32(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV uint64_t ld_relaxed_gpu_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
SYMM_DEV void st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SYMM_DEV void st_release_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMM_DEV void st_relaxed_sys_s32(int32_t* p, int32_t v) {
  asm volatile("st.relaxed.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMM_DEV void st_relaxed_gpu_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Monotone publish: the word only grows, whatever order two writers' updates land in (combine signals
// written by two CTAs of one call, combine.cuh).
SYMM_DEV void red_max_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// The same without the release (no MEMBAR.SYS): for a signal that publishes only earlier kernels' writes
// (the pull combine's start signal: csrc/combine.cu says why relaxed is enough there).
SYMM_DEV void red_max_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Volatile store to mapped host memory (error mirror); no atomics on host memory.
SYMM_DEV void st_volatile_s32(int32_t* p, int32_t v) {
  asm volatile("st.volatile.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- atomics --------------------------------------------------------------------------------
SYMM_DEV uint32_t atom_add_release_sys_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.release.sys.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
SYMM_DEV uint64_t atom_add_release_sys_u64(uint64_t* p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.add.release.sys.global.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
// Relaxed, gpu scope (work counters: no data is published through them). Note: ptxas turns an
// atomic on a warp-uniform address into a warp-aggregated one whose result shuffle waits for the
// atomic at once, so its latency cannot be hidden behind later loads (checked in the SASS).
SYMM_DEV uint32_t atom_add_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.relaxed.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
SYMM_DEV uint32_t atom_add_acq_rel_gpu_u32(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
SYMM_DEV void red_add_release_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMM_DEV void red_add_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// relaxed, system scope: for counter bumps that publish no data (pure padding blocks in push mode),
// morally strong with the peers' red.release.sys on the same word; no fence.
SYMM_DEV void red_add_relaxed_sys_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMM_DEV void red_add_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
SYMM_DEV void red_add_release_gpu_u32(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
SYMM_DEV int32_t atom_cas_relaxed_gpu_s32(int32_t* p, int32_t cmp, int32_t v) {
  int32_t old;
  asm volatile("atom.cas.relaxed.gpu.global.b32 %0, [%1], %2, %3;" : "=r"(old) : "l"(p), "r"(cmp), "r"(v) : "memory");
  return old;
}

// ---- 16-byte vector accesses ------------------------------------------------------------------
// Coherent load of data another GPU (or another kernel through a peer mapping) wrote: strong
// relaxed load at system scope, never the non-coherent (.nc) path, never an L1 hit on a stale line.
SYMM_DEV int4 ld_v4_coherent(const void* p) {
  int4 v;
  asm volatile("ld.relaxed.sys.global.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
// Load of local data written by an earlier kernel on this GPU (read-only for this kernel).
SYMM_DEV int4 ld_v4_local(const void* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Local data for a batch copy whose loads must all be issued before its stores (push dispatch: a
// row's loads in flight at once). A strong (relaxed, gpu scope) load: ptxas keeps these in order
// with the stores that follow; with the .nc form above it interleaved loads and stores (SASS checked:
// 2 loads, 2 stores, ..., one HBM latency per pair).
SYMM_DEV int4 ld_v4_local_ordered(const void* p) {
  int4 v;
  asm volatile("ld.relaxed.gpu.global.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
SYMM_DEV void st_v4(void* p, const int4& v) {
  asm volatile("st.global.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
// Store that should not linger in L2 (a peer's buffer / a result read once later).
SYMM_DEV void st_v4_na(void* p, const int4& v) {
  asm volatile("st.global.L1::no_allocate.v4.s32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}
SYMM_DEV float ld_f32_coherent(const float* p) {
  float v;
  asm volatile("ld.relaxed.sys.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// Named barrier over `nthreads` threads (a warp group inside a larger CTA); id 0 = __syncthreads.
SYMM_DEV void named_barrier(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

}  // namespace ptx
}  // namespace symm
#endif  // __CUDACC__
