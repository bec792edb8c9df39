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
  // Not unrolled: inside the mainloop's epilogue call the loop's prefetched fragments are live, and the
  // unrolled copy-out (all its 16-byte loads hoisted) spilled the 128-token loop in the fused kernel.
#pragma unroll 1
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
// one intermediate channel for each of its tokens. Per token and channel, the recipe of DESIGN
// section 1 (the Python reference `megamoe.reference` does the same operations):
//   g, u = BF16(acc * row_scale); g = min(g, clamp); u = clamp(u, -clamp, clamp)
//   a = silu(g) * u * topk_w     (FP32; silu with the fast exp and division: within ~2 ulp of the
//                                 reference's correctly rounded one, which moves an E4M3 code only at
//                                 a rounding tie: measured 0 of ~10^6 codes; the FP64 exp cost ~25 %)
// then ONE FP32 scale per token per kScaleGroup = 128 channels (the granularity the L2 GEMM's
// promotion consumes: the L1 output is a valid L2 input as it stands) and E4M3 codes a * (1 / s).
// A CTA tile holds 64 channels, so the scheduler hands a CTA the two n-blocks 2p, 2p + 1 of a token
// tile in a row (GroupedScheduler kPairN = 2): the first half parks its activations in shared
// memory (the stash, thread-private), the second computes the 128-channel maxima, the scales, and
// writes both halves (out_q channels 128p .. 128p + 127, out_s column p).
// Barriers (all over the 256 math threads, id `bar_id`, in this order in the second half):
//   1. partial maxima written (per warp) -> read by one thread per token;
//   2. that thread's scale written to shared memory -> read by every thread of the token;
//   3. (staged store) E4M3 bytes written to the staging tile -> 16-byte copy-out.
// Re-use across tiles: the next pair's writes of each buffer come after a barrier that every thread
// reaches only after its reads of this pair (maxima: after 2; scales: after 1 of the next pair;
// staging: after 1 of the next pair); the stash is written and read by its own thread only.
constexpr int kL1ScaleGroup = kScaleGroup;
static_assert(kL1ScaleGroup == 2 * (WL::kBlockRows / 2), "an L1 output scale group is two CTA tiles");
static_assert(WL::kMathThreads / 32 == 8, "8 math warps share a token's max");

struct L1Args {
  const float* topk_w;  // [rows] top-k weight of each token row (coherent loads: a fused dispatch writes it)
  uint8_t* out_q;       // [rows][n / 2] E4M3
  float* out_s;         // [rows][n / 2 / kL1ScaleGroup]
  float clamp;          // activation clamp (inf: none)
  bool pow2;            // power-of-two scales
};

__device__ __forceinline__ float silu_fast(float g) {
  // g / (1 + e^-g): ex2.approx and rcp.approx (|rel. error| ~2^-22). g < -87: e^-g > 2^126 and
  // __fdividef gives 0 (silu's limit); e^-g = inf gives g * 0 = -0.
  return __fdividef(g, 1.0f + __expf(-g));
}

// This thread's activations of one tile: a[i] for token 8 (i / 2) + 2 (lane % 4) + i % 2 (0 past rows).
template <int kBlockN>
__device__ __forceinline__ void l1_activations(const float (&acc)[kBlockN / 2], float rs_g, float rs_u,
                                               const L1Args& l1, int64_t row0, int rows, int q,
                                               float (&a)[kBlockN / 4]) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = 8 * j + 2 * q + c;
      float g = __bfloat162float(__float2bfloat16_rn(acc[4 * j + c] * rs_g));
      float u = __bfloat162float(__float2bfloat16_rn(acc[4 * j + 2 + c] * rs_u));
      g = fminf(g, l1.clamp);
      u = fminf(fmaxf(u, -l1.clamp), l1.clamp);
      const float w = tok < rows ? ptx::ld_relaxed_gpu_f32(l1.topk_w + row0 + tok) : 0.f;
      a[2 * j + c] = silu_fast(g) * u * w;
    }
}

