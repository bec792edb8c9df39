// fp4_gemm/mainloop.cuh — the math role of the warp-specialised FP8 x FP4 mainloop (swap-AB): weights
// (decoded FP4) are the wgmma A operand from registers, tokens the B operand from shared memory. The
// pipeline contract, the configuration and the producer are in pipeline.cuh.
// The functions take all state (shared memory plan, barriers, iteration counter) from the caller,
// so a fused kernel can run them inside its own warp roles.
#pragma once
#include <cstdint>

#include "fp4_gemm/pipeline.cuh"

namespace fp4_gemm {

// Decodes the A fragments of this warpgroup's half of stage s (4 k32 steps) into a.
// Per-thread byte offsets into a warpgroup's weight sub-chunk, computed once per kernel.
struct DecodeOffsets {
  uint32_t code;   // (tid_in_wg) * 8: this thread's 8 code bytes of k32 step 0
  uint32_t shift;  // kCodeBytes + (warp * 8 + lane / 4) * 8: its 8 shift bytes
  __device__ DecodeOffsets(int wg, int tid_in_wg) {
    code = wg * WL::kWgChunkBytes + tid_in_wg * WL::kCodeBytesPerThreadStep;
    shift = wg * WL::kWgChunkBytes + WL::kCodeBytes + ((tid_in_wg / 32) * 8 + (tid_in_wg % 32) / 4) * 8;
    // Opaque: keeps them in registers instead of re-deriving them from %tid inside the loop.
    ptx::keep_in_register(code, shift);
  }
};

// One thread's packed bytes of one K block: its code words for the 4 k32 steps, its 8 shifts.
struct RawFragment {
  uint2 codes[WL::kStepsPerBlockK];
  uint2 shifts;
};

__device__ __forceinline__ void load_raw_smem(const uint8_t* chunk, const DecodeOffsets& off, RawFragment& r) {
#pragma unroll
  for (int st = 0; st < WL::kStepsPerBlockK; ++st)
    r.codes[st] = *reinterpret_cast<const uint2*>(chunk + off.code + st * 128 * WL::kCodeBytesPerThreadStep);
  r.shifts = *reinterpret_cast<const uint2*>(chunk + off.shift);
}

// Weights are immutable during the kernel: the read-only path is safe.
__device__ __forceinline__ void load_raw_global(const uint8_t* chunk, const DecodeOffsets& off, RawFragment& r) {
#pragma unroll
  for (int st = 0; st < WL::kStepsPerBlockK; ++st)
    r.codes[st] = ptx::ldg_stream_v2(chunk + off.code + st * 128 * WL::kCodeBytesPerThreadStep);
  r.shifts = ptx::ldg_stream_v2(chunk + off.shift);
}

// Decodes one K block's A fragments (4 k32 steps), the 8 shift tables looked up in the 32-entry shared
// table (decode.cuh) by (shift & 31): the byte offsets 8 * (shift & 31) of four shifts are formed at once
// (shift left by 3, keep the top 5 bits of each byte: the bits shifted in from the byte below are masked
// off), then one PRMT (zero-extended byte) and one LDS.64 per shift: ~20 instructions, no branch. (An
// arithmetic LUT with a warp vote for subnormal shifts took ~33 and a warp-uniform branch on the decode's
// critical path: 92 more instructions per K-block pair at the 16-token tile; docs/perf-notes.md.)
__device__ __forceinline__ void decode_raw(const RawFragment& r, const uint8_t* lut32,
                                           uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  constexpr int kSteps = WL::kStepsPerBlockK;
  const uint32_t off_x = (r.shifts.x << 3) & 0xF8F8F8F8u;
  const uint32_t off_y = (r.shifts.y << 3) & 0xF8F8F8F8u;
  uint2 lut[2 * kSteps];
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) {
    const uint32_t o = ptx::prmt(i < 4 ? off_x : off_y, 0u, 0x4440u | uint32_t(i % 4));
    lut[i] = *reinterpret_cast<const uint2*>(lut32 + o);
  }
#pragma unroll
  for (int st = 0; st < kSteps; ++st) decode_step(r.codes[st], lut[2 * st], lut[2 * st + 1], a[st]);
}

