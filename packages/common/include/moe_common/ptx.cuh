// moe_common/ptx.cuh — THE PTX wrapper layer of the repository (one wrapper per instruction): CTA,
// cluster, async-proxy and tensor-core bookkeeping (mbarrier, TMA / bulk copies, proxy
// fences, wgmma fences, setmaxnreg, stmatrix) and the memory-model operations across GPUs (acquire
// loads, release stores and reductions at gpu / sys scope, fences, %globaltimer, 16-byte vectors).
// fp4_gemm and symm_comm include it (their ptx.cuh alias `ptx` to moe::ptx); neither depends on the
// other. Stateless inline wrappers, scope and ordering in the name; no hidden synchronisation.
#pragma once
#include <stdint.h>
#include <cuda.h>  // CUtensorMap (type only: no libcuda link)

#if defined(__CUDACC__)
#define SYMM_HD __host__ __device__ __forceinline__
#define SYMM_DEV __device__ __forceinline__
#else
#define SYMM_HD inline
#define SYMM_DEV inline
#endif

#if defined(__CUDACC__)
namespace moe::ptx {


__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------- mbarrier
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count));
}
// Makes mbarrier.init visible to the async proxy (TMA complete_tx) and to the other threads.
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t ok;
  asm volatile(
      "{\n .reg .pred p;\n"
      " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}"
      : "=r"(ok) : "r"(smem_addr(bar)), "r"(parity) : "memory");
  return ok != 0;
}

// The SM this thread runs on (%smid; diagnostics only: a CTA's SM is fixed for its lifetime).
__device__ __forceinline__ uint32_t smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %smid;" : "=r"(v));
  return v;
}
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

// Waits for the phase with `parity` to complete. Returns false after `timeout_ns` (the caller
// reports the error and unwinds instead of hanging forever).
__device__ __forceinline__ bool mbar_wait(uint64_t* bar, uint32_t parity, uint64_t timeout_ns) {
  if (mbar_try_wait(bar, parity)) return true;
  const uint64_t start = globaltimer_ns();
  while (!mbar_try_wait(bar, parity))
    if (globaltimer_ns() - start > timeout_ns) return false;
  return true;
}

// ---------------------------------------------------------------- thread block clusters
// This CTA's rank in its cluster (0 .. cluster size - 1; the bit of a multicast mask).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The cluster's index in the grid along x, and the number of clusters along x.
__device__ __forceinline__ uint32_t cluster_id_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t num_clusters_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
// `mapa`: the shared::cluster address of the object at this CTA's shared address `p` in the CTA of
// rank `cta_rank` (same CTA-relative offset; the own rank gives this CTA's object).
__device__ __forceinline__ uint32_t mapa_shared_cluster(const void* p, uint32_t cta_rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(cta_rank));
  return r;
}
// Arrive (count 1) on an mbarrier given by a shared::cluster address (from mapa_shared_cluster),
// possibly in another CTA of the cluster. Release at CTA scope (the PTX default, as CUTLASS's
// ClusterBarrier::arrive(cta_id)): for releasing a stage to the peer's producer only a
// write-after-read order is needed (this thread's reads of its own shared memory, done before the
// arrive, vs. the peer's later TMA writes there); no data is published through the barrier.
// `.release.cluster` would compile to MEMBAR.ALL.CTA + MEMBAR.ALL.GPU + CGAERRBAR before every
// arrive (seen in the SASS), waiting on the math warps' in-flight global weight loads.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_bar_addr) {
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar_addr) : "memory");
}
// Cluster-wide execution barrier split in arrive / wait (every non-exited thread of every CTA of
// the cluster arrives before any wait returns). Not `.aligned`: threads of a warp may reach it on
// different paths (an error return). No time limit exists for it: callers reach it only after
// every time-limited wait of theirs has returned.
__device__ __forceinline__ void cluster_arrive_release() {
  asm volatile("barrier.cluster.arrive.release;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive_release();
  cluster_wait_acquire();
}

// ---------------------------------------------------------------- async copies
// 2D tiled TMA load (global -> shared), completion counted on `bar` in bytes.
__device__ __forceinline__ void tma_load_2d(const CUtensorMap* map, uint64_t* bar, void* dst, int32_t c0,
                                            int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
      ::"r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1) : "memory");
}
// 2D tiled TMA load multicast to every CTA of the cluster whose bit is set in `cta_mask` (bit =
// cluster rank): the box lands at the same CTA-relative shared offset `dst` in each of them, and each
// destination's mbarrier at the CTA-relative offset of `bar` receives complete_tx of the box bytes.
__device__ __forceinline__ void tma_load_2d_multicast(const CUtensorMap* map, uint64_t* bar, void* dst, int32_t c0,
                                                      int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5}], [%2], %3;"
      ::"r"(smem_addr(dst)), "l"(map), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1) : "memory");
}
// 1D bulk copy of `bytes` (multiple of 16, 16-byte aligned both sides), completion on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
      ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// Warms L2 with `bytes` (multiple of 16) of global memory; no completion to wait for.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
