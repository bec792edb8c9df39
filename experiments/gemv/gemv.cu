// experiments/gemv/gemv.cu — EXPERIMENT, not the product (docs/perf-notes.md, "The 16 / 32 / 64-token tiles",
// the GEMV item): the BF16-output grouped GEMM for 1-2 tokens per expert on CUDA cores instead of wgmma.
// Why: at one token per rank a wgmma tile of 8 tokens wastes 7/8 of every MMA and each K block is a dependent
// decode -> wgmma -> wait chain (~0.42 us per K block per CTA, H200), so the layer's 1-token GEMMs run ~2.5x their
// HBM floor. Here every warp streams its own 16 weight rows over all of K with no chain between K blocks (FP32
// FMAs on the decoded E4M3 values; the products of two E4M3 values are exact in FP32), so the bytes in flight,
// not a per-block latency, bound it.
// Reads fp4_gemm's packed layout (layout.cuh) and decodes with its decode_step / 32-entry table (decode.cuh).
// Its bits differ from the wgmma path's (FP32 sums instead of the tensor cores' partial sums): a product path
// would have to be used by staged and fused alike at the sizes it serves.
// C entry: gemv_bf16(x, xs, packed, row_scale, group_offsets, G, N, K, out, num_sms, stream) -> 0 / error code.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp4_gemm/decode.cuh"
#include "fp4_gemm/layout.cuh"

namespace {
using fp4_gemm::WL;
constexpr int kWarps = 8;           // warps per CTA
constexpr int kCtasPerSm = 2;       // 16 warps per SM, each with kKbUnroll K blocks' loads in flight (114 registers, no spill)
constexpr int kMaxTok = 2;          // tokens per pass over a unit's weights (more rows: more passes)
constexpr int kRowsPerUnit = 16;    // one warp's rows of a warpgroup's 64 (layout.cuh)
constexpr int kMaxGroups = 2048;    // group offsets staged in shared memory
constexpr int kKbUnroll = 4;        // K blocks whose loads are issued together
static_assert(WL::kRowsPerWarpgroup == 4 * kRowsPerUnit && WL::kStepsPerBlockK == 4, "layout.cuh's fragment");

__device__ __forceinline__ void e4m3x4(uint32_t v, float (&f)[4]) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(v >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
}

// One K block of one unit for the pass's tokens: p[t][0] (row r) and p[t][1] (row r + 8) over this lane's 32 k.
struct KBlock {
  uint2 codes[4];
  uint16_t shifts[4];
};

__device__ __forceinline__ void load_kblock(const uint8_t* ch, int w, int lane, KBlock& b) {
  const int q = lane / 4;
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    b.codes[s] = *reinterpret_cast<const uint2*>(ch + (s * 128 + w * 32 + lane) * 8);
    b.shifts[s] = *reinterpret_cast<const uint16_t*>(ch + WL::kCodeBytes + ((w * 8 + q) * 4 + s) * 2);
  }
}

