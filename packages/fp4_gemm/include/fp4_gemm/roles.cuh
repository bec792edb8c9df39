// fp4_gemm/roles.cuh — the grouped GEMM as parts a kernel assembles (the standalone kernel in
// csrc/grouped_gemm.cu and the fused MegaMoE kernel both do):
//   Mainloop<Cfg>      its shared storage (Storage = SmemView<Cfg> over Cfg::kSmemBytes, initialised by
//                      init_pipeline), the producer role (produce) and the math role (math);
//   TileEpilogue<...>  what the math role does with a finished tile (BF16 rows, or the L1 epilogue's
//                      SwiGLU x top-k -> FP8 + scales), called by the mainloop per tile;
//   MathBarriers       the named-barrier ids the math role may use: the kernel owns the CTA's barrier list;
//   RegisterSplit      the setmaxnreg budgets of a kernel with one producer and two math warpgroups.
// The kernel owns the CTA: it assigns the threads (a 128-thread producer warpgroup, `ptid` 0..127, and
// WL::kMathThreads math threads, warpgroup `wg` 0..1 and `tid_in_wg`), the register split, the barrier
// list and the assembled shared memory (static_assert on its total); it builds the scheduler (its unit
// table by the whole CTA before the roles split, its Worker from the kernel's own CTA -> work mapping:
// no part here reads blockIdx) and passes it by value to both roles, which walk the same tile sequence. The pipeline contract between the two roles is at the top of pipeline.cuh.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>

#include "fp4_gemm/epilogue.cuh"
#include "fp4_gemm/mainloop.cuh"

namespace fp4_gemm {

// Registers per thread after setmaxnreg, for a kernel of kThreads threads: the first 128 produce, the
// rest (WL::kMathThreads) do the math. A kernel using setmaxnreg is compiled at its launch bound's
// maximum (65536 / (kThreads * CTAs per SM), in steps of 8), which is the CTA's whole allocation: the
// warpgroups' new counts must fit in it, or setmaxnreg.inc would wait forever.
template <int kThreads, int kCtasPerSm, int kProducerRegs = 40>
struct RegisterSplit {
  static_assert(kThreads == 128 + WL::kMathThreads, "one producer warpgroup and the math warpgroups");
  static constexpr int kLaunchRegs = (65536 / (kThreads * kCtasPerSm)) / 8 * 8;
  static constexpr int kProducer = kProducerRegs;
  static constexpr int kMath = ((kLaunchRegs * kThreads - kProducer * 128) / WL::kMathThreads) / 8 * 8;
  static_assert(kProducer * 128 + kMath * WL::kMathThreads <= kLaunchRegs * kThreads, "register file");
  static_assert(kMath <= 256, "setmaxnreg range");
};
static_assert(RegisterSplit<384, 1>::kMath == 232 && RegisterSplit<384, 2>::kMath == 96, "expected splits");

// Named-barrier ids the math role uses (never 0, __syncthreads): `math` for all WL::kMathThreads math
// threads (the L1 epilogue's pair exchange, the split-K arrival), `store0 + wg` for math warpgroup wg's
// 128 threads (the staged BF16 store). The kernel picks them from its one list.
struct MathBarriers {
  uint32_t math;
  uint32_t store0;
};

enum class EpilogueKind { kBF16, kL1 };

// The output of a GEMM: BF16 rows out[row][n] (kBF16), or the L1 epilogue's arguments (kL1).
struct EpilogueParams {
  __nv_bfloat16* out;
  L1Args l1;
};

// A finished tile's epilogue (the mainloop calls it with the tile and its FP32 accumulators).
template <class Cfg, EpilogueKind kKind>
struct TileEpilogue {
  static_assert(Cfg::kL1 == (kKind == EpilogueKind::kL1), "the L1 epilogue's storage and tile pairs");
  const SmemView<Cfg>& sm;
  const GroupedProblem& pb;
  const WeightOperand& w;
  const EpilogueParams& p;
  int wg, tid_in_wg;
  MathBarriers bars;

