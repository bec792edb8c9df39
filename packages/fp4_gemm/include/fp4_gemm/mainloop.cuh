// Warp-specialised FP8 x FP4 mainloop (swap-AB): weights (decoded FP4) are the wgmma A operand
// from registers, tokens the B operand from shared memory.
//
// Pipeline contract (one ring of kNumStages stages, each = token tile + weight chunk + token scales):
//  - full[s]  : 1 arrive.expect_tx by the producer's lane 0 (TMA + bulk bytes) and 32 cp.async
//               arrives (.noinc) of the producer lanes that copy the token scales  -> kFullArrivals.
//  - empty[s] : one arrive per math warp once that warp no longer reads stage s (after
//               wgmma.wait_group 0, so the tensor cores are done reading the token tile).
// Iteration i of the ring uses stage i % kNumStages with phase parity (i / kNumStages) & 1; the
// producer waits on empty with the opposite parity (a fresh barrier counts as released).
// The functions take all state (shared memory plan, barriers, iteration counter) from the caller,
// so a fused kernel can run them inside its own warp roles.
#pragma once
#include <cstdint>
#include <cuda.h>

#include "fp4_gemm/decode.cuh"
#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/ptx.cuh"
#include "fp4_gemm/scheduler.cuh"
#include "fp4_gemm/wgmma.cuh"

namespace fp4_gemm {

constexpr int kMathThreads = WL::kMathThreads;
constexpr uint64_t kPipelineTimeoutNs = 20ull * 1000 * 1000 * 1000;  // 20 s: a stuck pipeline, not a slow one

// Error codes a kernel leaves in its error word (first error wins).
enum KernelError : int { kErrNone = 0, kErrTimeoutFull = 1, kErrTimeoutEmpty = 2, kErrSmemAlign = 3 };

__device__ __forceinline__ void report_error(int* err, int code) {
  if (err != nullptr) atomicCAS(err, 0, code);
}

template <int kBlockN_, int kNumStages_>
struct MainloopConfig {
  static constexpr int kBlockN = kBlockN_;      // tokens per tile (wgmma N)
  static constexpr int kNumStages = kNumStages_;
  static constexpr int kBlockK = WL::kBlockK;
  static constexpr int kTokenTileBytes = kBlockN * kBlockK;  // FP8, 128-byte swizzled rows
  static constexpr int kWeightBytes = WL::kBlockChunkBytes;
  static constexpr int kScaleBytes = kBlockN * 4;
  static constexpr int kFullArrivals = 1 + 32;
  static constexpr int kEmptyArrivals = kMathThreads / 32;
  static constexpr int kAccRegs = kBlockN / 2;

  // Shared memory plan (offsets from a 1024-byte aligned base).
  static constexpr int kTokenOff = 0;
  static constexpr int kWeightOff = kTokenOff + kNumStages * kTokenTileBytes;
  static constexpr int kScaleOff = kWeightOff + kNumStages * kWeightBytes;
  static constexpr int kEpilogueOff = kScaleOff + kNumStages * kScaleBytes;  // L1 epilogue maxima
  static constexpr int kEpilogueBytes = 2 * kBlockN * 8 * 4;
  static constexpr int kLutOff = kEpilogueOff + kEpilogueBytes;
  static constexpr int kBarOff = (kLutOff + kNumShifts * 8 + 7) / 8 * 8;
  static constexpr int kSmemBytes = kBarOff + 2 * kNumStages * 8;

  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 256, "wgmma N is 8..256 in steps of 8");
  static_assert(kTokenTileBytes % 1024 == 0, "swizzle-128B atoms are 1024 bytes: tiles stay aligned");
  static_assert(kWeightBytes % 16 == 0 && kWeightOff % 16 == 0, "bulk copy alignment");
  static_assert(kSmemBytes <= 232448, "exceeds the 227 KB of shared memory a CTA may use");
  static_assert(kBlockK == 128, "one activation scale per stage");
};

template <class Cfg>
struct SmemView {
  uint8_t* base;
  __device__ uint8_t* tokens(int s) const { return base + Cfg::kTokenOff + s * Cfg::kTokenTileBytes; }
  __device__ uint8_t* weights(int s) const { return base + Cfg::kWeightOff + s * Cfg::kWeightBytes; }
  __device__ float* scales(int s) const { return reinterpret_cast<float*>(base + Cfg::kScaleOff + s * Cfg::kScaleBytes); }
  __device__ float* epilogue() const { return reinterpret_cast<float*>(base + Cfg::kEpilogueOff); }
  __device__ uint2* lut() const { return reinterpret_cast<uint2*>(base + Cfg::kLutOff); }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + s; }
  __device__ uint64_t* empty(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + Cfg::kNumStages + s; }
};

// Token scales live in shared memory permuted so that a math thread's kBlockN / 4 scales are
// contiguous (vector loads): token 8j + 2q + c (q = lane % 4) sits at q * kBlockN / 4 + 2j + c.
template <int kBlockN>
__device__ __forceinline__ int scale_slot(int token) {
  return ((token % 8) / 2) * (kBlockN / 4) + 2 * (token / 8) + token % 2;
}

