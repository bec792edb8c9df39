// FP8 E4M3 quantisation helpers shared by the standalone quantiser and the L1 epilogue.
// Contract (the Python reference `fp4_gemm.numerics.quantize_fp8` is the same formula):
//   amax  = max |x| over the group (FP32, exact for BF16 inputs)
//   scale = max(amax, kMinAmax) / 448            (IEEE FP32 division, round to nearest)
//   pow2: scale rounded UP to the next power of two (exact bit arithmetic, UE8M0-compatible)
//   q     = e4m3(x / scale), round-to-nearest-even, saturating to +-448
#pragma once
#include <cstdint>
#include <cuda_fp8.h>

namespace fp4_gemm {

constexpr float kFp8E4M3Max = 448.0f;
// Smallest amax used for a scale: keeps an all-zero group finite (its codes are 0).
constexpr float kMinAmax = 1e-10f;

__device__ __forceinline__ float fp8_scale_from_amax(float amax, bool pow2) {
  float s = fmaxf(amax, kMinAmax) / kFp8E4M3Max;
  if (pow2) {
    // s > 0 and normal here: round the mantissa up to the next power of two.
    uint32_t b = __float_as_uint(s);
    b = (b + 0x007FFFFFu) & 0xFF800000u;
    s = __uint_as_float(b);
  }
  return s;
}

// Four FP32 values -> four E4M3 codes packed little-endian into one word.
__device__ __forceinline__ uint32_t cvt_e4m3x4(float a, float b, float c, float d) {
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
  return uint32_t(lo) | (uint32_t(hi) << 16);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace fp4_gemm
