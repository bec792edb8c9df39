// Epilogues of the swap-AB GEMM. Accumulator element acc[4j + 2h + c] of a math thread holds
// (weight row 16*warp + lane/4 + 8h of its warpgroup, token column 8j + 2*(lane%4) + c).
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "fp4_gemm/layout.cuh"

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

}  // namespace fp4_gemm
