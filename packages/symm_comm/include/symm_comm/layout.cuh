// symm_comm/layout.cuh — THE layout of one rank's symmetric buffer. Every rank's buffer has the
// same layout (only `rank` differs), so an offset valid here is valid in every peer's mapping.
// Compiles for host and device. `symm_layout_compute` is the single place sizes and offsets are
// decided; the C ABI exports it (symm_layout_init) and Python mirrors the struct with ctypes.
//
// Regions, in order (each aligned to SYMM_REGION_ALIGN bytes):
//   signals      u64 [SYMM_NUM_SIGNALS][R]      written by PEERS: [dispatch][s] += 2^32 per call of s (one
//                                               red.release.sys per CTA of s, see barrier.cuh);
//                                               [combine][s] = epoch s started (combine_signal; push combine
//                                               st.release.sys, pull combine red.max.sys)
//   state        SYMM_STATE_BYTES               local: epochs, end-of-kernel counters, pull work counters,
//                                               error word
//   meta_count   i32 [2][L][R]                  written by PEERS in dispatch phase A (parity = epoch & 1)
//   meta_slots   i32 [2][L][R][T]               (token * K + k) per slot, written by PEERS (pull mode)
//   meta_map     i32 [2][R][T * K]              written by PEERS with meta_slots (pull dedup, v7): for source
//                                               s's id i = token * K + k routed to this rank, the token's
//                                               LEADER here (its lowest such k) holds the mask of the token's
//                                               higher ks routed here, every other such id le * T + slot
//                                               (metadata.cuh send_slot, dispatch.cuh pull_rows)
//   stage_x      u8  [2][T][H]                  this rank's FP8 rows, READ by peers in phase B
//   stage_s      f32 [2][T][S]                  per-128 scales, S = H / 128
//   stage_w      f32 [2][T][K]                  top-k weights
//   kmask        u32 [T]                        local: bit k of token t = topk_idx[t, k] valid
//   meta_scan    i32 [G_max][E]                 local: dispatch phase A, per-CTA expert counts of its own
//                                               token range, then their exclusive prefix over CTAs
//                                               (G_max = SYMM_META_MAX_GROUPS; metadata.cuh)
//   id_slot      i32 [T * K]                    local: slot of this rank's (token, k) at its expert, written by
//                                               the one-pass metadata walk for K not dividing 32 (the input of
//                                               its sends, metadata.cuh meta_walk); only valid ids are read
//   cmb_map      i32 [T * K]                    pull combine (v8, only when cmb_in_rows > 0): where this rank's
//                                               (token, k) row sits at its owner, row * R + owner; written by
//                                               the OWNER in dispatch phase B (a peer store per pool row), -1
//                                               from phase A (stage_inputs)
//   cmb_hist     i32 [R][C]                     local: pool rows of (source s, token chunk c) of the last
//                                               dispatch (C = num_chunks, chunk = combine_chunk tokens)
//   cmb_order    i32 [R][C][chunk * K]          local: those pool rows (bucket (s, c) holds <= chunk * K)
//   cmb_arr      u32 [2][T]                     written by PEERS in combine: rows stored for token t (parity)
//   src_counts   i32 [L][R]                     local: rows of (local expert, source) of the last dispatch
//   exp_counts   i32 [L]                        local: valid rows per local expert
//   exp_offsets  i32 [L + 1]                    local: segment start per local expert, [L] = rows used
//   arrivals     u32 [P / block_m]              local: += 1 per arrived (or padding) row, monotonic
//   row_src      i32 [P]                        local: (src * T + token) * K + k per pool row, -1 = padding
//   pool_x       u8  [P][H]                     local: expert-major FP8 rows
//   pool_s       f32 [P][S]
//   pool_w       f32 [P]
//   combine      bf16 [2][K][T][H]              written by PEERS in combine (parity = epoch & 1)
//   cmb_in       bf16 [cmb_in_rows][H]          optional (v8): the expert outputs in pool row order, written by
//                                               this rank's producer (GEMM), READ by peers in the pull combine
// R = num_ranks, L = num_local_experts = E / R, T = max_tokens (per rank), P = pool_rows.
// Double-buffered (parity) regions make back-to-back calls safe without an extra barrier: dispatch
// call n+2 reuses call n's half only after every peer passed call n+1's barrier, i.e. finished reading
// it; combine call n stores into a peer's half (rows, cmb_arr) only after that peer signalled that it
// started call n-1 (so finished call n-2, the last reader of that half); cmb_arr[parity ^ 1] is zeroed
// at the start of call n, before this rank's signal n (csrc/combine.cu).
#pragma once
#include <stdint.h>
#include "moe_common/constants.cuh"

