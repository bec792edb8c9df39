// symm_comm/combine.cuh — EP combine as device functions. The standalone kernel (csrc/combine.cu):
//   build_pool_tables (from the last dispatch's counts) -> push_rows (each pool row's BF16 output is
//   STORED into its source rank's combine buffer at [k, token]) -> grid + cross-rank barrier ->
//   reduce_tokens (y[t] = BF16(sum over k = 0..K-1 present, in FP32, optional weight multiply)).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>
#include "symm_comm/copy.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/pool.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

#if defined(__CUDACC__)
namespace symm {

// Push one pool row's output (BF16 [H], at `src_row`) to (s, token, k) of its source's combine buffer.
template <int UNROLL, bool kCoherentSrc>
__device__ __forceinline__ void push_row(const SymmLayout& L, const uint64_t* peers, int parity, int32_t row_src_code,
                                         const uint16_t* src_row, int lane) {
  const int K = L.topk, T = L.max_tokens;
  const int32_t k = row_src_code % K;
  const int32_t st = row_src_code / K;
  const int32_t tok = st % T, s = st / T;
  if (s >= L.num_ranks) return;
  uint16_t* dst = combine_row(peers[s], L, parity, k, tok);
  warp_copy_v4<UNROLL, kCoherentSrc>(reinterpret_cast<int4*>(dst), reinterpret_cast<const int4*>(src_row),
                                     L.hidden * 2 / 16, lane);
}

// All rows of the last dispatch, source-interleaved like the pull. expert_out: BF16 [out_rows, H].
template <int UNROLL, bool kCoherentSrc>
__device__ __forceinline__ void push_rows(const Workers& W, const SymmLayout& L, const uint64_t* peers, uint64_t local,
                                          const PoolTables& t, int parity, const uint16_t* expert_out) {
  const int32_t* row_src = at<int32_t>(local, L.off_row_src);
  for_each_pool_row_interleaved(W, L, t, [&](int, int32_t row, int, int32_t) {
    const int32_t code = __ldg(row_src + row);
    if (code >= 0)
      push_row<UNROLL, kCoherentSrc>(L, peers, parity, code, expert_out + (int64_t)row * L.hidden, W.lane);
  });
}

__device__ __forceinline__ void bf16x8_accumulate(float* acc, const int4& v, float w) {
  const uint32_t u[4] = {(uint32_t)v.x, (uint32_t)v.y, (uint32_t)v.z, (uint32_t)v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // no FMA contraction: (w * v) rounded, then added — what an elementwise FP32 reference does
    acc[2 * i] = __fadd_rn(acc[2 * i], __fmul_rn(w, __uint_as_float(u[i] << 16)));
    acc[2 * i + 1] = __fadd_rn(acc[2 * i + 1], __fmul_rn(w, __uint_as_float(u[i] & 0xffff0000u)));
  }
}

__device__ __forceinline__ int4 f32x8_to_bf16x8(const float* acc) {
  uint32_t u[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    u[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return make_int4((int)u[0], (int)u[1], (int)u[2], (int)u[3]);
}

// y[t, :] = BF16( sum_{k = 0..K-1, bit k of kmask[t]} w[t, k] * combine[parity][k][t, :] ), FP32,
// k in order. topk_w: FP32 [T, K] or null (w = 1). Work item = (token, 512-byte column chunk), one
// 16-byte vector per lane, KB loads in flight per lane: a token's row is spread over many warps, so
// small token counts still use the whole grid (one warp per token was ~28 dependent round trips).
template <int KB>
__device__ __forceinline__ void reduce_tokens(const Workers& W, const SymmLayout& L, uint64_t local, int parity,
                                              int num_tokens, const float* topk_w, uint16_t* y) {
  const int K = L.topk;
  const int n16 = L.hidden * 2 / 16;
  const int nchunks = (n16 + 31) / 32;
  const uint32_t* kmask = at<uint32_t>(local, L.off_kmask);
  for (int64_t item = W.gwarp(); item < (int64_t)num_tokens * nchunks; item += W.total_warps()) {
    const int64_t t = item / nchunks;
    const int c = (int)(item - t * nchunks) * 32 + W.lane;
    if (c >= n16) continue;
    const uint32_t mask = __ldg(kmask + t);
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
    for (int k0 = 0; k0 < K; k0 += KB) {
      int4 v[KB];
      float w[KB];  // loaded with the rows, not one dependent load per k in the sum
#pragma unroll
      for (int u = 0; u < KB; ++u) {
        const int k = k0 + u;
        if (k < K && ((mask >> k) & 1u)) {
          v[u] = ptx::ld_v4_coherent(reinterpret_cast<const int4*>(combine_row(local, L, parity, k, (int)t)) + c);
          w[u] = topk_w ? __ldg(topk_w + t * K + k) : 1.f;
        }
      }
#pragma unroll
      for (int u = 0; u < KB; ++u) {
        const int k = k0 + u;
        if (k < K && ((mask >> k) & 1u)) bf16x8_accumulate(acc, v[u], w[u]);
      }
    }
    ptx::st_v4(reinterpret_cast<int4*>(y + t * L.hidden) + c, f32x8_to_bf16x8(acc));
  }
}

}  // namespace symm
#endif
