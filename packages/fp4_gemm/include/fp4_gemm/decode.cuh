// FP4 (E2M1 with a per-row, per-32 shift) -> E4M3 decode into wgmma A registers.
// Packed format: layout.cuh. Per 8 codes: 2 prmt through an 8-entry LUT of E4M3 magnitudes for
// the group's shift, plus two masked ORs for the signs (no shared-memory round trip).
#pragma once
#include <cstdint>
#include <cuda_fp8.h>

#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/ptx.cuh"

namespace fp4_gemm {

// E4M3 code (RNE, saturating, as the Python reference `fp8_e4m3_lut`) of E2M1 magnitude code c
// (0..7: exponent c >> 1 with bias 1, one mantissa bit c & 1) times 2^shift.
__device__ __forceinline__ uint8_t e4m3_of_e2m1(int c, int shift) {
  const int e = c >> 1, m = c & 1;
  const float mag = e == 0 ? 0.5f * m : ldexpf(1.0f + 0.5f * m, e - 1);
  return __nv_cvt_float_to_fp8(ldexpf(mag, shift), __NV_SATFINITE, __NV_E4M3);
}

// The decode's shift tables, 32 entries of 8 bytes: entry i holds the E4M3 codes of {0, .5, 1, 1.5, 2, 3, 4, 6}
// times 2^shift for shift i (i < 16) or i - 32 (i >= 16), i.e. it is indexed by (shift & 31) straight from
// the packed shift byte (two's complement), clamped to [kMinShift, kMaxShift] for bytes no valid transform
// writes (any byte indexes inside the table). 256 bytes of shared memory, filled once per CTA.
constexpr int kLut32Entries = 32;
static_assert(WL::kMaxShift < kLut32Entries / 2 && WL::kMinShift >= -kLut32Entries / 2,
              "every valid shift has its own entry under (shift & 31)");

__device__ __forceinline__ void fill_shift_lut32(uint8_t* lut, int tid, int nthreads) {
  for (int i = tid; i < kLut32Entries * 8; i += nthreads) {
    const int entry = i / 8;
    const int shift = min(max(entry < kLut32Entries / 2 ? entry : entry - kLut32Entries, WL::kMinShift), WL::kMaxShift);
    lut[i] = e4m3_of_e2m1(i % 8, shift);
  }
}

// One packed word (8 codes of one row) -> two A registers: `lo` = k c..c+3, `hi` = k c+16..c+19.
__device__ __forceinline__ void decode_word(uint32_t w, uint2 lut, uint32_t& lo, uint32_t& hi) {
  const uint32_t mag = w & 0x77777777u;
  lo = ptx::prmt(lut.x, lut.y, mag) | (w & 0x80808080u);
  hi = ptx::prmt(lut.x, lut.y, mag >> 16) | ((w << 4) & 0x80808080u);
}

// A fragment of one k32 step: code words (row r, row r+8) and their two shifts' LUT entries.
__device__ __forceinline__ void decode_step(uint2 codes, uint2 lut_r, uint2 lut_r8, uint32_t (&a)[4]) {
  decode_word(codes.x, lut_r, a[0], a[2]);
  decode_word(codes.y, lut_r8, a[1], a[3]);
}

}  // namespace fp4_gemm