template <class Cfg>
__device__ __forceinline__ void decode_stage(const SmemView<Cfg>& sm, int s, const DecodeOffsets& off,
                                             uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  // All shared-memory loads first (codes do not depend on the shifts): one load latency, not two.
  RawFragment r;
  load_raw_smem(sm.weights(s), off, r);
  decode_raw(r, sm.lut32(), a);
}



// ---------------------------------------------------------------- per-K-block steps of the math loop
// Issues the 4 k32 wgmmas of stage s (fresh partial sums in `part`) and commits them as one group.
template <class Cfg>
__device__ __forceinline__ void issue_block_mma(const SmemView<Cfg>& sm, int s, const uint32_t (&a)[WL::kStepsPerBlockK][4],
                                                float (&part)[Cfg::kAccRegs]) {
  using Mma = WgmmaRS<Cfg::kBlockN>;
  const uint64_t desc = ptx::smem_desc_k128_sw128(sm.tokens(s));
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) ptx::fence_operand(part[i]);
  ptx::wgmma_fence();
#pragma unroll
  for (int st = 0; st < WL::kStepsPerBlockK; ++st) Mma::mma(part, a[st], desc + uint64_t((st * 32) >> 4), st > 0);
  ptx::wgmma_commit();
}

// This thread's token scales of stage s: scale[2j + c] for token 8j + 2(lane%4) + c.
template <class Cfg>
__device__ __forceinline__ void load_token_scales(const SmemView<Cfg>& sm, int s, uint32_t scale_off,
                                                  float (&scale)[Cfg::kBlockN / 4]) {
  const float* sc = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(sm.scales(s)) + scale_off);
  if constexpr (Cfg::kBlockN >= 16) {
#pragma unroll
    for (int v = 0; v < Cfg::kBlockN / 16; ++v) {
      const float4 f = reinterpret_cast<const float4*>(sc)[v];
      scale[4 * v] = f.x, scale[4 * v + 1] = f.y, scale[4 * v + 2] = f.z, scale[4 * v + 3] = f.w;
    }
  } else {
    const float2 f = *reinterpret_cast<const float2*>(sc);
    scale[0] = f.x, scale[1] = f.y;
  }
}

// Shared::cluster address of empty(0) in the CTA this lane releases stages of (multicast: lane r
// arrives on rank r's barriers, lanes >= kClusterN arrive nowhere). Computed once per thread.
template <class Cfg>
__device__ __forceinline__ uint32_t empty_release_addr(const SmemView<Cfg>& sm, int lane) {
  if constexpr (Cfg::kMulticast) {
    uint32_t addr = ptx::mapa_shared_cluster(sm.empty(0), uint32_t(lane % Cfg::kClusterN));
    ptx::keep_in_register(addr);
    return addr;
  } else {
    return 0;
  }
}

// retire_block = wait_block_mma + release_stage + promote: waits until at most kPending wgmma groups
// are in flight (so stage s's group is done), releases stage s to the producer(s), promotes: acc +=
// part * scale. Multicast: `empty_cl` is empty_release_addr(sm, lane); the warp arrives on empty[s]
// of every CTA of the cluster. The parts are separate so a loop can read stage s's token scales
// between the wait and the release (the kRegs loop: fewer registers live across the wait).
template <class Cfg, int kPending = 0>
__device__ __forceinline__ void wait_block_mma(const uint32_t (&a)[WL::kStepsPerBlockK][4],
                                               float (&part)[Cfg::kAccRegs]) {
  ptx::wgmma_wait<kPending>();
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) ptx::fence_operand(part[i]);
  // The wgmmas read a[] until the wait: keep it live so the next fragments get other registers.
#pragma unroll
  for (int st = 0; st < WL::kStepsPerBlockK; ++st)
#pragma unroll
    for (int r = 0; r < 4; ++r) ptx::fence_operand(const_cast<uint32_t&>(a[st][r]));
}