  __device__ __forceinline__ void operator()(const Tile& t, const float (&acc)[Cfg::kAccRegs], uint32_t) const {
    const float* row_scale = w.row_scale + int64_t(t.group) * pb.n;
    if constexpr (kKind == EpilogueKind::kBF16) {
      const int n0 = t.n_block * WL::kBlockRows + wg * WL::kRowsPerWarpgroup;
      if constexpr (Cfg::kStagedStore)
        store_bf16_staged<Cfg::kBlockN, Cfg::kStoreRowBytes>(acc, row_scale, p.out, pb.n, t.row0, t.rows, n0,
                                                             tid_in_wg, sm.store_tile(wg), bars.store0 + uint32_t(wg));
      else
        store_bf16<Cfg::kBlockN>(acc, row_scale, p.out, pb.n, t.row0, t.rows, n0, tid_in_wg);
    } else {
      store_l1_pair<Cfg::kBlockN, Cfg::kStagedStore, Cfg::kStoreRowBytes>(
          acc, row_scale, p.l1, pb.n, t.row0, t.rows, t.n_block, wg, tid_in_wg, sm.epilogue(), sm.l1_scales(),
          sm.stash(), sm.store_tile(0), bars.math);
    }
  }
};

// ---- split-K (scheduler.cuh): partial sums through the caller's workspace ----------------------------
// Thread tid_m's (0..255) fragment of n-block h of split-unit `slot`: float4 j at [j][tid_m] (each store
// instruction writes 256 consecutive float4s).
template <class Cfg>
__device__ __forceinline__ float* split_partial(const SplitKSpace& sk, int slot, int h, int tid_m) {
  return sk.partials + int64_t(slot) * splitk_slot_floats(Cfg::kBlockN, Cfg::kPairN) +
         h * (WL::kMathThreads * Cfg::kAccRegs) + tid_m * 4;
}

template <class Cfg>
__device__ __forceinline__ void store_partial(const SplitKSpace& sk, int slot, int h, int tid_m,
                                              const float (&acc)[Cfg::kAccRegs]) {
  static_assert(Cfg::kAccRegs % 4 == 0, "float4 fragments");
  float* p = split_partial<Cfg>(sk, slot, h, tid_m);
#pragma unroll
  for (int j = 0; j < Cfg::kAccRegs / 4; ++j)
    *reinterpret_cast<float4*>(p + j * WL::kMathThreads * 4) =
        make_float4(acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]);
}

// The unit's sum over its splits 0..splits-1 in that order (from 0: the same bits whichever CTA sums).
template <class Cfg>
__device__ __forceinline__ void sum_partials(const SplitKSpace& sk, const Tile& t, int splits, int h, int tid_m,
                                             float (&acc)[Cfg::kAccRegs]) {
  constexpr int kSlotFloats = splitk_slot_floats(Cfg::kBlockN, Cfg::kPairN);
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;
  // The unit's first split-unit (split index fastest). Two splits' loads in flight per step (one at a
  // time cost an L2 round trip per split on the last arriver's path; more spilled the 16-token kernels).
  constexpr int kVec = Cfg::kAccRegs / 4;
  const float* p = split_partial<Cfg>(sk, t.slot - t.slot % splits, h, tid_m);
  auto add = [&](const float4 (&v)[kVec]) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) acc[4 * j] += v[j].x, acc[4 * j + 1] += v[j].y, acc[4 * j + 2] += v[j].z, acc[4 * j + 3] += v[j].w;
  };
  int s = 0;
#pragma unroll 1
  for (; s + 2 <= splits; s += 2, p += 2 * kSlotFloats) {
    float4 v0[kVec], v1[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      v0[j] = ptx::ld_relaxed_gpu_v4f32(p + j * WL::kMathThreads * 4);
      v1[j] = ptx::ld_relaxed_gpu_v4f32(p + kSlotFloats + j * WL::kMathThreads * 4);
    }
    add(v0);
    add(v1);
  }
  if (s < splits) {
    float4 v0[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) v0[j] = ptx::ld_relaxed_gpu_v4f32(p + j * WL::kMathThreads * 4);
    add(v0);
  }
}

// After this CTA stored its split's partials: arrive on the unit's counter; true in every math thread iff
// this CTA was the unit's last split (it then sums and runs the epilogue). Ordering: the math barrier
// orders every math thread's partial stores before thread 0's acq_rel atomic (release, cumulative), which
// also acquires the earlier splits' partials (their CTAs' releases); the second barrier orders that
// acquire before every math thread's coherent loads (sum_partials) and publishes the flag. The last
// arriver resets the counter (no other access to it in this launch: every split arrived) for the next
// launch, or the next phase of this one after a grid barrier. The flag goes through shared memory with
// asm volatile accesses (ptx::st/ld_shared_s32): with bar.red.or (uniform by construction) ptxas dropped
// the L1 kernels' uniform datapath instead (ULEA 15 -> 0 in their math regions, 2026-12-02).
template <class Cfg>
__device__ __forceinline__ bool arrive_split(const SmemView<Cfg>& sm, const SplitKSpace& sk, const Tile& t,
                                             int splits, int tid_m, uint32_t bar_math) {
  ptx::named_barrier(bar_math, WL::kMathThreads);
  if (tid_m == 0) {
    uint32_t* const counter = sk.counters + t.slot / splits;  // the unit's
    const bool last = ptx::atom_add_acq_rel_gpu_u32(counter, 1u) == uint32_t(splits - 1);
    if (last) *counter = 0u;
    ptx::st_shared_s32(sm.split_flag(), last);
  }
  ptx::named_barrier(bar_math, WL::kMathThreads);
  // (Read before thread 0 rewrites it: that comes after the next unit's first barrier above.)
  return ptx::ld_shared_s32(sm.split_flag()) != 0;
}

