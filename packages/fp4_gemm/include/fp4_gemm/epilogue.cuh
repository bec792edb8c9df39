// Epilogues of the swap-AB GEMM. Accumulator element acc[4j + 2h + c] of a math thread holds
// (weight row 16*warp + lane/4 + 8h of its warpgroup, token column 8j + 2*(lane%4) + c).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "fp4_gemm/fp8.cuh"
#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/ptx.cuh"

namespace fp4_gemm {

// BF16 output out[row0 + token][n] (row-major, `ld` elements per row): acc * row_scale[n].
template <int kBlockN>
__device__ __forceinline__ void store_bf16(const float (&acc)[kBlockN / 2], const float* row_scale,
                                           __nv_bfloat16* out, int64_t ld, int64_t row0, int rows,
                                           int n0, int tid_in_wg) {
  const int warp = tid_in_wg / 32, lane = tid_in_wg % 32;
  const int r = n0 + 16 * warp + lane / 4;
  const float rs[2] = {__ldg(row_scale + r), __ldg(row_scale + r + 8)};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = 8 * j + 2 * (lane % 4) + c;
      if (tok < rows) {
        __nv_bfloat16* o = out + (row0 + tok) * ld + r;
        o[0] = __float2bfloat16_rn(acc[4 * j + c] * rs[0]);
        o[8] = __float2bfloat16_rn(acc[4 * j + 2 + c] * rs[1]);
      }
    }
}

// The same output through shared memory (many tokens per tile): the accumulators go to a
// [kBlockN tokens][64 channels] BF16 tile of this warpgroup with stmatrix.trans (one instruction
// per 4 x 8 x 8 values), then every thread copies 16-byte row pieces out, so each warp writes whole
// 128-byte rows. The direct version above costs ~20 instructions per 2-byte store pair (~700 per
// thread per 128-token tile) while both math warpgroups, and so the tensor cores, wait for it.
// Barriers: `bar_id` (this warpgroup's 128 threads) before the stmatrix (the previous tile's
// copy-out reads are done) and before the copy-out (all stmatrix writes are visible).
// kRowBytes: the staging tile's row pitch (MainloopConfig::kStoreRowBytes, the smem plan's owner).
template <int kBlockN, int kRowBytes>
__device__ __forceinline__ void store_bf16_staged(const float (&acc)[kBlockN / 2], const float* row_scale,
                                                  __nv_bfloat16* out, int64_t ld, int64_t row0, int rows, int n0,
                                                  int tid_in_wg, uint8_t* stage, uint32_t bar_id) {
  // n0: this warpgroup's first output channel; out rows 16-byte aligned (ld % 8 == 0, checked by the launcher).
  static_assert(kBlockN % 16 == 0, "pairs of 8-token blocks per stmatrix.x4");
  constexpr int kChunksPerRow = WL::kRowsPerWarpgroup * 2 / 16;  // 16-byte pieces of a token's 64 channels
  const int warp = tid_in_wg / 32, lane = tid_in_wg % 32;
  const int r = n0 + 16 * warp + lane / 4;
  const float rs0 = __ldg(row_scale + r), rs1 = __ldg(row_scale + r + 8);
  const uint32_t tile = ptx::smem_addr(stage);
  // Lane 8i + k addresses row k of matrix i: matrix i = (8-token block j + i / 2, channels
  // 16 warp + 8 (i % 2) .. +7), its row k = token 8 (j + i / 2) + k.
  const uint32_t addr = tile + uint32_t(((lane / 16) * 8 + lane % 8) * kRowBytes) +
                        uint32_t((16 * warp + 8 * ((lane / 8) % 2)) * 2);
  ptx::named_barrier(bar_id, 128);
#pragma unroll
  for (int j = 0; j < kBlockN / 8; j += 2) {
    ptx::stmatrix_x4_trans(addr + uint32_t(j * 8 * kRowBytes),
                           ptx::pack_bf16x2(acc[4 * j + 0] * rs0, acc[4 * j + 1] * rs0),
                           ptx::pack_bf16x2(acc[4 * j + 2] * rs1, acc[4 * j + 3] * rs1),
                           ptx::pack_bf16x2(acc[4 * j + 4] * rs0, acc[4 * j + 5] * rs0),
                           ptx::pack_bf16x2(acc[4 * j + 6] * rs1, acc[4 * j + 7] * rs1));
  }
  ptx::named_barrier(bar_id, 128);
#pragma unroll
  for (int i = tid_in_wg; i < kBlockN * kChunksPerRow; i += 128) {
    const int tok = i / kChunksPerRow, c = i % kChunksPerRow;
    if (tok < rows) {
      const uint4 v = ptx::lds_128(tile + uint32_t(tok * kRowBytes + c * 16));
      *reinterpret_cast<uint4*>(out + (row0 + tok) * ld + n0 + c * 8) = v;
    }
  }
}