template <class Cfg>
__device__ __forceinline__ void release_stage(const SmemView<Cfg>& sm, int s, int lane, uint32_t empty_cl) {
  if constexpr (Cfg::kLaneRelease) {  // each thread after its own reads of stage s (pipeline.cuh)
    ptx::mbar_arrive(sm.empty(s));
    return;
  }
  // Every lane's wgmma reads (and scale reads) of stage s completed above, before lane 0 arrives.
  __syncwarp();
  if constexpr (Cfg::kMulticast) {
    // Lane r releases the stage in rank r: both producers' multicasts write into this CTA's stage.
    if (lane < Cfg::kClusterN) ptx::mbar_arrive_cluster(empty_cl + uint32_t(s) * 8u);
  } else {
    if (lane == 0) ptx::mbar_arrive(sm.empty(s));
  }
}

template <class Cfg>
__device__ __forceinline__ void promote(const float (&part)[Cfg::kAccRegs], const float (&scale)[Cfg::kBlockN / 4],
                                        float (&acc)[Cfg::kAccRegs]) {
#pragma unroll
  for (int j = 0; j < Cfg::kBlockN / 8; ++j) {
    acc[4 * j + 0] = fmaf(part[4 * j + 0], scale[2 * j], acc[4 * j + 0]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], scale[2 * j + 1], acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], scale[2 * j], acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], scale[2 * j + 1], acc[4 * j + 3]);
  }
}

template <class Cfg, int kPending = 0>
__device__ __forceinline__ void retire_block(const SmemView<Cfg>& sm, int s, int lane,
                                             const uint32_t (&a)[WL::kStepsPerBlockK][4], float (&part)[Cfg::kAccRegs],
                                             const float (&scale)[Cfg::kBlockN / 4], float (&acc)[Cfg::kAccRegs],
                                             uint32_t empty_cl = 0) {
  wait_block_mma<Cfg, kPending>(a, part);
  release_stage(sm, s, lane, empty_cl);
  promote<Cfg>(part, scale, acc);
}

template <class Cfg>
__device__ __forceinline__ bool wait_full(const SmemView<Cfg>& sm, RingPos<Cfg> pos, const ErrSink& err,
                                          uint64_t timeout_ns) {
  if (ptx::mbar_wait(sm.full(pos.stage), pos.phase, timeout_ns)) return true;
  moe::claim_error(err, Err::kTimeoutFull);
  return false;
}

template <class Cfg>
__device__ __forceinline__ uint32_t scale_offset(int lane) {
  uint32_t off = (lane % 4) * Cfg::kScaleQuadFloats * 4;
  ptx::keep_in_register(off);  // computed once
  return off;
}

