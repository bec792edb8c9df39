// symm_comm/metadata.cuh — dispatch phase A metadata: for every expert e, the source writes into the
// OWNER of e (rank e / L) the count and the slots of (local expert, this source): slot j holds the
// flat id (token * K + k) of the j-th id routed to e in row-major (token, k) order. The pool order,
// and so every row the tests check, follows from that order; all three variants below produce the
// same slots, counts and errors:
//   push_metadata_warp    (N = T * K <= kMetaWarpMaxIds): one warp per expert, one pass over all ids;
//   push_metadata_onepass (larger N): one warp per group, one pass over the group's OWN token range,
//                         a cross-group prefix per expert through the meta_scan region (the default);
//   push_metadata         (larger N, when one count per expert does not fit shared memory: E > 40960,
//                         csrc/dispatch.cu kMaxMetaSmem): the older two-pass scan of ALL ids per expert.
// (The push / auto dispatch kinds, which also kept a local slot map and sent every count to every
// rank, were removed in layout v10: measured slower than the dedup pull, docs/perf-notes-symm_comm.md.)
#pragma once
#include <stdint.h>
#include "symm_comm/barrier.cuh"
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

// Shared-memory ints of the one-pass metadata (host and device): one running count per expert.
SYMM_LAYOUT_HD int64_t symm_meta_smem_ints(const SymmLayout* L) { return L->num_experts; }
namespace symm {
// Largest N = T * K ids of the small-T metadata scan (push_metadata_warp); its ids sit in shared memory.
constexpr int64_t kMetaWarpMaxIds = 2048;
}  // namespace symm

