// experiments/gemv/gemv.cu — EXPERIMENT, not the product (docs/perf-notes.md, "Few-token GEMMs on mma.sync"):
// the BF16-output grouped GEMM for few tokens per expert (1-8 per pass) with warp-level mma.sync instead of wgmma.
// Why: at one token per rank the wgmma path's 8-token tile runs each K block as a dependent decode -> wgmma ->
// wait chain (~0.42 us per K block per CTA, H200), so its 1-token GEMMs take ~1.5-1.9x their HBM floor. A first
// try on CUDA cores (FP32 FMAs on decoded E4M3, 2026-12-07, H100) was issue-bound at ~3x the floor: ~4 instructions
// per weight. Here each warp's 16 weight rows x 32 k are one m16n8k32 tensor-core step (the packed layout is the A
// fragment of mma.sync m16n8k32 E4M3: decode_step's a[0..3] are a0..a3), the tokens are its 8 columns, and the
// weights stream through a TMA
// ring of kStages K-block chunks per CTA (a producer warp; 8 consumer warps), so no per-K-block chain bounds it.
// Issue budget: sm_90 has no FP8 mma.sync (ptxas lowers it to F2FP unpacks + 2 HMMA.16816.F32 that restart from
// zero and are added into d), so each k32 step is written as two FP16 m16n8k16 MMAs chained on d (exact: E4M3
// values are FP16 values; FP32 accumulation): ~225 SASS instructions per warp per K block (48 F2FP, 8 HMMA);
// 8 warps x 225 per 8704-byte chunk is ~35 GB/s per SM at 1.75 GHz, about the H200's copy bandwidth / 132 SMs:
// an SM holding two units at one token may be issue-bound (ncu's issue-slot use says).
// Promotion as the wgmma path: the tensor core's sum over one K block (128 k), then FP32 += that * the token's
// scale. Bits differ from the wgmma path (other partial sums), so the layer would use it in staged and fused alike.
// C entries: gemv_bf16(x, xs, packed, row_scale, group_offsets, G, N, K, out, num_sms, stream) -> 0 / error code;
// gemv_l1(..., topk_w, out_q, out_s, clamp, pow2, num_sms, stream) in the 256-row-unit build (SwiGLU x top-k weight
// -> E4M3 + one scale per 128 channels, the layer's L1 output).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

// The builds' shape (build.sh sets all four): stages, CTAs per SM, row blocks per unit, 64-row units.
#ifndef GEMV_STAGES
#define GEMV_STAGES 8
#endif
#ifndef GEMV_CTAS
#define GEMV_CTAS 2
#endif
#ifndef GEMV_PAIR
#define GEMV_PAIR 1
#endif
#ifndef GEMV_HALF
#define GEMV_HALF 0
#endif

#include "fp4_gemm/decode.cuh"
#include "fp4_gemm/epilogue.cuh"
#include "fp4_gemm/fp8.cuh"
#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/mainloop.cuh"