// One tile of a pair (t.n_block even: first half, odd: second). Shared memory (MainloopConfig, kL1):
// maxima [kBlockN][8], scales [kBlockN], stash [kBlockN / 8][256][2], staging [kBlockN][kRowBytes]
// (kStaged; else direct byte stores). `tid_m` = wg * 128 + tid_in_wg (0..255).
template <int kBlockN, bool kStaged, int kRowBytes>
__device__ __forceinline__ void store_l1_pair(const float (&acc)[kBlockN / 2], const float* row_scale,
                                              const L1Args& l1, int n, int64_t row0, int rows, int n_block,
                                              int wg, int tid_in_wg, float* amax_smem, float* scale_smem,
                                              float* stash, uint8_t* staging, uint32_t bar_id) {
  constexpr int kTok = kBlockN / 4;  // tokens per thread: 8j + 2(lane%4) + c
  const int warp = tid_in_wg / 32, lane = tid_in_wg % 32, q = lane % 4;
  const int tid_m = wg * 128 + tid_in_wg;
  const int r = n_block * WL::kBlockRows + wg * WL::kRowsPerWarpgroup + 16 * warp + lane / 4;
  const float rs_g = __ldg(row_scale + r), rs_u = __ldg(row_scale + r + 8);
  float a[kTok];
  l1_activations<kBlockN>(acc, rs_g, rs_u, l1, row0, rows, q, a);
  float2* st = reinterpret_cast<float2*>(stash) + tid_m;
  if ((n_block & 1) == 0) {  // first half: park the activations
#pragma unroll
    for (int i = 0; i < kTok / 2; ++i) st[i * WL::kMathThreads] = make_float2(a[2 * i], a[2 * i + 1]);
    return;
  }
  float a0[kTok];
#pragma unroll
  for (int i = 0; i < kTok / 2; ++i) {
    const float2 v = st[i * WL::kMathThreads];
    a0[2 * i] = v.x, a0[2 * i + 1] = v.y;
  }
  // Per-token max over this thread's 2 channels, then the warp's 8 (lanes sharing lane % 4), then the
  // 8 warps through shared memory.
#pragma unroll
  for (int i = 0; i < kTok; ++i) {
    float m = fmaxf(fabsf(a[i]), fabsf(a0[i]));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
    if (lane < 4) amax_smem[(8 * (i / 2) + 2 * q + i % 2) * 8 + wg * 4 + warp] = m;
  }
  ptx::named_barrier(bar_id, WL::kMathThreads);  // 1
  const int ld = n / 2, p = n_block / 2;
  if (tid_m < kBlockN) {  // one thread per token: its scale
    const float4 lo = reinterpret_cast<const float4*>(amax_smem + tid_m * 8)[0];
    const float4 hi = reinterpret_cast<const float4*>(amax_smem + tid_m * 8)[1];
    const float amax = fmaxf(fmaxf(fmaxf(lo.x, lo.y), fmaxf(lo.z, lo.w)), fmaxf(fmaxf(hi.x, hi.y), fmaxf(hi.z, hi.w)));
    const float s = fp8_scale_from_amax(amax, l1.pow2);
    scale_smem[tid_m] = s;
    if (tid_m < rows) l1.out_s[(row0 + tid_m) * (ld / kL1ScaleGroup) + p] = s;
  }
  ptx::named_barrier(bar_id, WL::kMathThreads);  // 2
  // Channels: first half ch0 = wg * 32 + 8 * warp + lane / 4 of the group, second half 64 + ch0.
  const int ch0 = wg * 32 + 8 * warp + lane / 4;
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
    const float2 s2 = *reinterpret_cast<const float2*>(scale_smem + 8 * j + 2 * q);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int i = 2 * j + c, tok = 8 * j + 2 * q + c;
      const float inv = __frcp_rn(c == 0 ? s2.x : s2.y);  // IEEE 1 / s (no division subroutine)
      const uint8_t c0 = __nv_cvt_float_to_fp8(a0[i] * inv, __NV_SATFINITE, __NV_E4M3);
      const uint8_t c1 = __nv_cvt_float_to_fp8(a[i] * inv, __NV_SATFINITE, __NV_E4M3);
      if constexpr (kStaged) {
        staging[tok * kRowBytes + ch0] = c0;
        staging[tok * kRowBytes + 64 + ch0] = c1;
      } else if (tok < rows) {
        uint8_t* o = l1.out_q + (row0 + tok) * ld + p * kL1ScaleGroup + ch0;
        o[0] = c0;
        o[64] = c1;
      }
    }
  }
  if constexpr (kStaged) {
    ptx::named_barrier(bar_id, WL::kMathThreads);  // 3
    constexpr int kChunks = kL1ScaleGroup / 16;  // 16-byte pieces of a token's 128 channels
#pragma unroll 1  // (as store_bf16_staged's copy-out)
    for (int i = tid_m; i < kBlockN * kChunks; i += WL::kMathThreads) {
      const int tok = i / kChunks, c = i % kChunks;
      if (tok < rows) {
        const uint4 v = ptx::lds_128(ptx::smem_addr(staging) + uint32_t(tok * kRowBytes + c * 16));
        *reinterpret_cast<uint4*>(l1.out_q + (row0 + tok) * ld + p * kL1ScaleGroup + c * 16) = v;
      }
    }
  }
}

}  // namespace fp4_gemm