#if defined(__CUDACC__)
namespace symm {

struct DispatchArgs {
  const void* x;         // FP8 [T, H] contiguous (16-byte aligned)
  const float* scales;   // FP32 [T, H / 128] contiguous
  const void* topk_idx;  // int32 or int64 [T, K] contiguous
  const float* topk_w;   // FP32 [T, K] contiguous (may be null: weights 0... staged as 0)
  int32_t num_tokens;    // T of this rank, <= L.max_tokens
  int32_t masked;        // 0 contiguous, 1 masked pool layout
  int32_t parity;        // epoch & 1
  int32_t small_dedup;   // small T (push_metadata_warp): send the dedup encoding (K dividing 32) instead of
                         // plain ids (either is decoded by both pull kernels)
};

template <typename IdxT>
__device__ __forceinline__ int64_t load_idx(const void* p, int64_t i) {
  return (int64_t)__ldg(reinterpret_cast<const IdxT*>(p) + i);
}

// Reports a slot overflow; returns the count to publish into the owner's meta_count: the RAW total
// (v7: the owner clamps it to max_tokens and, seeing a total above, turns the pull dedup off for the
// call, pool.cuh build_pool_tables; slots >= max_tokens are never stored).
__device__ __forceinline__ int32_t checked_count(const SymmLayout& L, int e, int32_t total, const ErrSink& err) {
  if (total > L.max_tokens) report_error(err, SYMM_ERR_SLOT_OVERFLOW, SYMM_PHASE_DISPATCH_SCAN, e, total);
  return total;
}

// ---- pull dedup (layout v7) ----------------------------------------------------------------------
// A token whose ks route to several experts of ONE owner crosses NVLink once: its LEADER at that
// owner (the lowest such k) is pulled, and the pull stores the row into every pool row of the token's
// ks there (dispatch.cuh pull_rows). At 2 ranks, top-8 of 256 experts, that is ~4 rows per read.
// For a valid id i = token * K + k routed to expert e (owner d, local le) with slot `slot`, the source
// stores into d (plain peer stores, published by the one-hop barrier like the rest of phase A):
//   meta_slots[le][src][slot] = i                  a leader with no other k at d (pulled, one pool row)
//                             = i | kSlotFanOut    a leader with others: meta_map[src][i] = mask of the
//                                                  token's HIGHER ks routed to d (pulled, fanned out)
//                             = ~i (negative)      a non-leader: meta_map[src][i] = le * T + slot
//                                                  (stored by its leader, skipped by the pull)
// Every entry the owner reads was written in this call: the leader reads meta_map only at the ks of
// its mask, and the mask, like the entries, comes from this call's ids. The one-pass metadata
// (T * K > kMetaWarpMaxIds) sends this; the small-T path sends plain ids (every row pulls itself)
// unless DispatchArgs::small_dedup (default 1; K dividing 32: owner masks by a lane match
// over the ids in shared memory). Measured earlier at 128 tokens: dedup moved 4x fewer link bytes in
// the same time while the metadata's serialised loads held the critical path (perf notes).
constexpr int32_t kSlotFanOut = 1 << 30;  // ids < 2^30 (symm_layout_compute)

// Bit k set: topk_idx[tok, k] is a valid id whose owner is d (ids cached: the caller just read them).
template <typename IdxT>
__device__ __forceinline__ uint32_t owner_kmask(const SymmLayout& L, const void* topk_idx, int64_t tok, int d) {
  constexpr int kBatch = 8;
  const int K = L.topk, E = L.num_experts, Lx = L.num_local_experts;
  uint32_t m = 0;
  for (int k0 = 0; k0 < K; k0 += kBatch) {
    int64_t e[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) e[u] = k0 + u < K ? load_idx<IdxT>(topk_idx, tok * K + k0 + u) : -1;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (e[u] >= 0 && e[u] < E && e[u] / Lx == d) m |= 1u << (k0 + u);
  }
  return m;
}

// Stores id i's (= token * K + k, expert e, slot < max_tokens) slot entry and meta_map entry into e's
// owner, given km = the token's ks owned there (owner_kmask, or the lane match of meta_walk).
__device__ __forceinline__ void store_slot_entry(const SymmLayout& L, const uint64_t* peers, const DispatchArgs& a,
                                                 int e, int64_t i, int k, uint32_t km, int32_t slot) {
  const int Lx = L.num_local_experts, d = e / Lx, le = e % Lx;
  const bool leader = (km & ((1u << k) - 1u)) == 0;     // k <= 31
  const uint32_t higher = km & ~(0xFFFFFFFFu >> (31 - k));  // the token's ks above k at d
  meta_slots(peers[d], L, a.parity, le, L.rank)[slot] =
      !leader ? ~(int32_t)i : (higher ? ((int32_t)i | kSlotFanOut) : (int32_t)i);
  if (!leader || higher) meta_map(peers[d], L, a.parity, L.rank)[i] = leader ? (int32_t)higher : le * L.max_tokens + slot;
}

// The same for any K: the owner mask from the token's K ids (L1 loads).
template <typename IdxT>
__device__ __forceinline__ void send_slot(const SymmLayout& L, const uint64_t* peers, const DispatchArgs& a, int e,
                                          int64_t i, int32_t slot) {
  const int K = L.topk;
  const int64_t tok = i / K;
  const int k = (int)(i - tok * K);
  store_slot_entry(L, peers, a, e, i, k, owner_kmask<IdxT>(L, a.topk_idx, tok, e / L.num_local_experts), slot);
}

// K dividing 32, ids walked 32 per warp step from a multiple of 32 (flat id = token * K + k): lane l
// holds k = l % K of the step's token l / K, so the ks of a lane's token whose expert lives on the
// same owner as the lane's own id are one __match_any_sync on (token-in-step, owner): no id reloads,
// no division per k. Used by the small-T scan (push_metadata_warp) and the one-pass walk (meta_walk).
struct LaneTokens {
  int kshift;      // log2 K
  int tk, kl;      // this lane's token in the step, its k
  uint32_t kbits;  // K low bits
  __device__ __forceinline__ LaneTokens(int K, int lane) {
    kshift = __ffs(K) - 1;
    tk = lane >> kshift;
    kl = lane & (K - 1);
    kbits = K >= 32 ? 0xFFFFFFFFu : ((1u << K) - 1u);
  }
  // All lanes call it (warp-synchronous). e: this lane's expert (< 0: none, matches no other lane).
  // Returns bit k set for every k of the lane's token routed to e's owner (meaningless for e < 0).
  __device__ __forceinline__ uint32_t owner_mask(int32_t e, int Lx, int lane) const {
    const uint32_t key = e >= 0 ? (((uint32_t)tk << 24) | (uint32_t)(e / Lx)) : (0x80000000u | (uint32_t)lane);
    return (__match_any_sync(0xffffffffu, key) >> (tk << kshift)) & kbits;
  }
};

// Bit u of the result: id base + 32u + lane lies in [base, end) and routes to expert e. One batch of
// loads, shared by the count pass and the slot pass of push_metadata; base < end.
// Every load is unconditional (index clamped to end - 1) into its own register, so the U loads issue back
// to back: one latency per batch. Written as `m[u] = i < end && load(i) == e`, ptxas serialised them
// (each compare before the next load, one register reused): U dependent round trips per batch, 9 us of
// the 128-token dispatch's phase A on 2 x H200 (per-CTA stamps, perf notes "Metadata loads").
template <int U, typename IdxT>
__device__ __forceinline__ uint32_t match_ids(const void* topk_idx, int64_t base, int64_t end, int e, int lane) {
  static_assert(U <= 32, "the batch's matches are packed into one 32-bit word");
  IdxT v[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + u * 32 + lane;
    v[u] = __ldg(reinterpret_cast<const IdxT*>(topk_idx) + (i < end ? i : end - 1));
  }
  uint32_t bits = 0;
#pragma unroll
  for (int u = 0; u < U; ++u) bits |= (uint32_t)(base + u * 32 + lane < end && (int64_t)v[u] == e) << u;
  return bits;
}

// Writes the slots of expert e's ids in [beg, end), in row-major order from slot `run` on (a warp
// walks 32 * U ids per step; the running ballot count is the slot); returns run + their number.
// Slots at or past L.max_tokens are not written (the caller reports the overflow via checked_count).
// The slots go to the owner as plain ids (no dedup here, kSlotFanOut).
template <int U, typename IdxT>
__device__ __forceinline__ int32_t write_slots(const SymmLayout& L, const uint64_t* peers, const DispatchArgs& a,
                                               int64_t beg, int64_t end, int e, int lane, int32_t run) {
  static_assert(U <= 32, "the batch's matches are packed into one 32-bit word");
  const void* topk_idx = a.topk_idx;
  const uint32_t lt = (1u << lane) - 1u;
  int32_t* slots = meta_slots(peers[e / L.num_local_experts], L, a.parity, e % L.num_local_experts, L.rank);
#pragma unroll 1
  for (int64_t base = beg; base < end; base += 32 * U) {
    const uint32_t bits = match_ids<U, IdxT>(topk_idx, base, end, e, lane);  // the U loads in flight together
    // The slot stores rolled: one copy of the body (pool.cuh "Code size"); the loads above stay batched.
#pragma unroll 1
    for (int u = 0; u < U; ++u) {
      const bool mu = (bits >> u) & 1u;
      const uint32_t b = __ballot_sync(0xffffffffu, mu);
      const int32_t slot = run + __popc(b & lt);
      // plain ids (write_slots serves the two-pass fallback only; no kSlotFanOut there)
      if (mu && slot < L.max_tokens) slots[slot] = (int32_t)(base + u * 32 + lane);
      run += __popc(b);
    }
  }
  return run;
}

// Two-pass metadata push (the fallback when the one-pass counts do not fit shared memory). Group g
// handles global experts e = g, g + ngroups, ...: a two-pass ballot scan over the flattened [T * K]
// ids (warp w owns a contiguous chunk) gives every match its slot in row-major order. Reads all T * K ids twice per expert: 134 MB of L2 reads at
// T 4096, E 256 (int64 ids), the reason for push_metadata_onepass.
// scratch: >= nwarps + 1 ints of shared memory private to the group.
template <typename IdxT>
__device__ __forceinline__ void push_metadata(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                              const DispatchArgs& a, int32_t* scratch, const ErrSink& err) {
  constexpr int U = 16;  // ids loaded per lane per step: a warp's chunk is 2048 ids at T = 4096, K = 8
  const int64_t N = (int64_t)a.num_tokens * L.topk;
  const int Lx = L.num_local_experts;
  const int64_t chunk = ((N + W.nwarps - 1) / W.nwarps + 31) / 32 * 32;
  const int64_t beg = W.warp * chunk, end = beg + chunk < N ? beg + chunk : N;
  for (int e = W.group; e < L.num_experts; e += W.ngroups) {
    const int owner = e / Lx, le = e % Lx;
    // pass 1: count
    int32_t cnt = 0;
    for (int64_t base = beg; base < end; base += 32 * U) {
      const uint32_t bits = match_ids<U, IdxT>(a.topk_idx, base, end, e, W.lane);
#pragma unroll
      for (int u = 0; u < U; ++u) cnt += __popc(__ballot_sync(0xffffffffu, (bits >> u) & 1u));
    }
    if (W.lane == 0) scratch[W.warp] = cnt;
    W.sync();
    if (W.tid() == 0) {
      int32_t acc = 0;
      for (int w = 0; w < W.nwarps; ++w) {
        const int32_t c = scratch[w];
        scratch[w] = acc;
        acc += c;
      }
      scratch[W.nwarps] = acc;
    }
    W.sync();
    // pass 2: slots (peer stores)
    const int32_t total = scratch[W.nwarps];
    if (cnt > 0) write_slots<U, IdxT>(L, peers, a, beg, end, e, W.lane, scratch[W.warp]);
    if (W.tid() == 0) meta_count(peers[owner], L, a.parity)[le * L.num_ranks + L.rank] = checked_count(L, e, total, err);
    W.sync();  // scratch reuse
  }
}

// Small inputs (N = T * K ids <= kMetaWarpMaxIds): ONE warp per expert scans all N ids in one pass
// (the running ballot count is the slot, no second pass, no group barrier, no cross-warp scan). It
// sends plain ids, or with DispatchArgs::small_dedup (K dividing 32, N > kPlainPullMaxIds) the dedup
// encoding (owner masks by a lane match, as meta_walk).
// Warps: all warps of the grid (W.gwarp()). The ids are first copied into shared memory `ids` (>=
// kMetaWarpMaxIds ints, free in phase A) by every thread of each group that has an expert, as int32
// (invalid -> -1): one global latency per group instead of one per warp and batch. (Scanning global
// memory per warp cost 9 us at 128 tokens with serialised loads and still 6.5 us batched, per-CTA
// stamps on 2 x H200: perf notes "Metadata loads".) All threads of the group must call it.
// (kMetaWarpMaxIds: above, with the host-side sizes)
// With small_dedup: the owners' plain pull kernel (which ignores the fan-out) runs up to this many ids
// of their own (csrc/dispatch.cu), and sources with no more ids than this send plain ids.
constexpr int64_t kPlainPullMaxIds = 256;
// Experts go to warps CTA-major (expert e -> group
// e % ngroups, warp e / ngroups), 1-2 per SM at 256 experts on 132 CTAs, instead of 16 per CTA in the
// first 16 CTAs. Why: all 16 warps of a metadata CTA scan every id in lock step, so that SM's issue
// slots, not one warp's latency, set the scan's ~4.5 us at 128 tokens (the scan did not shrink with
// 4 ids per lane, a warm instruction cache or local stores: perf notes). Measured: 128-token dispatch
// -0.8 us against the packed order (experts on the first CTAs' warps; 2 x H200, same lease).
template <typename IdxT>
__device__ __forceinline__ void push_metadata_warp(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                   const DispatchArgs& a, int32_t* ids, const ErrSink& err) {
  const int N = a.num_tokens * L.topk;  // <= kMetaWarpMaxIds
  const int E = L.num_experts, Lx = L.num_local_experts;
  // This warp's first expert; group-uniform exit when the group has none.
  const int64_t first = (int64_t)W.warp * W.ngroups + W.group;
  if (W.group >= E) return;
#pragma unroll 4
  for (int i = W.tid(); i < N; i += W.nthreads()) {
    const int64_t e = load_idx<IdxT>(a.topk_idx, i);
    ids[i] = (e >= 0 && e < E) ? (int32_t)e : -1;  // invalid ids (-1, out of range: reported by kmask) skip
  }
  W.sync();
  const uint32_t lt = (1u << W.lane) - 1u;
  const int K = L.topk;
  const bool dedup = a.small_dedup && (32 % K) == 0 && N > kPlainPullMaxIds;
  const LaneTokens lt_tok(K, W.lane);  // used when dedup (K divides 32)
  for (int64_t ew = first; ew < E; ew += W.total_warps()) {
    const int e = (int)ew, owner = e / Lx, le = e % Lx;
    int32_t* slots = meta_slots(peers[owner], L, a.parity, le, L.rank);
    int32_t run = 0;
#pragma unroll 4
    for (int base = 0; base < N; base += 32) {
      const int i = base + W.lane;
      const int32_t ei = i < N ? ids[i] : -1;
      const bool m = ei == e;
      const uint32_t b = __ballot_sync(0xffffffffu, m);
      if (b == 0u) continue;  // warp-uniform
      const int32_t slot = run + __popc(b & lt);
      if (dedup) {
        // The step's 32 ids are 32 / K whole tokens (base is a multiple of 32, K divides 32): a token's
        // owner mask is one lane match on (token-in-step, owner), as in meta_walk.
        const uint32_t km = lt_tok.owner_mask(ei, Lx, W.lane);
        if (m && slot < L.max_tokens) store_slot_entry(L, peers, a, e, i, lt_tok.kl, km, slot);
      } else if (m && slot < L.max_tokens) {
        slots[slot] = i;
      }
      run += __popc(b);
    }
    if (W.lane == 0) meta_count(peers[owner], L, a.parity)[le * L.num_ranks + L.rank] = checked_count(L, e, run, err);
  }
}

// ---- one pass per group over its own token range --------------------------------------------------
// Groups g < G = min(ngroups, SYMM_META_MAX_GROUPS) own the tokens [g * tpg, (g + 1) * tpg) (tpg =
// ceil(T / G)): contiguous flat-id ranges, ascending in g. For a flat id i of group g routed to e:
//   slot(i) = #{i' < i : id[i'] == e} = pre[g][e] + #{i' in g's range, i' < i : id[i'] == e},
//   pre[g][e] = sum_{g' < g} count[g'][e].
// Steps (ONE warp per group; the group's other warps stage the inputs meanwhile):
//   1. count: walk the range, run[e] = count[g][e] (shared memory);       -> meta_scan[g][e]
//   2. grid barrier (gpu scope, local data only)
//   3. column scan: group g owns experts e = g, g + G, ...: meta_scan[.][e] -> exclusive prefix in place
//      (only the column's owner touches it between the barriers); the total -> the owner rank's
//      meta_count (slot overflow reported here)
//   4. grid barrier; run[e] = meta_scan[g][e] = pre[g][e]
//   5. walk the range again: slot = run[e] + rank among this step's lanes with the same e (match.any,
//      lanes in id order); run[e] += their number; slots stored into the owner rank (peer stores).
// L2 traffic: 2 x N ids + 3 x G x E ints (~0.9 MB at T 4096, E 256, G 132) instead of 2 x E x N ids.
// Peer stores (meta_slots, meta_count) are ordered before the owner's reads by the dispatch's one-hop
// cross-rank barrier (bar.sync + the CTA's red.release.sys arrival there), as in the other variants.
constexpr int kMetaWalkBatch = 8;  // ids loaded per lane per batch: 256 per warp = one group's range at T 4096

// Walks flat ids [beg, end) in order, 32 consecutive ids per step (lane l = id base + l). For each valid
// id (0 <= e < E) routed to e: slot = run[e] + #(lower lanes of the step with the same e); then run[e]
// += #(lanes with e). kSlots: store the slot into the owner (< max_tokens; overflow is reported by the
// column scan). run: shared memory private to this warp.
template <typename IdxT, bool kSlots>
__device__ __forceinline__ void meta_walk(const SymmLayout& L, const uint64_t* peers, const DispatchArgs& a,
                                          int64_t beg, int64_t end, int32_t* run, int lane) {
  const int E = L.num_experts, K = L.topk, Lx = L.num_local_experts;
  const uint32_t lt = (1u << lane) - 1u;
  // K divides 32 (top-1/2/4/8/16/32): every step's 32 ids are 32 / K whole tokens (beg = t0 * K, steps of
  // 32), lane l holding k = l % K of token-in-step l / K, so a token's owner mask is one __match_any_sync
  // on (token-in-step, owner): no id loads, no division, sent from inside the walk. Other K: the rolled
  // send loop below (owner_kmask's loads).
  const bool lane_tokens = kSlots && (32 % K) == 0;
  const LaneTokens lt_tok(K, lane);  // used when lane_tokens
  for (int64_t base = beg; base < end; base += 32 * kMetaWalkBatch) {
    int32_t ev[kMetaWalkBatch];
#pragma unroll
    for (int u = 0; u < kMetaWalkBatch; ++u) {
      const int64_t i = base + u * 32 + lane;
      const int64_t e = i < end ? load_idx<IdxT>(a.topk_idx, i) : -1;
      ev[u] = (e >= 0 && e < E) ? (int32_t)e : -1;  // invalid ids (-1, out of range: reported by kmask) skip
    }
    // Rolled (pool.cuh "Code size": 8 inlined copies of the step were ~1000 SASS instructions that run
    // once per call): the batch shifts down one register per step instead of being indexed.
#pragma unroll 1
    for (int u = 0; u < kMetaWalkBatch; ++u) {
      const int32_t e = ev[0];
#pragma unroll
      for (int v = 0; v + 1 < kMetaWalkBatch; ++v) ev[v] = ev[v + 1];
      const uint32_t same = __match_any_sync(0xffffffffu, e);
      const int32_t before = e >= 0 ? run[e] : 0;
      __syncwarp();  // every lane read run[e] before the step's leader updates it
      if (e >= 0 && (same & lt) == 0) run[e] = before + __popc(same);
      __syncwarp();  // the update is visible to the next step
      const int32_t slot = before + __popc(same & lt);
      if (lane_tokens) {
        const uint32_t km = lt_tok.owner_mask(e, Lx, lane);  // my token's ks with my owner
        if (e >= 0 && slot < L.max_tokens) store_slot_entry(L, peers, a, e, base + u * 32 + lane, lt_tok.kl, km, slot);
      } else if (kSlots && e >= 0) {
        // local slot map: the input of the sends below
        id_slot(peers[L.rank], L)[base + u * 32 + lane] = slot;
      }
    }
    // The sends for other K, NOT unrolled (inlined in each unrolled step, send_slot made the kernel 3x
    // larger and phase A 5x slower, perf notes "Pull dedup"): id reloaded (L1), slot from id_slot
    // (this thread's own store above).
    if (kSlots && !lane_tokens) {
#pragma unroll 1
      for (int u = 0; u < kMetaWalkBatch; ++u) {
        const int64_t i = base + u * 32 + lane;
        const int64_t e = i < end ? load_idx<IdxT>(a.topk_idx, i) : -1;
        if (e < 0 || e >= E) continue;
        const int32_t slot = id_slot(peers[L.rank], L)[i];
        if (slot < L.max_tokens) send_slot<IdxT>(L, peers, a, (int)e, i, slot);
      }
    }
  }
}

// Step 3 for column e: exclusive prefix over groups g' < G of meta_scan[g'][e], in place; returns the
// total (all lanes). Values were written by other CTAs before the barrier: ld.relaxed.gpu (never a
// stale L1 line), after this lane's own acquire in warp_grid_barrier_gpu.
__device__ __forceinline__ int32_t meta_column_scan(int32_t* col, int64_t stride, int G, int lane) {
  constexpr int kRegs = SYMM_META_MAX_GROUPS / 32;
  int32_t v[kRegs];
#pragma unroll
  for (int u = 0; u < kRegs; ++u) {
    const int g = u * 32 + lane;
    v[u] = g < G ? ptx::ld_relaxed_gpu_s32(col + g * stride) : 0;
  }
  int32_t carry = 0;
#pragma unroll 1  // rolled, the values shift down one register per step (see meta_walk)
  for (int u = 0; u < kRegs; ++u) {
    const int32_t x = v[0];
#pragma unroll
    for (int w = 0; w + 1 < kRegs; ++w) v[w] = v[w + 1];
    const int32_t incl = warp_inclusive_scan(x, lane);
    const int g = u * 32 + lane;
    if (g < G) col[g * stride] = carry + incl - x;
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  return carry;
}

// The one-pass metadata push, run by ONE warp (W.lane) of each group g = W.group < G; G must be the same
// in every participating group. run: num_experts ints of shared memory private to the warp. Returns
// false (timeout reported, phase DISPATCH_GRID) if a grid barrier timed out; the caller must then not
// signal the rank barrier (the peers then time out instead of reading incomplete metadata).
template <typename IdxT>
__device__ __forceinline__ bool push_metadata_onepass(const Workers& W, const SymmLayout& L, const uint64_t* peers,
                                                      uint64_t local, const DispatchArgs& a, int G, int32_t* run,
                                                      uint64_t deadline, const ErrSink& err) {
  const int E = L.num_experts, K = L.topk, Lx = L.num_local_experts, g = W.group, lane = W.lane;
  const int64_t T = a.num_tokens;
  const int64_t tpg = (T + G - 1) / G;
  const int64_t t0 = g * tpg < T ? g * tpg : T, t1 = t0 + tpg < T ? t0 + tpg : T;
  int32_t* scan = at<int32_t>(local, L.off_meta_scan);  // [SYMM_META_MAX_GROUPS][E]
  uint32_t* bar = at<uint32_t>(local, L.off_state + SYMM_STATE_META_BAR);

  // 1. counts of this group's range
  for (int e = lane; e < E; e += 32) run[e] = 0;
  __syncwarp();
  meta_walk<IdxT, false>(L, peers, a, t0 * K, t1 * K, run, lane);
  for (int e = lane; e < E; e += 32) scan[(int64_t)g * E + e] = run[e];
  // 2.
  if (!warp_grid_barrier_gpu(bar, g == 0, (uint32_t)G, lane, deadline, err, SYMM_PHASE_DISPATCH_GRID)) return false;
  // 3. column scans of the experts this group owns
  for (int e = g; e < E; e += G) {
    const int32_t total = meta_column_scan(scan + e, E, G, lane);
    if (lane == 0) meta_count(peers[e / Lx], L, a.parity)[(e % Lx) * L.num_ranks + L.rank] = checked_count(L, e, total, err);
  }
  // 4.
  if (!warp_grid_barrier_gpu(bar, g == 0, (uint32_t)G, lane, deadline, err, SYMM_PHASE_DISPATCH_GRID)) return false;
  for (int e = lane; e < E; e += 32) run[e] = ptx::ld_relaxed_gpu_s32(scan + (int64_t)g * E + e);
  __syncwarp();
  // 5. slots
  meta_walk<IdxT, true>(L, peers, a, t0 * K, t1 * K, run, lane);
  return true;
}

}  // namespace symm
#endif