#define SYMM_LAYOUT_VERSION 10 // 4: state word SYMM_STATE_PULL_CTR; 5: push dispatch (meta_all, push_*, signal row 2);
                               // 6: meta_all row E = num_tokens per source, done row counted in every call;
                               // 7: meta_map (the pull reads a token's row once per owner), meta_count unclamped
                               // 8: cmb_map + cmb_in (the pull combine), combine signals = epoch * 2 + pull
                               // 9: combine signals = epoch * 4 + 2 * zeroed + pull (combine_signal)
                               // 10: push / auto dispatch removed: no meta_all, push_hist, done signal row;
                               //     push_slot renamed id_slot; no mode stamp
#define SYMM_NUM_OPS 2      // 0 = dispatch, 1 = combine
#define SYMM_OP_DISPATCH 0
#define SYMM_OP_COMBINE 1
#define SYMM_NUM_SIGNALS 2  // signal rows: one per op
#define SYMM_REGION_ALIGN 1024
#define SYMM_STATE_BYTES 256
#define SYMM_MAX_TOPK 32    // kmask is a u32
#define SYMM_META_MAX_GROUPS 256  // CTAs that take part in dispatch's one-pass metadata scan (rows of meta_scan)

// State words (byte offsets inside the state region).
#define SYMM_STATE_EPOCH 0        // u64 [SYMM_NUM_OPS]: last completed epoch per op
#define SYMM_STATE_GRID_BAR 64    // u32 [SYMM_NUM_OPS]: end-of-kernel arrival words (flip bit 31)
#define SYMM_STATE_META_BAR 72    // u32: grid barrier word of dispatch's one-pass metadata (flip bit 31)
#define SYMM_STATE_PULL_CTR 80    // u32 [2]: dispatch pull work counters, [epoch & 1] used by call epoch, the
                                  // other zeroed by that call (CTA 0, at its start; pool.cuh, csrc/dispatch.cu)
#define SYMM_STATE_ERR 128        // i32 [8]: code, rank, phase, what, detail, epoch_lo, 0, 0
#define SYMM_STATE_STAMPS 160     // u64 [12]: %globaltimer per stage of the last call (diagnostics, CTA 0 +
                                  // last CTA out): [0..5] dispatch, [6..9] combine, [10..11] unused; see csrc/*.cu

#ifdef __cplusplus
extern "C" {
#endif

typedef struct SymmLayout {
  int64_t total_bytes;
  int64_t pool_rows;  // P: capacity in rows, a multiple of block_m
  int64_t off_signals;
  int64_t off_state;
  int64_t off_meta_count;
  int64_t off_meta_slots;
  int64_t off_stage_x;
  int64_t off_stage_s;
  int64_t off_stage_w;
  int64_t off_kmask;
  int64_t off_meta_scan;
  int64_t off_cmb_hist;
  int64_t off_cmb_order;
  int64_t off_cmb_arr;
  int64_t off_src_counts;
  int64_t off_exp_counts;
  int64_t off_exp_offsets;
  int64_t off_arrivals;
  int64_t off_row_src;
  int64_t off_pool_x;
  int64_t off_pool_s;
  int64_t off_pool_w;
  int64_t off_combine;
  int64_t off_id_slot;
  int64_t off_meta_map;
  int64_t meta_count_half;  // bytes of one parity half
  int64_t meta_slots_half;
  int64_t stage_x_half;
  int64_t stage_s_half;
  int64_t stage_w_half;
  int64_t combine_half;
  int64_t cmb_arr_half;
  int64_t meta_map_half;
  int64_t off_cmb_map;
  int64_t off_cmb_in;
  int64_t cmb_in_rows;  // rows of cmb_in (0: no pull combine)
  int32_t num_ranks;
  int32_t rank;
  int32_t num_experts;
  int32_t num_local_experts;
  int32_t hidden;
  int32_t topk;
  int32_t max_tokens;
  int32_t block_m;
  int32_t max_m;       // rows per expert in the masked layout (L * max_m <= P)
  int32_t scale_cols;  // H / 128
  int32_t num_blocks;  // P / block_m (arrival counters)
  int32_t combine_chunk;  // tokens per combine chunk (push order buckets), a power of two >= 16
  int32_t num_chunks;     // C = ceil(T / combine_chunk)
  int32_t version;
} SymmLayout;

#ifdef __cplusplus
}
#endif