template <class Cfg>
__device__ __forceinline__ void init_pipeline(const SmemView<Cfg>& sm, int tid, int nthreads) {
  if (tid == 0) {
    for (int s = 0; s < Cfg::kNumStages; ++s) {
      ptx::mbar_init(sm.full(s), Cfg::kFullArrivals);
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    ptx::fence_mbar_init();
  }
  fill_shift_lut(sm.lut(), tid, nthreads);
}

struct WeightOperand {
  const uint8_t* packed;     // [G][N / kBlockRows][K / kBlockK][kBlockChunkBytes]
  const float* row_scale;    // [G][N]
};

struct TokenOperand {
  const float* scales;       // [rows][K / 128] FP32
  int64_t scale_stride;      // elements between rows of `scales`
};

// Producer (one warp): streams the K blocks of one tile into the ring. Returns false on timeout.
template <class Cfg>
__device__ __forceinline__ bool produce_tile(const SmemView<Cfg>& sm, const CUtensorMap* tmap,
                                             const WeightOperand& w, const TokenOperand& x,
                                             const GroupedProblem& pb, const Tile& t, uint32_t& iter,
                                             int lane, int* err) {
  const int k_blocks = pb.k / Cfg::kBlockK;
  const uint8_t* wsrc = w.packed + (int64_t(t.group) * (pb.n / WL::kBlockRows) + t.n_block) *
                                       int64_t(k_blocks) * Cfg::kWeightBytes;
  for (int kb = 0; kb < k_blocks; ++kb, ++iter) {
    const int s = iter % Cfg::kNumStages;
    const uint32_t phase = (iter / Cfg::kNumStages) & 1;
    if (!ptx::mbar_wait(sm.empty(s), phase ^ 1, kPipelineTimeoutNs)) {
      report_error(err, kErrTimeoutEmpty);
      return false;
    }
    if (lane == 0) {
      ptx::mbar_arrive_expect_tx(sm.full(s), Cfg::kTokenTileBytes + Cfg::kWeightBytes);
      ptx::tma_load_2d(tmap, sm.full(s), sm.tokens(s), kb * Cfg::kBlockK, int32_t(t.row0));
      ptx::bulk_load(sm.weights(s), wsrc + int64_t(kb) * Cfg::kWeightBytes, Cfg::kWeightBytes, sm.full(s));
    }
    // Token scales: rows past the tile's valid rows are left as they are (their outputs are never
    // stored, and each output column depends only on its own token).
    float* dst = sm.scales(s);
    for (int i = lane; i < t.rows; i += 32)
      ptx::cp_async_4(dst + scale_slot<Cfg::kBlockN>(i), x.scales + (t.row0 + i) * x.scale_stride + kb);
    ptx::cp_async_arrive_noinc(sm.full(s));
  }
  return true;
}

// Decodes the A fragments of this warpgroup's half of stage s (4 k32 steps) into a.
// Per-thread byte offsets into a warpgroup's weight sub-chunk, computed once per kernel.
struct DecodeOffsets {
  uint32_t code;   // (tid_in_wg) * 8: this thread's 8 code bytes of k32 step 0
  uint32_t shift;  // kCodeBytes + (warp * 8 + lane / 4) * 8: its 8 shift bytes
  __device__ DecodeOffsets(int wg, int tid_in_wg) {
    code = wg * WL::kWgChunkBytes + tid_in_wg * WL::kCodeBytesPerThreadStep;
    shift = wg * WL::kWgChunkBytes + WL::kCodeBytes + ((tid_in_wg / 32) * 8 + (tid_in_wg % 32) / 4) * 8;
    // Opaque: keeps them in registers instead of re-deriving them from %tid inside the loop.
    asm volatile("" : "+r"(code), "+r"(shift));
  }
};

template <class Cfg>
__device__ __forceinline__ void decode_stage(const SmemView<Cfg>& sm, int s, const DecodeOffsets& off,
                                             uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  constexpr int kSteps = WL::kStepsPerBlockK;
  const uint8_t* chunk = sm.weights(s);
  // All shared-memory loads first (codes do not depend on the shifts): one load latency, not two.
  uint2 codes[kSteps];
#pragma unroll
  for (int st = 0; st < kSteps; ++st)
    codes[st] = *reinterpret_cast<const uint2*>(chunk + off.code + st * 128 * WL::kCodeBytesPerThreadStep);
  const uint2 shifts = *reinterpret_cast<const uint2*>(chunk + off.shift);
  // sh[2 * step + h]: shift of row r + 8h in k32 step `step`.
  int sh[2 * kSteps];
  int smin = WL::kMaxShift;
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) {
    sh[i] = int(int8_t((i < 4 ? shifts.x : shifts.y) >> (8 * (i % 4))));
    smin = min(smin, sh[i]);
  }
  uint2 lut[2 * kSteps];
  if (__any_sync(0xffffffffu, smin < kMinFastShift)) {
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) lut[i] = sm.lut()[sh[i] - WL::kMinShift];
  } else {
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) lut[i] = fast_shift_lut(sh[i]);
  }
