// Standalone per-token, per-128-channel FP8 quantiser (BF16 -> E4M3 + FP32 scales).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "fp4_gemm/fp8.cuh"
#include "fp4_gemm/layout.cuh"
#include "fp4_gemm_api.h"

namespace fp4_gemm {
namespace {

constexpr int kGroup = kScaleGroup;  // channels per scale (layout.cuh)
constexpr int kElemsPerLane = kGroup / 32;  // 4 BF16 = 8 bytes per lane
constexpr int kWarpsPerBlock = 8;

// One warp per (token, 128-channel group): 8-byte loads, shuffle max, 4-byte stores.
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
quantize_fp8_kernel(const __nv_bfloat16* __restrict__ x, uint8_t* __restrict__ q,
                    float* __restrict__ scales, int64_t T, int64_t groups_per_row,
                    int64_t x_stride, bool pow2) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (warp >= T * groups_per_row) return;
  const int64_t t = warp / groups_per_row, g = warp % groups_per_row;
  const int64_t col = g * kGroup + lane * kElemsPerLane;

  const uint2 raw = *reinterpret_cast<const uint2*>(x + t * x_stride + col);
  const __nv_bfloat162 v01 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
  const __nv_bfloat162 v23 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
  const float2 f01 = __bfloat1622float2(v01), f23 = __bfloat1622float2(v23);
  float amax = fmaxf(fmaxf(fabsf(f01.x), fabsf(f01.y)), fmaxf(fabsf(f23.x), fabsf(f23.y)));
  amax = warp_max(amax);
  const float s = fp8_scale_from_amax(amax, pow2);
  *reinterpret_cast<uint32_t*>(q + t * groups_per_row * kGroup + col) =
      cvt_e4m3x4(f01.x / s, f01.y / s, f23.x / s, f23.y / s);
  if (lane == 0) scales[t * groups_per_row + g] = s;
}

}  // namespace
}  // namespace fp4_gemm

extern "C" int fp4g_quantize_fp8(const void* x, void* q, float* scales, int64_t T, int64_t H,
                                 int64_t x_stride, int pow2_scales, cudaStream_t stream) {
  using namespace fp4_gemm;
  if (T < 0 || H <= 0 || H % kGroup != 0 || x_stride < H) return FP4G_EINVAL;
  if ((reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(q)) % 8 != 0 || x_stride % 4 != 0)
    return FP4G_EALIGN;
  if (T == 0) return FP4G_OK;
  const int64_t warps = T * (H / kGroup);
  const int64_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7fffffff) return FP4G_EINVAL;
  quantize_fp8_kernel<<<unsigned(blocks), kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const __nv_bfloat16*>(x), static_cast<uint8_t*>(q), scales, T, H / kGroup, x_stride,
      pow2_scales != 0);
  return int(cudaGetLastError());
}