namespace {
using fp4_gemm::WL;
namespace ptx = ::moe::ptx;
// kHalf: 64-row units (one warpgroup sub-chunk of a chunk, 4 consumer warps): twice the units of kPair 1, for the
// SMs that hold two 128-row units at one token (perf notes).
constexpr bool kHalf = GEMV_HALF;
constexpr int kConsumerWarps = kHalf ? 4 : 8;  // 4 warps of 16 rows per 64-row sub-chunk
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kStages = GEMV_STAGES;  // stages in flight per CTA (kPair K-block chunks of 8704 B each); build.sh's variants
constexpr int kPair = GEMV_PAIR;      // row blocks per unit: 2 = the 256 rows (128 channels) an L1 output scale spans
constexpr int kCtasPerSm = GEMV_CTAS;
constexpr int kTokTile = 8;        // mma n8: tokens per pass over a row block's weights
constexpr int kMaxGroups = 1024;
constexpr uint64_t kTimeoutNs = 2000000000ull;
static_assert(WL::kStepsPerBlockK == 4 && WL::kRowsPerWarpgroup == 64 && WL::kWarpgroupsPerBlock == 2, "fragment");

struct Smem {
  alignas(128) uint8_t ring[kStages][kHalf ? WL::kWgChunkBytes : kPair * WL::kBlockChunkBytes];
  uint64_t full[kStages], empty[kStages];
  alignas(8) uint8_t lut[fp4_gemm::kLut32Entries * 8];
  int offs[kMaxGroups + 1];
  int tile_prefix[kMaxGroups + 1];  // token tiles (kTokTile rows) of the groups before g
  float amax[kTokTile][kConsumerWarps];  // L1: per token, each warp's max over its 16 channels
  float scale[kTokTile];
};
static_assert(WL::kBlockChunkBytes % 128 == 0 && WL::kWgChunkBytes % 128 == 0, "stages stay 128-byte aligned");
static_assert(!kHalf || kPair == 1, "64-row units or row-block pairs");
constexpr int kCopyBytes = kHalf ? WL::kWgChunkBytes : WL::kBlockChunkBytes;  // one bulk copy

// (Branch mma8 holds these wrappers and mma_step in moe_common/ptx.cuh / mainloop.cuh: use those once it is merged.)
// E4M3 pairs -> FP16 pairs (exact: every E4M3 value is an FP16 value): the low / high two bytes of v (the high
// half straight from the register's upper half, no shift).
__device__ __forceinline__ uint32_t f16x2_lo(uint32_t v) {
  uint32_t r;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t f16x2_hi(uint32_t v) {
  uint32_t r;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(r) : "r"(v));
  return r;
}
// d += A (16 x 16, FP16) * B (16 x 8, FP16), FP32 accumulation.
__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// One k32 step as two FP16 m16n8k16 MMAs chained on d. sm_90 has no FP8 mma.sync: ptxas lowers the E4M3 m16n8k32
// to these unpacks and two HMMAs anyway, but starts each from zero and adds into d (4 FADD a step); this keeps the
// chain. k order: the lane's E4M3 bytes (a[0] / a[1]: k c..c+3 of rows r / r + 8; a[2] / a[3]: k c+16..c+19) go to
// the FP16 slots pairwise, and the token bytes bx (the same k) identically, so every product meets its own k.
__device__ __forceinline__ void mma_step(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&bh)[4]) {
  mma_f16(d, f16x2_lo(a[0]), f16x2_lo(a[1]), f16x2_hi(a[0]), f16x2_hi(a[1]), bh[0], bh[1]);
  mma_f16(d, f16x2_lo(a[2]), f16x2_lo(a[3]), f16x2_hi(a[2]), f16x2_hi(a[3]), bh[2], bh[3]);
}

// Unit u (of tiles x row blocks) -> group g, its first row of the tile, rows in it, row block nb.
struct Unit {
  int g, row0, rows, nb, wg0;  // wg0: the 64-row half of a kHalf unit
};
// upt: units per token tile (row blocks / kPair, or 2 x row blocks for kHalf).
__device__ __forceinline__ Unit unit_of(const Smem& s, int u, int upt, int G) {
  const int tile = u / upt;
  int lo = 0, hi = G;  // tile_prefix[lo] <= tile < tile_prefix[hi]: ends at the (non-empty) group holding it
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (s.tile_prefix[mid] <= tile) lo = mid; else hi = mid;
  }
  const int t0 = (tile - s.tile_prefix[lo]) * kTokTile;
  const int n = s.offs[lo + 1] - s.offs[lo] - t0;
  const int sub = u % upt;
  return {lo, s.offs[lo] + t0, n < kTokTile ? n : kTokTile, kHalf ? sub / 2 : sub * kPair, kHalf ? sub % 2 : 0};
}

