// megamoe/layout.cuh — THE layout of the fused kernel's workspace on one rank: the symmetric buffer's
// regions (symm_comm/layout.cuh: signals, dispatch pool, combine buffers), then the L1-output pool
// and the L1 -> L2 readiness words, which only this rank touches. One struct for host and device
// (plain C, mirrored by Python through the C ABI), one function deciding sizes and offsets.
//
// Regions after the symm buffer's (each aligned to SYMM_REGION_ALIGN):
//   l1_q      E4M3 [ring_rows][I]            the L1 epilogue's output = the L2 GEMM's input. A RING of
//                                            ring_blocks blocks of block_m rows: pool block b (block_m
//                                            rows of the dispatch pool) writes ring slot b % ring_blocks.
//                                            Bounded: it does not grow with ranks x max_tokens x topk.
//   l1_s      f32  [ring_rows][I / 128]      its scales, one per MOE_SCALE_GROUP channels (the L2 GEMM's
//                                            promotion granularity: a valid L2 input as it stands)
//   l1_ready  u32  [num_blocks]              per dispatch-pool block: L1 units done (one per 128-channel
//                                            group of I), counted like symm's arrivals: block b's L1 output
//                                            is complete when l1_ready[b] == epoch * l1_units (mod 2^32);
//                                            never reset (a call adds exactly l1_units to every block, the
//                                            padding and unused blocks included).
// Who writes what: L1 epilogues write l1_q / l1_s rows of their block's ring slot, then release-add
//   (red.release.gpu) 1 to l1_ready[b]; an L2 producer acquires (ld.acquire.gpu) l1_ready[b] before
//   its TMA loads of the ring slot (+ fence.proxy.async.global: generic-proxy writes read by TMA).
// Ring reuse: the scheduler (megamoe/scheduler.cuh) runs experts in waves whose pool blocks fit the
//   ring (moe_wave_blocks <= ring_blocks); slot reuse by the next wave waits for the L2 tasks of the
//   previous user of the slot (the wave order; the fused kernel's contract).
#pragma once
#include <stdint.h>
#include "moe_common/constants.cuh"
#include "symm_comm/layout.cuh"

#define MOE_LAYOUT_VERSION 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MoeLayout {
  SymmLayout symm;       // the symmetric buffer (its total_bytes: where this rank-local part starts)
  int64_t total_bytes;   // symm + the regions below
  int64_t off_l1_q;
  int64_t off_l1_s;
  int64_t off_l1_ready;
  int64_t ring_rows;     // ring_blocks * block_m
  int32_t intermediate;  // I
  int32_t l1_units;      // I / MOE_SCALE_GROUP: L1 units (n-block pairs) per pool block
  int32_t ring_blocks;
  int32_t version;
} MoeLayout;

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
#define MOE_LAYOUT_HD __host__ __device__ inline
#else
#define MOE_LAYOUT_HD inline
#endif

// Ring blocks for a wave plan: at least the pool blocks of the largest wave, at most the pool's.
MOE_LAYOUT_HD int64_t moe_ring_blocks(int64_t wave_blocks, int64_t pool_blocks) {
  return wave_blocks < 1 ? 1 : (wave_blocks > pool_blocks ? pool_blocks : wave_blocks);
}

// Fills *M after the symm layout S (symm_layout_compute). ring_blocks <= 0: the whole pool (no reuse).
// Returns 0, or -1 for an invalid configuration (M is then zeroed).
MOE_LAYOUT_HD int moe_layout_compute(MoeLayout* M, const SymmLayout* S, int intermediate, int64_t ring_blocks) {
  char* raw = (char*)M;
  for (unsigned i = 0; i < sizeof(MoeLayout); ++i) raw[i] = 0;
  if (!S || S->total_bytes <= 0 || intermediate <= 0 || intermediate % MOE_SCALE_GROUP || S->block_m < 1) return -1;
  const int64_t pool_blocks = S->num_blocks;
  const int64_t rb = ring_blocks <= 0 ? pool_blocks : moe_ring_blocks(ring_blocks, pool_blocks);
  const int64_t rows = rb * S->block_m, I = intermediate;
  M->symm = *S;
  M->intermediate = intermediate;
  M->l1_units = intermediate / MOE_SCALE_GROUP;
  M->ring_blocks = (int32_t)rb;
  M->ring_rows = rows;
  M->version = MOE_LAYOUT_VERSION;
  int64_t off = symm_align_up(S->total_bytes, SYMM_REGION_ALIGN);
#define MOE_REGION(field, bytes)              \
  M->field = off;                             \
  off = symm_align_up(off + (bytes), SYMM_REGION_ALIGN);
  MOE_REGION(off_l1_q, rows * I)
  MOE_REGION(off_l1_s, rows * (I / MOE_SCALE_GROUP) * 4)
  MOE_REGION(off_l1_ready, pool_blocks * 4)
#undef MOE_REGION
  M->total_bytes = off;
  return 0;
}

#ifdef __cplusplus
namespace moe {
// The fused kernel's grid words (rank-local u32, zero at creation and after a resync): 0-2 the grid
// barriers' (symm_comm's grid_barrier_gpu), 3-4 the dynamic tile order's counters (fused.cu). Python reads
// this line.
static constexpr int kGridWords = 6;
}  // namespace moe
#endif

#if defined(__CUDACC__) || defined(MOE_HOST_ACCESSORS)
namespace moe {
// Named accessors: the only way into the regions (base: this rank's buffer).
MOE_LAYOUT_HD int64_t ring_slot(const MoeLayout& M, int64_t pool_block) { return pool_block % M.ring_blocks; }
MOE_LAYOUT_HD uint8_t* l1_q_row(uint64_t base, const MoeLayout& M, int64_t pool_row) {
  const int64_t b = pool_row / M.symm.block_m, r = pool_row - b * M.symm.block_m;
  return (uint8_t*)(base + (uint64_t)M.off_l1_q) + (ring_slot(M, b) * M.symm.block_m + r) * M.intermediate;
}
MOE_LAYOUT_HD float* l1_s_row(uint64_t base, const MoeLayout& M, int64_t pool_row) {
  const int64_t b = pool_row / M.symm.block_m, r = pool_row - b * M.symm.block_m;
  return (float*)(base + (uint64_t)M.off_l1_s) + (ring_slot(M, b) * M.symm.block_m + r) * M.l1_units;
}
MOE_LAYOUT_HD uint32_t* l1_ready(uint64_t base, const MoeLayout& M) {
  return (uint32_t*)(base + (uint64_t)M.off_l1_ready);
}
}  // namespace moe
#endif