// ---------------------------------------------------------------- kSmem loop (one tile)
// One math warpgroup: accumulates its 64 weight rows x kBlockN tokens of tile t into acc
// (promoted FP32: per 128-K block, fresh wgmma partial sums times the tokens' scales).
// Two K blocks in flight: block kb's wgmmas are issued before block kb-1's are waited for, so the
// tensor-core latency is off the loop's critical path (this path serves few tokens per tile, where
// each K block's MMA is short and the loop is latency-bound). Per K block:
//   issue kb (fragments decoded one block earlier, partial sums part[kb % 2])
//   wait until only kb is in flight -> release stage kb-1, promote its partial sums
//   decode kb+1 into the fragment buffer kb-1 used (free since that wait).
// Registers: two partial-sum, fragment and scale buffers (small at kBlockN <= 32). Returns false on
// timeout.
template <class Cfg>
__device__ __forceinline__ bool mma_tile(const SmemView<Cfg>& sm, const GroupedProblem& pb, int wg,
                                         int tid_in_wg, uint32_t& iter, float (&acc)[Cfg::kAccRegs],
                                         const ErrSink& err, uint64_t timeout_ns, int kbn = -1) {
  static_assert(Cfg::kPath == WeightPath::kSmem, "the kRegs path runs mma_stream_regs");
  static_assert(Cfg::kBlockN <= (Cfg::kCtasPerSm == 1 ? 64 : 32),
                "two partial-sum buffers: registers allow up to 32 tokens at two CTAs per SM, 64 at one");
  constexpr int kSteps = WL::kStepsPerBlockK;
  constexpr int kScales = Cfg::kBlockN / 4;
  int lane = tid_in_wg % 32;
  ptx::keep_in_register(lane);  // an S2R of %tid inside the loop stalled the wgmma issue
  const int k_blocks = kbn < 0 ? pb.k / Cfg::kBlockK : kbn;  // (kbn: a split's K blocks, >= 1)
  float part0[Cfg::kAccRegs], part1[Cfg::kAccRegs];
  float sc0[kScales], sc1[kScales];
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;

  const DecodeOffsets off(wg, tid_in_wg);
  const uint32_t scale_off = scale_offset<Cfg>(lane);
  uint32_t a0[kSteps][4], a1[kSteps][4];
  RingPos<Cfg> cur = RingPos<Cfg>::at(iter), prev = cur;
  if (!wait_full(sm, cur, err, timeout_ns)) return false;
  decode_stage(sm, cur.stage, off, a0);

  // Block kb: `a`, `part`, `sc` are its buffers; `a_next`, `part_prev`, `sc_prev` those of kb-1,
  // which become kb+1's fragment buffer once kb-1 is retired.
  auto kblock = [&](int kb, uint32_t (&a)[kSteps][4], uint32_t (&a_next)[kSteps][4], float (&part)[Cfg::kAccRegs],
                    float (&part_prev)[Cfg::kAccRegs], float (&sc)[kScales], float (&sc_prev)[kScales]) -> bool {
    const int s = cur.stage;
    issue_block_mma(sm, s, a, part);
    load_token_scales(sm, s, scale_off, sc);
    if (kb > 0) retire_block<Cfg, 1>(sm, prev.stage, lane, a_next, part_prev, sc_prev, acc);
    const RingPos<Cfg> nxt = cur.next();
    if (kb + 1 < k_blocks) {
      if (!wait_full(sm, nxt, err, timeout_ns)) {
        ptx::wgmma_wait<0>();
        return false;
      }
      decode_stage(sm, nxt.stage, off, a_next);
    }
    prev = cur;
    cur = nxt;
    ++iter;
    return true;
  };
  // Unrolled by two so the buffers swap roles without register moves.
  for (int kb = 0; kb < k_blocks; kb += 2) {
    if (!kblock(kb, a0, a1, part0, part1, sc0, sc1)) return false;
    if (kb + 1 < k_blocks && !kblock(kb + 1, a1, a0, part1, part0, sc1, sc0)) return false;
  }
  // The last block is still in flight.
  const int s_last = prev.stage;
  if (k_blocks & 1)
    retire_block<Cfg, 0>(sm, s_last, lane, a0, part0, sc0, acc);
  else
    retire_block<Cfg, 0>(sm, s_last, lane, a1, part1, sc1, acc);
  return true;
}