// 8-byte read-only load that does not allocate in L1 (streamed data read once per CTA). Only for
// data no thread or peer writes during the kernel (the non-coherent path).
__device__ __forceinline__ uint2 ldg_stream_v2(const void* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// Coherent 4-byte float load (strong, relaxed, gpu scope: never a stale L1 line) for a value another
// CTA may have written earlier in the same launch (a fused kernel's dispatch writes the pool's top-k
// weights the L1 epilogue reads). No "memory" clobber: the caller orders it after its acquire (an asm
// volatile with one), and the clobber cost registers (spills) in the L1 epilogue's 32 independent loads.
__device__ __forceinline__ float ld_relaxed_gpu_f32(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
// The same, 16 bytes (split-K partial sums another CTA stored in the same launch, acquired by the
// caller's barrier).
__device__ __forceinline__ float4 ld_relaxed_gpu_v4f32(const float* p) {
  float4 v;
  asm volatile("ld.relaxed.gpu.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void prefetch_tma_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}
// Generic-proxy writes to shared memory -> later reads by the async proxy (wgmma, TMA store).
// Generic-proxy global writes (other threads', acquired through a barrier) before this thread's
// async-proxy (TMA) reads of the same global memory.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// An mbarrier's shared memory is reused (a new pipeline over it): mbarrier.init over a live barrier is undefined.
__device__ __forceinline__ void mbar_inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// ---------------------------------------------------------------- wgmma bookkeeping
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across wgmma issue/wait points.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
// Opaque to the optimiser: the value stays in a register instead of being re-derived (from %tid,
// say) where it is used, e.g. inside a loop; no memory effect.
__device__ __forceinline__ void keep_in_register(uint32_t& r) { asm volatile("" : "+r"(r)); }
__device__ __forceinline__ void keep_in_register(int& r) { asm volatile("" : "+r"(r)); }
__device__ __forceinline__ void keep_in_register(uint32_t& a, uint32_t& b) { asm volatile("" : "+r"(a), "+r"(b)); }
// A compiler-only ordering point for memory accesses (no instruction).
__device__ __forceinline__ void compiler_barrier() { asm volatile("" ::: "memory"); }

// Shared-memory matrix descriptor for a K-major operand stored with the 128-byte swizzle that TMA
// writes (rows of 128 bytes, 8-row atoms of 1024 bytes). Advance along K by adding bytes >> 4.
__device__ __forceinline__ uint64_t smem_desc_k128_sw128(const void* p) {
  const uint64_t addr = smem_addr(p);
  uint64_t d = 0;
  d |= (addr & 0x3FFFF) >> 4;       // start address
  d |= uint64_t(1) << 16;           // leading byte offset (unused for swizzled K-major)
  d |= uint64_t(1024 >> 4) << 32;   // stride byte offset: next 8-row atom
  d |= uint64_t(1) << 62;           // 128-byte swizzle
  return d;
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs)); }
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs)); }

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Four 8x8 b16 matrices from the mma fragment layout (register i of a thread: row lane / 4, columns
// 2 (lane % 4), +1 of matrix i), stored TRANSPOSED: row k of matrix i goes to the 16 bytes at the
// address lane 8 i + k supplies.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ uint4 lds_128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
// Two floats -> BF16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// ================================================================ memory model across GPUs


// ---- timers (globaltimer_ns above)
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
// Shared-memory state (a flag, a deadline) read / written at exactly this point (asm volatile: the
// compiler neither re-issues the load inside a later loop nor keeps a generic pointer to it). Plain C++
// loads of such state inside a fused kernel's wait loops cost that kernel its uniform datapath (ptxas
// held the GEMM mainloops' stage and shared-memory addresses in vector registers; megamoe fused.cu).
SYMM_DEV uint64_t ld_shared_u64(const void* p) {
  uint64_t v;
  asm volatile("ld.shared.u64 %0, [%1];" : "=l"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}
SYMM_DEV int32_t ld_shared_s32(const void* p) {
  int32_t v;
  asm volatile("ld.shared.s32 %0, [%1];" : "=r"(v) : "r"(smem_addr(p)) : "memory");
  return v;
}
SYMM_DEV void st_shared_s32(void* p, int32_t v) {
  asm volatile("st.shared.s32 [%0], %1;" ::"r"(smem_addr(p)), "r"(v) : "memory");
}
// Relaxed poll of a flag (gpu scope: never a stale L1 line, and no L1 invalidation per load as an
// acquire has); the caller acquires once after the poll succeeds.
SYMM_DEV uint32_t ld_relaxed_gpu_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
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

// Named barrier among `threads` threads (a multiple of 32) of this CTA; id 0 = __syncthreads.
// bar.sync is barrier.sync.aligned: every participant executes the SAME barrier instruction.
SYMM_DEV void named_barrier(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// barrier.sync without .aligned, for a barrier its participants reach from DIFFERENT code locations
// (a fused kernel's role branches, each with its own register budget, meeting at one CTA barrier):
// .aligned requires one instruction for all of them (compute-sanitizer synccheck reports otherwise).
SYMM_DEV void barrier_sync_any(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// barrier.arrive (not .aligned): arrive at barrier `id` among `threads` threads without waiting (a
// producer / consumer handshake: the waiting side calls barrier_sync_any with the same count).
SYMM_DEV void barrier_arrive_any(uint32_t id, uint32_t threads) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// barrier.red.and.pred on barrier `id` among `threads` threads (a multiple of 32): every participant's
// earlier memory operations are ordered before every participant's later ones (as barrier.sync), and each
// gets the AND of all their predicates. kAligned (bar.red): converged warps that all reach it at one code
// location (a named Workers group, any_pc = false; the non-aligned form drew compute-sanitizer synccheck's
// divergent-barrier reports there); else barrier.red, for participants at different code locations (id 0
// with the whole CTA at one code location: __syncthreads_and).
#define MOE_PTX_RED_AND(op) \
  "{\n\t.reg .pred p, q;\n\tsetp.ne.u32 p, %1, 0;\n\t" op " q, %2, %3, p;\n\tselp.u32 %0, 1, 0, q;\n\t}"
template <bool kAligned>
SYMM_DEV bool barrier_red_and(uint32_t id, uint32_t threads, bool pred) {
  uint32_t out;
  if constexpr (kAligned)
    asm volatile(MOE_PTX_RED_AND("bar.red.and.pred") : "=r"(out) : "r"((uint32_t)pred), "r"(id), "r"(threads) : "memory");
  else
    asm volatile(MOE_PTX_RED_AND("barrier.red.and.pred") : "=r"(out) : "r"((uint32_t)pred), "r"(id), "r"(threads) : "memory");
  return out != 0;
}
#undef MOE_PTX_RED_AND

}  // namespace moe::ptx
#endif  // __CUDACC__