template <class Cfg>
struct Mainloop {
  using Storage = SmemView<Cfg>;
  static constexpr int kSmemBytes = Cfg::kSmemBytes;
  static constexpr int kProducerThreads = Cfg::kProducerThreads;
  static constexpr int kMathThreads = WL::kMathThreads;

  // The producer role (ptid 0..127): every tile of `sched`, each unit's kPairN n-blocks in a row (a
  // split-unit: its K blocks), into the ring from iteration 0 (a fresh pipeline). Returns false on
  // timeout (reported through err).
  template <class Sched>
  static __device__ __forceinline__ bool produce(const Storage& sm, const CUtensorMap* tmap, const GroupedProblem& pb,
                                                 const WeightOperand& w, const TokenOperand& x, Sched sched, int ptid,
                                                 const ErrSink& err, uint64_t timeout_ns, uint32_t cta_rank = 0) {
    Tile t;
    uint32_t iter = 0;
    bool ok = true;
    while (ok && sched.next(t)) {
      int kb0 = 0, kbn = -1;
      if constexpr (Cfg::kSplitK) sched.k_range(t, kb0, kbn);
      for (int h = 0; h < Cfg::kPairN && ok; ++h, ++t.n_block)
        ok = produce_tile(sm, tmap, w, x, pb, t, iter, ptid, err, timeout_ns, cta_rank, kb0, kbn);
    }
    return ok;
  }

  // The math role (warpgroup wg, tid_in_wg): the same tile sequence, `epilogue(tile, acc, index)` after
  // each tile; split-K (sched.splits > 1): each split's partials to the workspace, the epilogue by the
  // unit's last split (arrive_split), all math threads of the CTA together. Returns false on timeout.
  template <class Sched, class Epi>
  static __device__ __forceinline__ bool math(const Storage& sm, const GroupedProblem& pb, const WeightOperand& w,
                                              Sched sched, int wg, int tid_in_wg, const ErrSink& err,
                                              uint64_t timeout_ns, const Epi& epilogue) {
    if constexpr (Cfg::kPath == WeightPath::kRegs) {
      return mma_stream_regs<Cfg>(sm, pb, w, sched, wg, tid_in_wg, err, timeout_ns, epilogue);
    } else {
      Tile t;
      uint32_t iter = 0;
      float acc[Cfg::kAccRegs];
      bool ok = true;
      const int tid_m = wg * 128 + tid_in_wg;
      while (ok && sched.next(t)) {
        int kb0 = 0, kbn = -1;
        if constexpr (Cfg::kSplitK) sched.k_range(t, kb0, kbn);
        const bool split = Cfg::kSplitK && sched.splits > 1;
        if constexpr (Cfg::kPairN == 1) {
          ok = mma_tile(sm, pb, wg, tid_in_wg, iter, acc, err, timeout_ns, kbn);
          if (ok) {
            if (split) store_partial<Cfg>(pb.sk, t.slot, 0, tid_m, acc);
            else epilogue(t, acc, 0);
          }
          if (ok && split && arrive_split(sm, pb.sk, t, sched.splits, tid_m, epilogue.bars.math)) {
            sum_partials<Cfg>(pb.sk, t, sched.splits, 0, tid_m, acc);
            epilogue(t, acc, 0);
          }
        } else {
          const int n_block0 = t.n_block;
          bool reducing = false;
          for (int h = 0;;) {
            t.n_block = n_block0 + h;
            if (!reducing) {
              ok = mma_tile(sm, pb, wg, tid_in_wg, iter, acc, err, timeout_ns, kbn);
              if (!ok) break;
              if (split) store_partial<Cfg>(pb.sk, t.slot, h, tid_m, acc);
            } else {
              sum_partials<Cfg>(pb.sk, t, sched.splits, h, tid_m, acc);
            }
            if (!split || reducing) epilogue(t, acc, 0);
            if (++h < Cfg::kPairN) continue;
            if (!split || reducing || !arrive_split(sm, pb.sk, t, sched.splits, tid_m, epilogue.bars.math)) break;
            reducing = true;
            h = 0;
          }
        }
      }
      return ok;
    }
  }
};

}  // namespace fp4_gemm
