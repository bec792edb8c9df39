// Packed-weight layout: the single source of truth for how transformed MXFP4 weights are laid out
// in memory for the kernels. `fp4_gemm/layout.py` reads these constants from this file.
//
// Logical form (fp4_gemm.numerics.transform_weights): codes uint8 [G, N, K/2] (element 2j in the
// low nibble), shift int8 [G, N, K/32] (decoded value = e4m3(e2m1 * 2^shift)), row_scale FP32
// [G, N] (= 2^(B - 6 - 127), applied in the epilogue).
//
// Packed form: for each group g, row block nb (kBlockRows rows), K block kb (kBlockK), a chunk of
// kBlockChunkBytes: one sub-chunk per math warpgroup (kRowsPerWarpgroup rows):
//   codes  [k32 step s (4)][thread t (128)][8 bytes]  -- thread t's A fragment for k32 step s
//   shifts [warp w (4)][row quad q (8)][k32 step (4)][2] -- shifts of rows (16w+q, 16w+q+8)
// A thread's 8 code bytes are two words: w0 = row r = 16*warp + lane/4, w1 = row r + 8.
// In each word, bits 0-2 of nibbles 0..3 are the magnitudes of k = c..c+3 (c = 4*(lane%4)) and
// of nibbles 4..7 those of k = c+16..c+19; the sign of k = c+i sits at bit 8i+7, the sign of
// k = c+16+i at bit 8i+3. Then two `prmt` with a per-shift 8-entry LUT plus two masked ORs give
// the wgmma A registers (see decode.cuh).
#pragma once
#include "moe_common/constants.cuh"

namespace fp4_gemm {
using moe::Granularity;

// Activation scale granularity (moe_common/constants.cuh): the GEMM promotes once per kScaleGroup of K
// (kBlockK); the Python side (fp4_gemm.ops.SCALE_GROUP, megamoe.reference) reads the same header.
constexpr int kScaleGroup = moe::Granularity::kScaleGroup;

struct PackedWeightLayout {
  static constexpr int kRowsPerWarpgroup = 64;   // one wgmma M
  static constexpr int kWarpgroupsPerBlock = 2;  // math warpgroups per CTA tile
  static constexpr int kBlockRows = kRowsPerWarpgroup * kWarpgroupsPerBlock;
  static constexpr int kBlockK = Granularity::kScaleGroup;  // K per pipeline stage: one activation scale
  static constexpr int kGroupK = 32;             // MXFP4 group = wgmma K for FP8
  static constexpr int kStepsPerBlockK = kBlockK / kGroupK;
  static constexpr int kThreadsPerWarpgroup = 128;
  static constexpr int kMathThreads = kWarpgroupsPerBlock * kThreadsPerWarpgroup;
  static constexpr int kCodeBytesPerThreadStep = 8;
  static constexpr int kCodeBytes = kStepsPerBlockK * kThreadsPerWarpgroup * kCodeBytesPerThreadStep;
  static constexpr int kShiftBytes = kRowsPerWarpgroup * kStepsPerBlockK;
  static constexpr int kWgChunkBytes = kCodeBytes + kShiftBytes;
  static constexpr int kBlockChunkBytes = kWgChunkBytes * kWarpgroupsPerBlock;
  static constexpr int kMinShift = -13;  // at and below this every E2M1 value rounds to 0 in E4M3
  static constexpr int kMaxShift = 6;    // 6 * 2^6 = 384 <= 448
};

using WL = PackedWeightLayout;

static_assert(PackedWeightLayout::kCodeBytes == PackedWeightLayout::kRowsPerWarpgroup * PackedWeightLayout::kBlockK / 2,
              "two E2M1 codes per byte");
static_assert(PackedWeightLayout::kWgChunkBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

}  // namespace fp4_gemm