// ---------------------------------------------------------------- kRegs loop (all tiles of a CTA)
// The math warpgroup walks the flat sequence of (tile, K block) of its CTA. A second copy of the
// scheduler (the load cursor) runs three K blocks ahead of the compute cursor, across tile
// boundaries, so a tile's first fragments are in registers when its first wgmma is issued.
// Per K block: wgmmas on fragments decoded one block earlier; under them, decode the next block
// from raw bytes loaded two blocks earlier and load the raw bytes of the block after that.
// `epilogue(tile, acc, tile_index)` runs after a tile's last K block. Returns false on timeout.
// Multicast: the scheduler is the cluster's pair scheduler; dummy tiles (rows 0) are computed in
// lock-step with the partner but get no epilogue (and do not advance the epilogue's tile counter).
template <class Cfg, class Sched, class Epilogue>
__device__ __forceinline__ bool mma_stream_regs(const SmemView<Cfg>& sm, const GroupedProblem& pb,
                                                const WeightOperand& w, Sched sched,
                                                int wg, int tid_in_wg, const ErrSink& err, uint64_t timeout_ns,
                                                Epilogue&& epilogue) {
  static_assert(Cfg::kPath == WeightPath::kRegs, "the kSmem path runs mma_tile");
  constexpr int kSteps = WL::kStepsPerBlockK;
  int lane = tid_in_wg % 32;
  ptx::keep_in_register(lane);  // an S2R of %tid inside the loop stalled the wgmma issue
  const int k_blocks = pb.k / Cfg::kBlockK;
  const DecodeOffsets off(wg, tid_in_wg);
  const uint32_t scale_off = scale_offset<Cfg>(lane);
  const uint32_t empty_cl = empty_release_addr(sm, lane);

  // Load cursor: flat K blocks loaded so far (`loaded`), its tile and K block.
  // The load cursor walks without the unit table (its binary search's registers spilled inside the
  // K loop; this path serves many tokens per expert, where groups are rarely empty and steps short).
  Sched load_sched = sched;
  load_sched.table = nullptr;
  if constexpr (Cfg::kL1) sched.table = nullptr;  // the L1 kernel: the compute cursor too (12 bytes spilled)
  Tile lt;
  bool l_valid = load_sched.next(lt);
  int l_kb = 0;
  const uint8_t* l_chunk = l_valid ? tile_weights(w, pb, lt) : nullptr;
  int l_half = 0;  // n-block of the unit (Cfg::kPairN: the scheduler returns units of kPairN n-blocks)
  uint32_t loaded = 0;
  auto load_next = [&](RawFragment& r) {
    if (!l_valid) return;
    load_raw_global(l_chunk, off, r);
    ++loaded;
    l_chunk += WL::kBlockChunkBytes;
    if (++l_kb == k_blocks) {
      l_kb = 0;
      // The pair's second n-block (Cfg::kPairN == 2: its weights follow the first's), else the next unit.
      if (Cfg::kPairN == 1 || ++l_half == Cfg::kPairN) {
        l_half = 0;
        l_valid = load_sched.next(lt);
        if (l_valid) l_chunk = tile_weights(w, pb, lt);
      }
    }
  };

  Tile t;
  if (!sched.next(t)) return true;
  RawFragment r0, r1;
  uint32_t a0[kSteps][4], a1[kSteps][4];
  float acc[Cfg::kAccRegs];
#pragma unroll
  for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;
  load_next(r0);  // flat block 0
  load_next(r1);  // 1
  decode_raw(r0, sm.lut32(), a0);
  load_next(r0);  // 2

  uint32_t iter = 0;  // flat K block = ring iteration
  RingPos<Cfg> pos{0, 0};
  int kb = 0;
  uint32_t tiles = 0;
  // After a tile's last K block: its epilogue, then the next tile. Returns false at the CTA's end.
  int half = 0;  // n-block of the unit, as l_half
  auto end_tile = [&]() -> bool {
    if (!Cfg::kMulticast || t.rows > 0) epilogue(t, acc, tiles++);
#pragma unroll
    for (int i = 0; i < Cfg::kAccRegs; ++i) acc[i] = 0.f;
    kb = 0;
    if (Cfg::kPairN > 1 && ++half < Cfg::kPairN) {
      ++t.n_block;
      return true;
    }
    half = 0;
    return sched.next(t);
  };

  float part[Cfg::kAccRegs];
  // Returns 1 when the CTA's last tile is done, -1 on timeout, 0 otherwise.
  auto kblock = [&](uint32_t (&a)[kSteps][4], uint32_t (&a_next)[kSteps][4], RawFragment& r_next) -> int {
    const int s = pos.stage;
    if (!wait_full(sm, pos, err, timeout_ns)) return -1;
    issue_block_mma(sm, s, a, part);
    if (iter + 1 < loaded) {      // the next flat block exists: its raw bytes are in r_next
      decode_raw(r_next, sm.lut32(), a_next);
      load_next(r_next);          // flat block iter + 3
    }
    // The scales are needed only by the promotion: read after the wgmma wait (the decode does not
    // wait for them, and a[]'s 16 registers are free by then: the 128-token loop spilled with the
    // scales live across the wait) and before the stage is released.
    wait_block_mma<Cfg>(a, part);
    float scale[Cfg::kBlockN / 4];
    load_token_scales(sm, s, scale_off, scale);
    release_stage(sm, s, lane, empty_cl);
    promote<Cfg>(part, scale, acc);
    ++iter;
    pos = pos.next();
    if (++kb == k_blocks && !end_tile()) return 1;
    return 0;
  };
  // Unrolled by two so the fragment and raw buffers swap roles without register moves.
  for (;;) {
    int rc = kblock(a0, a1, r1);
    if (rc == 0) rc = kblock(a1, a0, r0);
    if (rc != 0) return rc > 0;
  }
}

}  // namespace fp4_gemm