__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm)
    gemv_kernel(const uint8_t* __restrict__ x, const float* __restrict__ xs, const uint8_t* __restrict__ packed,
                const float* __restrict__ row_scale, const int* __restrict__ offs, int G, int N, int K,
                __nv_bfloat16* __restrict__ out) {
  __shared__ __align__(8) uint8_t lut[fp4_gemm::kLut32Entries * 8];
  __shared__ int s_offs[kMaxGroups + 1];
  fp4_gemm::fill_shift_lut32(lut, threadIdx.x, blockDim.x);
  for (int i = threadIdx.x; i <= G; i += blockDim.x) s_offs[i] = offs[i];
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int slices = N / kRowsPerUnit, kblocks = K / WL::kBlockK;
  const int units = G * slices;
  const int c = 4 * (lane % 4);
  // Unit u = (group, slice), consecutive units on consecutive CTAs (different SMs).
  for (int u = warp * gridDim.x + blockIdx.x; u < units; u += gridDim.x * kWarps) {
    const int g = u / slices, slice = u % slices;
    const int row0 = s_offs[g], rows = s_offs[g + 1] - row0;
    if (rows <= 0) continue;
    const int nb = slice / 8, wg = (slice % 8) / 4, w = slice % 4;
    const uint8_t* chunk0 = packed + (int64_t(g) * (N / WL::kBlockRows) + nb) * kblocks * int64_t(WL::kBlockChunkBytes) +
                            wg * WL::kWgChunkBytes;
    const int r = nb * WL::kBlockRows + wg * WL::kRowsPerWarpgroup + w * kRowsPerUnit + lane / 4;
    for (int t0 = 0; t0 < rows; t0 += kMaxTok) {
      const int nt = min(kMaxTok, rows - t0);
      float acc[kMaxTok][2] = {};
      for (int kb0 = 0; kb0 < kblocks; kb0 += kKbUnroll) {
        KBlock b[kKbUnroll];
#pragma unroll
        for (int j = 0; j < kKbUnroll; ++j)
          if (kb0 + j < kblocks) load_kblock(chunk0 + int64_t(kb0 + j) * WL::kBlockChunkBytes, w, lane, b[j]);
#pragma unroll
        for (int j = 0; j < kKbUnroll; ++j) {
          const int kb = kb0 + j;
          if (kb >= kblocks) break;
          float p[kMaxTok][2] = {};
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const uint2 lr = *reinterpret_cast<const uint2*>(lut + (b[j].shifts[s] & 31) * 8);
            const uint2 lr8 = *reinterpret_cast<const uint2*>(lut + ((b[j].shifts[s] >> 8) & 31) * 8);
            uint32_t a[4];
            fp4_gemm::decode_step(b[j].codes[s], lr, lr8, a);  // a[0] / a[2]: row r, a[1] / a[3]: row r + 8
            float w0[4], w1[4], w2[4], w3[4];
            e4m3x4(a[0], w0), e4m3x4(a[1], w1), e4m3x4(a[2], w2), e4m3x4(a[3], w3);
#pragma unroll
            for (int t = 0; t < kMaxTok; ++t) {
              if (t >= nt) break;
              const uint8_t* xr = x + int64_t(row0 + t0 + t) * K + kb * WL::kBlockK + s * 32 + c;
              float xl[4], xh[4];
              e4m3x4(*reinterpret_cast<const uint32_t*>(xr), xl);
              e4m3x4(*reinterpret_cast<const uint32_t*>(xr + 16), xh);
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                p[t][0] = fmaf(w0[i], xl[i], fmaf(w2[i], xh[i], p[t][0]));
                p[t][1] = fmaf(w1[i], xl[i], fmaf(w3[i], xh[i], p[t][1]));
              }
            }
          }
#pragma unroll
          for (int t = 0; t < kMaxTok; ++t) {
            if (t >= nt) break;
            const float sc = xs[int64_t(row0 + t0 + t) * kblocks + kb];
            acc[t][0] = fmaf(sc, p[t][0], acc[t][0]);
            acc[t][1] = fmaf(sc, p[t][1], acc[t][1]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kMaxTok; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the quad's four lanes hold the same rows' other k
          acc[t][h] += __shfl_xor_sync(0xffffffffu, acc[t][h], 1);
          acc[t][h] += __shfl_xor_sync(0xffffffffu, acc[t][h], 2);
        }
      if (lane % 4 == 0) {
        for (int t = 0; t < nt; ++t) {
          __nv_bfloat16* o = out + int64_t(row0 + t0 + t) * N;
          o[r] = __float2bfloat16_rn(row_scale[int64_t(g) * N + r] * acc[t][0]);
          o[r + 8] = __float2bfloat16_rn(row_scale[int64_t(g) * N + r + 8] * acc[t][1]);
        }
      }
    }
  }
}
}  // namespace

extern "C" int gemv_bf16(const void* x, const float* xs, const void* packed, const float* row_scale, const int* offs,
                         int G, int N, int K, void* out, int num_sms, cudaStream_t stream) {
  if (G <= 0 || G > kMaxGroups || N % WL::kBlockRows != 0 || K % WL::kBlockK != 0) return 1;
  if (reinterpret_cast<uintptr_t>(x) % 4 || reinterpret_cast<uintptr_t>(packed) % 16) return 2;  // the vector loads
  if (num_sms <= 0) {
    int dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev);
  }
  gemv_kernel<<<num_sms * kCtasPerSm, kWarps * 32, 0, stream>>>(
      static_cast<const uint8_t*>(x), xs, static_cast<const uint8_t*>(packed), row_scale, offs, G, N, K,
      static_cast<__nv_bfloat16*>(out));
  return int(cudaGetLastError());
}