// kL1: the L1 epilogue (kPair 2: a unit holds the 128 channels of one output scale) with fp4_gemm's own
// l1_activations / fp8_scale_from_amax (the accumulator layout of mma.sync m16n8 is the wgmma tile's at kBlockN 8);
// else BF16 out[row][n] = acc * row_scale.
template <bool kL1>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    gemv_kernel(const uint8_t* __restrict__ x, const float* __restrict__ xs, const uint8_t* __restrict__ packed,
                const float* __restrict__ row_scale, const int* __restrict__ offs, int G, int N, int K,
                __nv_bfloat16* __restrict__ out, fp4_gemm::L1Args l1) {
  static_assert(!kL1 || kPair == 2, "an L1 unit is the pair of row blocks one output scale spans");
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  fp4_gemm::fill_shift_lut32(s.lut, threadIdx.x, blockDim.x);
  for (int i = threadIdx.x; i <= G; i += blockDim.x) s.offs[i] = offs[i];
  if (threadIdx.x == 0)
    for (int i = 0; i < kStages; ++i) ptx::mbar_init(&s.full[i], 1), ptx::mbar_init(&s.empty[i], kConsumerWarps);
  ptx::fence_mbar_init();
  __syncthreads();
  if (warp == 0) {  // token tiles per group, prefix over groups (a warp scan per 32 groups)
    int carry = 0;
    for (int g0 = 0; g0 < G; g0 += 32) {
      const int g = g0 + lane;
      const int n = g < G ? (s.offs[g + 1] - s.offs[g] + kTokTile - 1) / kTokTile : 0;
      int incl = n;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= d) incl += v;
      }
      if (g < G) s.tile_prefix[g] = carry + incl - n;
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) s.tile_prefix[G] = carry;
  }
  __syncthreads();
  const int nblocks = N / WL::kBlockRows, kblocks = K / WL::kBlockK;
  const int upt = kHalf ? 2 * nblocks : nblocks / kPair;
  const int units = s.tile_prefix[G] * upt;

  if (warp == kConsumerWarps) {  // producer: one K-block chunk per stage, the ring continuous across units
    if (lane != 0) return;
    int it = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const Unit un = unit_of(s, u, upt, G);
      const uint8_t* src = packed + (int64_t(un.g) * nblocks + un.nb) * kblocks * int64_t(WL::kBlockChunkBytes) +
                           un.wg0 * WL::kWgChunkBytes;
      for (int kb = 0; kb < kblocks; ++kb, ++it) {
        const int st = it % kStages;
        if (it >= kStages && !ptx::mbar_wait(&s.empty[st], ((it / kStages) & 1) ^ 1, kTimeoutNs)) __trap();
        ptx::mbar_arrive_expect_tx(&s.full[st], kPair * kCopyBytes);
#pragma unroll
        for (int f = 0; f < kPair; ++f)  // row block nb + f: its own K-contiguous run
          ptx::bulk_load(s.ring[st] + f * kCopyBytes, src + (int64_t(f) * kblocks + kb) * WL::kBlockChunkBytes, kCopyBytes,
                         &s.full[st]);
      }
    }
    return;
  }

  // Consumers: warp (wg, w) owns rows nb * 128 + wg * 64 + 16 w + lane / 4 (+ 8): decode_step's A fragment.
  const int w = warp % 4, q = lane % 4, n_tok = lane / 4;
  int it = 0;
  for (int u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit un = unit_of(s, u, upt, G);
    const int wg = kHalf ? un.wg0 : warp / 4;  // the 64-row half this warp's rows sit in
    const fp4_gemm::DecodeOffsets off(kHalf ? 0 : wg, w * 32 + lane);
    const bool tok_ok = n_tok < un.rows;  // this lane's B column (token lane / 4)
    const uint8_t* xrow = x + int64_t(un.row0 + (tok_ok ? n_tok : 0)) * K + 4 * q;
    const bool c0_ok = 2 * q < un.rows, c1_ok = 2 * q + 1 < un.rows;  // this lane's accumulator columns
    const float* xs0 = xs + int64_t(un.row0 + (c0_ok ? 2 * q : 0)) * kblocks;
    const float* xs1 = xs + int64_t(un.row0 + (c1_ok ? 2 * q + 1 : 0)) * kblocks;
    float acc[kPair][4] = {};
    uint32_t b[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = tok_ok ? *reinterpret_cast<const uint32_t*>(xrow + (i / 2) * 32 + (i % 2) * 16) : 0u;
    for (int kb = 0; kb < kblocks; ++kb, ++it) {
      const int st = it % kStages;
      // The next K block's token fragment and this one's scales, issued before the wait.
      uint32_t bn[8];
      const bool more = kb + 1 < kblocks;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        bn[i] = tok_ok && more ? *reinterpret_cast<const uint32_t*>(xrow + (kb + 1) * WL::kBlockK + (i / 2) * 32 + (i % 2) * 16)
                               : 0u;
      const float sc0 = c0_ok ? xs0[kb] : 0.f, sc1 = c1_ok ? xs1[kb] : 0.f;
      if (!ptx::mbar_wait(&s.full[st], (it / kStages) & 1, kTimeoutNs)) __trap();
      // This K block's token fragment in FP16 (per step: k c, c+1 | c+2, c+3 | c+16, c+17 | c+18, c+19), shared by
      // the fragments.
      uint32_t bh[4][4];
#pragma unroll
      for (int step = 0; step < 4; ++step) {
        bh[step][0] = f16x2_lo(b[2 * step]), bh[step][1] = f16x2_hi(b[2 * step]);
        bh[step][2] = f16x2_lo(b[2 * step + 1]), bh[step][3] = f16x2_hi(b[2 * step + 1]);
      }
      float d[kPair][4] = {};
#pragma unroll
      for (int f = 0; f < kPair; ++f) {
        // fp4_gemm's own fragment load and decode (mainloop.cuh): the offsets are the math warpgroup's (a kHalf
        // stage holds only its unit's sub-chunk, at offset 0).
        fp4_gemm::RawFragment raw;
        fp4_gemm::load_raw_smem(s.ring[st] + f * WL::kBlockChunkBytes, off, raw);
        uint32_t a[WL::kStepsPerBlockK][4];
        fp4_gemm::decode_raw(raw, s.lut, a);
#pragma unroll
        for (int step = 0; step < 4; ++step) mma_step(d[f], a[step], bh[step]);
      }
      __syncwarp();
      if (lane == 0) ptx::mbar_arrive(&s.empty[st]);
#pragma unroll
      for (int f = 0; f < kPair; ++f) {
        acc[f][0] = fmaf(d[f][0], sc0, acc[f][0]), acc[f][1] = fmaf(d[f][1], sc1, acc[f][1]);
        acc[f][2] = fmaf(d[f][2], sc0, acc[f][2]), acc[f][3] = fmaf(d[f][3], sc1, acc[f][3]);
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) b[i] = bn[i];
    }
    // d / acc: [0] (row r, token 2q), [1] (row r, token 2q + 1), [2] / [3] the same for row r + 8.
    if constexpr (kL1) {
      // Rows r / r + 8 of a fragment are the gate / up of channel (wg * 32 + 8 w + lane / 4) + 64 f of the pair.
      float a[kPair][2];
#pragma unroll
      for (int f = 0; f < kPair; ++f) {
        const int r = (un.nb + f) * WL::kBlockRows + wg * WL::kRowsPerWarpgroup + 16 * w + n_tok;
        fp4_gemm::l1_activations<kTokTile>(acc[f], row_scale[int64_t(un.g) * N + r], row_scale[int64_t(un.g) * N + r + 8],
                                           l1, un.row0, un.rows, q, a[f]);
      }
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // token 2q + c: max over this lane's 2 channels, the warp's 16, then 8 warps
        float m = fmaxf(fabsf(a[0][c]), fabsf(a[1][c]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
        if (lane < 4) s.amax[2 * q + c][warp] = m;
      }
      // Barrier 1 (the 256 consumer threads): maxima written -> read; barrier 2: scales written -> read. The next
      // unit's writes of either come after its own barrier 1, which every thread reaches after these reads.
      ptx::named_barrier(1, kConsumerWarps * 32);
      const int ld = N / 2, p = un.nb / 2;
      if (threadIdx.x < kTokTile) {
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < kConsumerWarps; ++i) m = fmaxf(m, s.amax[threadIdx.x][i]);
        const float sc = fp4_gemm::fp8_scale_from_amax(m, l1.pow2);
        s.scale[threadIdx.x] = sc;
        if (int(threadIdx.x) < un.rows) l1.out_s[int64_t(un.row0 + threadIdx.x) * (ld / fp4_gemm::kL1ScaleGroup) + p] = sc;
      }
      ptx::named_barrier(1, kConsumerWarps * 32);
      const int ch0 = wg * 32 + 8 * w + n_tok;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int tok = 2 * q + c;
        if (tok < un.rows) {
          const float inv = __frcp_rn(s.scale[tok]);
          uint8_t* o = l1.out_q + int64_t(un.row0 + tok) * ld + p * fp4_gemm::kL1ScaleGroup + ch0;
          o[0] = __nv_cvt_float_to_fp8(a[0][c] * inv, __NV_SATFINITE, __NV_E4M3);
          o[64] = __nv_cvt_float_to_fp8(a[1][c] * inv, __NV_SATFINITE, __NV_E4M3);
        }
      }
    } else {
#pragma unroll
      for (int f = 0; f < kPair; ++f) {
        const int r = (un.nb + f) * WL::kBlockRows + wg * WL::kRowsPerWarpgroup + 16 * w + n_tok;
        const float rs0 = row_scale[int64_t(un.g) * N + r], rs1 = row_scale[int64_t(un.g) * N + r + 8];
        if (c0_ok) {
          __nv_bfloat16* o = out + int64_t(un.row0 + 2 * q) * N + r;
          o[0] = __float2bfloat16_rn(acc[f][0] * rs0), o[8] = __float2bfloat16_rn(acc[f][2] * rs1);
        }
        if (c1_ok) {
          __nv_bfloat16* o = out + int64_t(un.row0 + 2 * q + 1) * N + r;
          o[0] = __float2bfloat16_rn(acc[f][1] * rs0), o[8] = __float2bfloat16_rn(acc[f][3] * rs1);
        }
      }
    }
  }
}
}  // namespace