#if defined(__CUDACC__)
#define SYMM_LAYOUT_HD __host__ __device__ inline
#else
#define SYMM_LAYOUT_HD inline
#endif

SYMM_LAYOUT_HD int64_t symm_align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

// Shared-memory ints of the combine kernel's schedule (combine.cuh CombineSchedule::carve) for R ranks
// and C token chunks: hist [R * C], push sizes [C], segment starts [4 * C + 1] (2 * (C + lag)
// segments, lag <= C), scratch [64].
SYMM_LAYOUT_HD int64_t symm_combine_table_ints(int64_t R, int64_t C) { return R * C + C + (4 * C + 1) + 64; }

// Fills *L. Returns 0, or -1 for an invalid configuration (L is then zeroed).
// pool_rows <= 0: worst case of the contiguous layout, R*T*K + L*(block_m - 1), rounded up.
// max_m <= 0: min(R * T, P / L) (masked layout: decode, random routing); it never raises P.
// cmb_in_rows: rows of the pull combine's input region (0: none; < 0: P, every pool row).
SYMM_LAYOUT_HD int symm_layout_compute(SymmLayout* L, int num_ranks, int rank, int num_experts, int hidden,
                                       int topk, int max_tokens, int block_m, int64_t pool_rows, int max_m,
                                       int64_t cmb_in_rows) {
  char* raw = (char*)L;
  for (unsigned i = 0; i < sizeof(SymmLayout); ++i) raw[i] = 0;
  if (num_ranks < 1 || rank < 0 || rank >= num_ranks || num_experts < num_ranks || num_experts % num_ranks ||
      hidden <= 0 || hidden % MOE_SCALE_GROUP || topk < 1 || topk > SYMM_MAX_TOPK || max_tokens < 1 || block_m < 1 ||
      block_m > 4096 || pool_rows < 0 || max_m < 0)
    return -1;
  const int64_t R = num_ranks, E = num_experts, Lx = E / R, H = hidden, K = topk, T = max_tokens;
  const int64_t S = H / MOE_SCALE_GROUP;  // FP32 scales per row (moe_common/constants.cuh)
  int64_t P = pool_rows > 0 ? pool_rows : R * T * K + Lx * (block_m - 1);
  int64_t mm = max_m > 0 ? max_m : (R * T < P / Lx ? R * T : P / Lx);
  if (mm < 1) mm = 1;
  if (Lx * mm > P) P = Lx * mm;
  P = symm_align_up(P, block_m);
  const int64_t in_rows = cmb_in_rows < 0 ? P : cmb_in_rows;
  // (Lx * T: meta_map's le * T + slot entries are int32)
  // (T * K < 2^30: bit 30 of a meta_slots entry flags a fanned-out leader, metadata.cuh kSlotFanOut)
  if (P >= ((int64_t)1 << 31) || R * T * K >= ((int64_t)1 << 31) || mm >= ((int64_t)1 << 31) ||
      Lx * T >= ((int64_t)1 << 31) || T * K >= ((int64_t)1 << 30))
    return -1;
  // (cmb_map entries are row * R + owner, row < P: int32)
  if (in_rows > 0 && (P * R >= ((int64_t)1 << 31) || in_rows > P)) return -1;

  L->num_ranks = num_ranks;
  L->rank = rank;
  L->num_experts = num_experts;
  L->num_local_experts = (int32_t)Lx;
  L->hidden = hidden;
  L->topk = topk;
  L->max_tokens = max_tokens;
  L->block_m = block_m;
  L->max_m = (int32_t)mm;
  L->scale_cols = (int32_t)S;
  L->pool_rows = P;
  L->num_blocks = (int32_t)(P / block_m);
  L->version = SYMM_LAYOUT_VERSION;
  L->cmb_in_rows = in_rows;
  L->meta_count_half = symm_align_up(Lx * R * 4, 16);
  L->meta_slots_half = symm_align_up(Lx * R * T * 4, 16);
  L->stage_x_half = symm_align_up(T * H, 16);
  L->stage_s_half = symm_align_up(T * S * 4, 16);
  L->stage_w_half = symm_align_up(T * K * 4, 16);
  L->combine_half = symm_align_up(K * T * H * 2, 16);
  L->cmb_arr_half = symm_align_up(T * 4, 16);
  L->meta_map_half = symm_align_up(R * T * K * 4, 16);
  // Combine chunk: 16 tokens, doubled until the combine kernel's shared tables fit 32 KiB.
  int64_t chunk = 16;
  while (symm_combine_table_ints(R, (T + chunk - 1) / chunk) > 8192) chunk *= 2;
  L->combine_chunk = (int32_t)chunk;
  L->num_chunks = (int32_t)((T + chunk - 1) / chunk);

  int64_t off = 0;
#define SYMM_REGION(field, bytes)            \
  L->field = off;                            \
  off = symm_align_up(off + (bytes), SYMM_REGION_ALIGN);
  SYMM_REGION(off_signals, (int64_t)SYMM_NUM_SIGNALS * R * 8)
  SYMM_REGION(off_state, SYMM_STATE_BYTES)
  SYMM_REGION(off_meta_count, 2 * L->meta_count_half)
  SYMM_REGION(off_meta_slots, 2 * L->meta_slots_half)
  SYMM_REGION(off_meta_map, 2 * L->meta_map_half)
  SYMM_REGION(off_stage_x, 2 * L->stage_x_half)
  SYMM_REGION(off_stage_s, 2 * L->stage_s_half)
  SYMM_REGION(off_stage_w, 2 * L->stage_w_half)
  SYMM_REGION(off_kmask, T * 4)
  SYMM_REGION(off_meta_scan, (int64_t)SYMM_META_MAX_GROUPS * E * 4)
  SYMM_REGION(off_id_slot, T * K * 4)
  SYMM_REGION(off_cmb_map, in_rows > 0 ? T * K * 4 : 0)
  SYMM_REGION(off_cmb_hist, R * L->num_chunks * 4)
  SYMM_REGION(off_cmb_order, R * L->num_chunks * chunk * K * 4)
  SYMM_REGION(off_cmb_arr, 2 * L->cmb_arr_half)
  SYMM_REGION(off_src_counts, Lx * R * 4)
  SYMM_REGION(off_exp_counts, Lx * 4)
  SYMM_REGION(off_exp_offsets, (Lx + 1) * 4)
  SYMM_REGION(off_arrivals, (P / block_m) * 4)
  SYMM_REGION(off_row_src, P * 4)
  SYMM_REGION(off_pool_x, P * H)
  SYMM_REGION(off_pool_s, P * S * 4)
  SYMM_REGION(off_pool_w, P * 4)
  SYMM_REGION(off_combine, 2 * L->combine_half)
  SYMM_REGION(off_cmb_in, in_rows * H * 2)
#undef SYMM_REGION
  L->total_bytes = off;
  return 0;
}