// ---------------------------------------------------------------------------- L1 (SwiGLU) epilogue
// Weights were transformed with gate/up interleave by 8 (rows 16s..16s+7 gate, 16s+8..16s+15 up of
// channels 8s..8s+7), so a thread holds the gate (acc[4j + c]) and up (acc[4j + 2 + c]) rows of
// one intermediate channel for each of its tokens. Per token and channel, exactly the recipe of
// DESIGN section 1 (the Python reference `megamoe.reference` does the same operations):
//   g, u = BF16(acc * row_scale); g = min(g, clamp); u = clamp(u, -clamp, clamp)
//   a = (g / (1 + exp(-g))) * u * topk_w     (FP32; exp correctly rounded via FP64)
// then one FP32 scale per token per kL1ScaleGroup channels (= the 64 channels of a CTA tile:
// per-128 would need two CTA tiles) and E4M3 codes. The two math warpgroups exchange per-token
// partial maxima through shared memory (double-buffered by tile parity, one named barrier).
constexpr int kL1ScaleGroup = WL::kBlockRows / 2;
constexpr uint32_t kL1AmaxBarrier = 1;  // named barrier id (0 is __syncthreads)

// Shared memory for the partial maxima (MainloopConfig::kEpilogueBytes): [2 tile parities]
// [kBlockN tokens][8 math warps] FP32.
static_assert(WL::kMathThreads / 32 == 8, "8 math warps share a token's max");

struct L1Args {
  const float* topk_w;  // [rows] top-k weight of each token row
  uint8_t* out_q;       // [rows][n / 2] E4M3
  float* out_s;         // [rows][n / 2 / kL1ScaleGroup]
  float clamp;          // activation clamp (inf: none)
  bool pow2;            // power-of-two scales
};

__device__ __forceinline__ float silu_exact(float g) {
  // (float)exp(double) is the correctly rounded FP32 exp (bar ties beyond FP64 precision), so the
  // result is reproducible by the reference bit for bit.
  const float e = float(exp(-double(g)));
  return g / (1.0f + e);
}

template <int kBlockN>
__device__ __forceinline__ void store_l1_fp8(const float (&acc)[kBlockN / 2], const float* row_scale,
                                             const L1Args& l1, int n, int64_t row0, int rows, int n_block,
                                             int wg, int tid_in_wg, float* amax_smem, uint32_t parity) {
  constexpr int kTok = kBlockN / 4;  // tokens per thread: 8j + 2(lane%4) + c
  const int warp = tid_in_wg / 32, lane = tid_in_wg % 32, q = lane % 4;
  const int r = n_block * WL::kBlockRows + wg * WL::kRowsPerWarpgroup + 16 * warp + lane / 4;
  const float rs_g = __ldg(row_scale + r), rs_u = __ldg(row_scale + r + 8);
  const int ch = n_block * kL1ScaleGroup + wg * 32 + 8 * warp + lane / 4;
  const int ld = n / 2;
  float a[kTok];
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = 8 * j + 2 * q + c;
      float g = __bfloat162float(__float2bfloat16_rn(acc[4 * j + c] * rs_g));
      float u = __bfloat162float(__float2bfloat16_rn(acc[4 * j + 2 + c] * rs_u));
      g = fminf(g, l1.clamp);
      u = fminf(fmaxf(u, -l1.clamp), l1.clamp);
      const float w = tok < rows ? __ldg(l1.topk_w + row0 + tok) : 0.f;
      a[2 * j + c] = silu_exact(g) * u * w;
    }
  // Per-token max over this warp's 8 channels (lanes sharing lane % 4), then across the 8 warps.
  float* buf = amax_smem + parity * (kBlockN * 8);
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    float m = fabsf(a[i]);
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
    if (lane < 4) buf[(8 * (i / 2) + 2 * q + i % 2) * 8 + wg * 4 + warp] = m;
  }
  ptx::named_barrier(kL1AmaxBarrier, WL::kMathThreads);
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    const int tok = 8 * (i / 2) + 2 * q + i % 2;
    const float4 lo = reinterpret_cast<const float4*>(buf + tok * 8)[0];
    const float4 hi = reinterpret_cast<const float4*>(buf + tok * 8)[1];
    const float amax = fmaxf(fmaxf(fmaxf(lo.x, lo.y), fmaxf(lo.z, lo.w)), fmaxf(fmaxf(hi.x, hi.y), fmaxf(hi.z, hi.w)));
    const float s = fp8_scale_from_amax(amax, l1.pow2);
    if (tok < rows) {
      const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(a[i] / s, __NV_SATFINITE, __NV_E4M3);
      l1.out_q[(row0 + tok) * ld + ch] = code;
      if (wg == 0 && warp == 0 && lane < 4) l1.out_s[(row0 + tok) * (ld / kL1ScaleGroup) + n_block] = s;
    }
  }
}

}  // namespace fp4_gemm