#pragma unroll
  for (int st = 0; st < kSteps; ++st) decode_step(codes[st], lut[2 * st], lut[2 * st + 1], a[st]);
}

// One math warpgroup: accumulates its 64 weight rows x kBlockN tokens of tile t into acc
// (promoted FP32: per 128-K block, fresh wgmma partial sums times the tokens' scales).
// Software-pipelined: the next stage is decoded while this stage's wgmmas run. Returns false on
// timeout.
template <class Cfg>
__device__ __forceinline__ bool mma_tile(const SmemView<Cfg>& sm, const GroupedProblem& pb, int wg,
                                         int tid_in_wg, uint32_t& iter, float (&acc)[Cfg::kAccRegs],
                                         int* err) {
  using Mma = WgmmaRS<Cfg::kBlockN>;
  constexpr int kSteps = WL::kStepsPerBlockK;
  const int lane = tid_in_wg % 32;
  const int k_blocks = pb.k / Cfg::kBlockK;
  float part[Cfg::kAccRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;

  const DecodeOffsets off(wg, tid_in_wg);
  uint32_t scale_off = (lane % 4) * (Cfg::kBlockN / 4) * 4;
  asm volatile("" : "+r"(scale_off));
  uint32_t a0[kSteps][4], a1[kSteps][4];
  if (!ptx::mbar_wait(sm.full(iter % Cfg::kNumStages), (iter / Cfg::kNumStages) & 1, kPipelineTimeoutNs)) {
    report_error(err, kErrTimeoutFull);
    return false;
  }
  decode_stage(sm, iter % Cfg::kNumStages, off, a0);

  // One K block: wgmmas on `a` (already decoded), then, under them, the next stage into `a_next`.
  auto kblock = [&](int kb, uint32_t (&a)[kSteps][4], uint32_t (&a_next)[kSteps][4]) -> bool {
    const int s = iter % Cfg::kNumStages;
    const uint64_t desc = ptx::smem_desc_k128_sw128(sm.tokens(s));
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) ptx::fence_operand(part[i]);
    ptx::wgmma_fence();
#pragma unroll
    for (int st = 0; st < kSteps; ++st) Mma::mma(part, a[st], desc + uint64_t((st * 32) >> 4), st > 0);
    ptx::wgmma_commit();

    // While the tensor cores run: this stage's token scales, then the next stage's A fragments.
    float scale[Cfg::kBlockN / 4];  // scale[2j + c] for token 8j + 2(lane%4) + c
    const float* sc = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(sm.scales(s)) + scale_off);
    if constexpr (Cfg::kBlockN >= 16) {
#pragma unroll
      for (int v = 0; v < Cfg::kBlockN / 16; ++v) {
        const float4 f = reinterpret_cast<const float4*>(sc)[v];
        scale[4 * v] = f.x, scale[4 * v + 1] = f.y, scale[4 * v + 2] = f.z, scale[4 * v + 3] = f.w;
      }
    } else {
      const float2 f = *reinterpret_cast<const float2*>(sc);
      scale[0] = f.x, scale[1] = f.y;
    }
    if (kb + 1 < k_blocks) {
      const int sn = (iter + 1) % Cfg::kNumStages;
      if (!ptx::mbar_wait(sm.full(sn), ((iter + 1) / Cfg::kNumStages) & 1, kPipelineTimeoutNs)) {
        report_error(err, kErrTimeoutFull);
        ptx::wgmma_wait<0>();
        return false;
      }
      decode_stage(sm, sn, off, a_next);
    }
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) ptx::fence_operand(part[i]);
    // The wgmmas read a[] until the wait: keep it live so a_next gets other registers.
#pragma unroll
    for (int st = 0; st < kSteps; ++st)
#pragma unroll
      for (int r = 0; r < 4; ++r) ptx::fence_operand(a[st][r]);
    __syncwarp();
    if (lane == 0) ptx::mbar_arrive(sm.empty(s));
#pragma unroll
    for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
      acc[4 * j + 0] = fmaf(part[4 * j + 0], scale[2 * j], acc[4 * j + 0]);
      acc[4 * j + 1] = fmaf(part[4 * j + 1], scale[2 * j + 1], acc[4 * j + 1]);
      acc[4 * j + 2] = fmaf(part[4 * j + 2], scale[2 * j], acc[4 * j + 2]);
      acc[4 * j + 3] = fmaf(part[4 * j + 3], scale[2 * j + 1], acc[4 * j + 3]);
    }
    ++iter;
    return true;
  };
  // Unrolled by two so the two fragment buffers swap roles without register moves.
  for (int kb = 0; kb < k_blocks; kb += 2) {
    if (!kblock(kb, a0, a1)) return false;
    if (kb + 1 < k_blocks && !kblock(kb + 1, a1, a0)) return false;
  }
  return true;
}

}  // namespace fp4_gemm