#if defined(__CUDACC__)
namespace symm {
// Typed pointer into a buffer whose base is `base` (local or a peer's mapping).
template <typename T>
__host__ __device__ __forceinline__ T* at(uint64_t base, int64_t off) {
  return reinterpret_cast<T*>(base + (uint64_t)off);
}
__host__ __device__ __forceinline__ uint64_t* signals(uint64_t base, const SymmLayout& L, int op) {
  return at<uint64_t>(base, L.off_signals) + (int64_t)op * L.num_ranks;
}
__host__ __device__ __forceinline__ uint64_t* state_epoch(uint64_t base, const SymmLayout& L) {
  return at<uint64_t>(base, L.off_state + SYMM_STATE_EPOCH);
}
__host__ __device__ __forceinline__ uint32_t* state_grid_bar(uint64_t base, const SymmLayout& L, int op) {
  return at<uint32_t>(base, L.off_state + SYMM_STATE_GRID_BAR) + op;
}
__host__ __device__ __forceinline__ uint64_t* state_stamps(uint64_t base, const SymmLayout& L) {
  return at<uint64_t>(base, L.off_state + SYMM_STATE_STAMPS);
}
// The dispatch pull counter of parity p (state word, local only).
__host__ __device__ __forceinline__ uint32_t* pull_counter(uint64_t base, const SymmLayout& L, int parity) {
  return at<uint32_t>(base, L.off_state + SYMM_STATE_PULL_CTR) + parity;
}
__host__ __device__ __forceinline__ int32_t* state_err(uint64_t base, const SymmLayout& L) {
  return at<int32_t>(base, L.off_state + SYMM_STATE_ERR);
}
// meta_count[parity][le][src]
__host__ __device__ __forceinline__ int32_t* meta_count(uint64_t base, const SymmLayout& L, int parity) {
  return at<int32_t>(base, L.off_meta_count + parity * L.meta_count_half);
}
// meta_slots[parity][le][src][slot]
__host__ __device__ __forceinline__ int32_t* meta_slots(uint64_t base, const SymmLayout& L, int parity, int le,
                                                        int src) {
  return at<int32_t>(base, L.off_meta_slots + parity * L.meta_slots_half) +
         ((int64_t)le * L.num_ranks + src) * L.max_tokens;
}
__host__ __device__ __forceinline__ uint8_t* stage_x(uint64_t base, const SymmLayout& L, int parity) {
  return at<uint8_t>(base, L.off_stage_x + parity * L.stage_x_half);
}
__host__ __device__ __forceinline__ float* stage_s(uint64_t base, const SymmLayout& L, int parity) {
  return at<float>(base, L.off_stage_s + parity * L.stage_s_half);
}
__host__ __device__ __forceinline__ float* stage_w(uint64_t base, const SymmLayout& L, int parity) {
  return at<float>(base, L.off_stage_w + parity * L.stage_w_half);
}
// combine[parity][k][token][H] (BF16 as uint16)
__host__ __device__ __forceinline__ uint16_t* combine_row(uint64_t base, const SymmLayout& L, int parity, int k,
                                                          int token) {
  return at<uint16_t>(base, L.off_combine + parity * L.combine_half) +
         ((int64_t)k * L.max_tokens + token) * L.hidden;
}
// meta_map[parity][src][token * K + k] (pull dedup)
__host__ __device__ __forceinline__ int32_t* meta_map(uint64_t base, const SymmLayout& L, int parity, int src) {
  return at<int32_t>(base, L.off_meta_map + parity * L.meta_map_half) + (int64_t)src * L.max_tokens * L.topk;
}
// id_slot[token * K + k] (local: the one-pass metadata walk's slot of each id)
__host__ __device__ __forceinline__ int32_t* id_slot(uint64_t base, const SymmLayout& L) {
  return at<int32_t>(base, L.off_id_slot);
}
// cmb_hist[s][c]
__host__ __device__ __forceinline__ int32_t* cmb_hist(uint64_t base, const SymmLayout& L) {
  return at<int32_t>(base, L.off_cmb_hist);
}
// cmb_order[s][c][i], i < combine_chunk * K
__host__ __device__ __forceinline__ int32_t* cmb_bucket(uint64_t base, const SymmLayout& L, int s, int c) {
  return at<int32_t>(base, L.off_cmb_order) + ((int64_t)s * L.num_chunks + c) * L.combine_chunk * L.topk;
}
// cmb_map[token * K + k] (pull combine): row * R + owner, -1 = not sent
__host__ __device__ __forceinline__ int32_t* cmb_map(uint64_t base, const SymmLayout& L) {
  return at<int32_t>(base, L.off_cmb_map);
}
// cmb_in[row][H] (BF16 as uint16): the pull combine's input rows
__host__ __device__ __forceinline__ uint16_t* cmb_in_row(uint64_t base, const SymmLayout& L, int64_t row) {
  return at<uint16_t>(base, L.off_cmb_in) + row * L.hidden;
}
// Combine signal words (layout v9): epoch * 4 + 2 * zeroed + pull. "zeroed": the rank's cmb_arr half of
// the NEXT call is zeroed (a push call zeroes it before its one signal; in a pull call CTA 0 signals at
// its start and the last CTA zeroes, then signals again, both with red.max; pull calls do not wait for
// it). A push call c waits for >= combine_signal(c - 1, *, zeroed) (started c - 1 and zeroed); a pull
// call c waits for >= c * 4 and checks the pull bit (every rank pulls in the same call).
constexpr int kCombineSignalEpochShift = 2;  // combine_signal(e, *, *) >> kCombineSignalEpochShift == e
__host__ __device__ __forceinline__ uint64_t combine_signal(uint64_t epoch, bool pull, bool zeroed) {
  return (epoch << kCombineSignalEpochShift) + (zeroed ? 2 : 0) + (pull ? 1 : 0);
}
// The fields of a combine signal word (the waiters' decoding of combine_signal).
__host__ __device__ __forceinline__ uint64_t combine_signal_epoch(uint64_t word) {
  return word >> kCombineSignalEpochShift;
}
__host__ __device__ __forceinline__ bool combine_signal_pull(uint64_t word) { return (word & 1) != 0; }
// cmb_arr[parity][token]
__host__ __device__ __forceinline__ uint32_t* cmb_arr(uint64_t base, const SymmLayout& L, int parity) {
  return at<uint32_t>(base, L.off_cmb_arr + parity * L.cmb_arr_half);
}
}  // namespace symm
#endif