namespace {
template <bool kL1>
int launch(const void* x, const float* xs, const void* packed, const float* row_scale, const int* offs, int G, int N,
           int K, void* out, const fp4_gemm::L1Args& l1, int num_sms, cudaStream_t stream) {
  if (G <= 0 || G > kMaxGroups || N % (kPair * WL::kBlockRows) != 0 || K % WL::kBlockK != 0) return 1;
  if (reinterpret_cast<uintptr_t>(x) % 16 || reinterpret_cast<uintptr_t>(packed) % 16 || K % 16) return 2;
  if (num_sms <= 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  }
  static bool attr = false;
  if (!attr) {
    const cudaError_t e = cudaFuncSetAttribute(gemv_kernel<kL1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem)));
    if (e != cudaSuccess) return int(e);
    attr = true;
  }
  // Units (token tiles x row blocks) are counted on the device (no host sync); the grid covers the SMs.
  gemv_kernel<kL1><<<num_sms * kCtasPerSm, kThreads, sizeof(Smem), stream>>>(
      static_cast<const uint8_t*>(x), xs, static_cast<const uint8_t*>(packed), row_scale, offs, G, N, K,
      static_cast<__nv_bfloat16*>(out), l1);
  return int(cudaGetLastError());
}
}  // namespace

extern "C" int gemv_rows_per_unit() { return kHalf ? WL::kRowsPerWarpgroup : kPair * WL::kBlockRows; }

extern "C" int gemv_bf16(const void* x, const float* xs, const void* packed, const float* row_scale, const int* offs,
                         int G, int N, int K, void* out, int num_sms, cudaStream_t stream) {
  return launch<false>(x, xs, packed, row_scale, offs, G, N, K, out, fp4_gemm::L1Args{}, num_sms, stream);
}

// L1 (pair build only): out_q [rows][N / 2] E4M3, out_s [rows][N / 2 / 128], topk_w [rows].
extern "C" int gemv_l1(const void* x, const float* xs, const void* packed, const float* row_scale, const int* offs,
                       int G, int N, int K, const float* topk_w, void* out_q, float* out_s, float clamp, int pow2,
                       int num_sms, cudaStream_t stream) {
  if constexpr (kPair != 2) {
    return 3;
  } else {
    const fp4_gemm::L1Args l1{topk_w, static_cast<uint8_t*>(out_q), out_s, clamp, pow2 != 0};
    return launch<true>(x, xs, packed, row_scale, offs, G, N, K, nullptr, l1, num_sms, stream);
  }
}
