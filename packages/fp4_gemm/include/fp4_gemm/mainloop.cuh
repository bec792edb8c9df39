// Warp-specialised FP8 x FP4 mainloop (swap-AB): weights (decoded FP4) are the wgmma A operand
// from registers, tokens the B operand from shared memory.
//
// Pipeline contract (one ring of kNumStages stages, each = token tile + weight chunk + token scales):
//  - full[s]  : 1 arrive.expect_tx by producer thread 0 (TMA + bulk bytes) and one cp.async
//               arrive (.noinc) per producer thread (kProducerThreads), each once its own token
//               scale copies landed                                                 -> kFullArrivals.
//  - empty[s] : one arrive per math warp once that warp no longer reads stage s (after a
//               wgmma.wait_group that covers the stage's wgmmas, so the tensor cores are done
//               reading the token tile, and after its scale and weight loads from the stage).
// Iteration i of the ring uses stage i % kNumStages with phase parity (i / kNumStages) & 1; the
// producer waits on empty with the opposite parity (a fresh barrier counts as released).
//
// Token-tile multicast (MainloopConfig::kMulticast, 2-CTA cluster; kRegs path only). The two CTAs
// of a cluster run the same token tile with adjacent weight n-blocks, in lock-step (scheduler.cuh:
// same tile sequence, same K, so the same ring iteration i is the same token tile and K block in
// both CTAs). Contract, per stage s and iteration i:
//  - Loads: the producer of rank r TMA-loads token rows 64r .. 64r+63 (kTmaBoxRows) into
//    tokens(s) + r * kTmaBoxBytes of BOTH CTAs (multicast mask 0b11); each destination's full[s]
//    (same CTA-relative offset) gets complete_tx of those bytes. So each CTA's full[s] receives
//    kTokenTileBytes of complete_tx, half from each rank; each producer arms only its own full[s]
//    (arrive.expect_tx of the whole tile + its weight bytes) and copies only its own scales.
//    The peer's complete_tx may reach full[s] before the local expect_tx: the tx-count goes
//    negative for a while, but the phase cannot complete before the local producer's arrivals
//    (kFullArrivals pending), and the expect_tx arrival adds the bytes atomically with its arrive.
//    It cannot land in the previous phase: the peer issues iteration i only after this CTA's math
//    warps released iteration i - kNumStages (below), i.e. after they saw that phase complete.
//  - empty[s] counts kEmptyArrivals = 8 warps x 2 CTAs: each math warp, after the wgmma.wait_group
//    covering stage s (tensor-core reads of its tokens done) and its scale loads, arrives on the
//    empty[s] of BOTH CTAs (lane r -> rank r: mbarrier.arrive on the mapa shared::cluster address).
//    A producer thus issues its multicast into stage s, which writes into both CTAs, only once the
//    math warps of both CTAs are done with it. Scopes as in CUTLASS's sm90 multicast pipelines:
//    the arrive (local or remote) is release.cta and the producer's wait acquire.cta. Only a
//    write-after-read order crosses the CTAs here (the warp's shared-memory reads of stage s are
//    complete at its wgmma.wait_group / before its arrive is issued; the peer's TMA writes come
//    after the peer observed the arrive); no data is published through empty[s]. Cluster scope
//    would cost MEMBAR.ALL.GPU per arrive and CCTL.IVALL (L1 flush: the scale rows' L1 lines)
//    per wait (both seen in the SASS). The math warps' full[s] wait stays acquire.cta (TMA
//    complete_tx makes the bytes visible, as without clusters).
//  - Start: barrier.cluster arrive.release / wait.acquire by all threads of both CTAs after the
//    mbarrier init (+ fence.mbarrier_init.release.cluster), before any TMA or remote arrive: no
//    complete_tx or arrive reaches an uninitialised barrier of the peer.
//  - Exit: the same cluster barrier after every role finished (also after a timeout): no CTA exits
//    while the peer may still arrive on its empty barriers. Multicast writes into a CTA are all
//    counted by its own full barriers, which its math warps waited for (or timed out on).
//  - Errors: every mbarrier wait keeps its time limit; a CTA that stops (timeout) stops arriving,
//    so the partner's waits time out too (<= the host's timeout each, at most a few in sequence)
//    and both reach the exit cluster barrier: an error is reported, nothing hangs.
// The functions take all state (shared memory plan, barriers, iteration counter) from the caller,
// so a fused kernel can run them inside its own warp roles.
#pragma once
#include <cstdint>
#include <cuda.h>

#include "fp4_gemm/decode.cuh"
#include "fp4_gemm/errors.cuh"
#include "fp4_gemm/layout.cuh"
#include "fp4_gemm/ptx.cuh"
#include "fp4_gemm/scheduler.cuh"
#include "fp4_gemm/wgmma.cuh"

namespace fp4_gemm {

constexpr int kMathThreads = WL::kMathThreads;

// Where the math warps read the packed weights from:
//  - kSmem: the producer bulk-copies each K block's chunk into the stage; the math warps decode it
//    from shared memory. Best when the loop is short (few tokens): many stages keep HBM busy.
//  - kRegs: each math thread loads its own fragment's bytes straight from global memory into
//    registers, two K blocks ahead (the producer only warms L2). The shared-memory port is then
//    left to the tensor cores' token reads, which otherwise delay the decode's loads (the main
//    stall of the kSmem loop at 128 tokens per tile).
// (A third path, the producer warpgroup decoding into swizzled E4M3 tiles for shared-memory
// wgmmas, measured slower at 128 tokens per tile: 496 vs 675 TFLOPS; docs/perf-notes.md.)
enum class WeightPath { kSmem, kRegs };

template <int kBlockN_, int kNumStages_, WeightPath kPath_ = WeightPath::kSmem, int kCtasPerSm_ = 1,
          bool kMulticast_ = false, bool kL1_ = false>
struct MainloopConfig {
  static constexpr int kBlockN = kBlockN_;      // tokens per tile (wgmma N)
  static constexpr int kNumStages = kNumStages_;
  static constexpr WeightPath kPath = kPath_;
  static constexpr int kCtasPerSm = kCtasPerSm_;  // CTAs resident per SM (registers and smem split)
  // Token tile shared by a 2-CTA cluster (adjacent weight n-blocks), each CTA TMA-loading half of it
  // with multicast to both (contract at the top of this file). Launch with cluster dims (2, 1, 1).
  static constexpr bool kMulticast = kMulticast_;
  static constexpr int kClusterN = kMulticast ? 2 : 1;
  // The L1 (SwiGLU -> FP8) epilogue: its shared storage below, and tiles in n-block pairs (kPairN 2:
  // both 64-channel halves of a 128-channel output scale group on one CTA, epilogue.cuh).
  static constexpr bool kL1 = kL1_;
  static constexpr int kPairN = kL1 ? 2 : 1;
  static constexpr int kBlockK = WL::kBlockK;
  static constexpr int kTokenTileBytes = kBlockN * kBlockK;  // FP8, 128-byte swizzled rows
  static constexpr int kTmaBoxRows = kBlockN / kClusterN;     // token rows per CTA's TMA box
  static constexpr int kTmaBoxBytes = kTmaBoxRows * kBlockK;
  static constexpr int kWeightBytes = kPath == WeightPath::kSmem ? WL::kBlockChunkBytes : 0;  // per stage
  // Token scales, grouped by lane quad (see scale_slot); each quad's run padded by 4 floats so the
  // 4 quads' vector loads fall in different banks (unpadded, kBlockN / 4 floats apart they all hit
  // banks 0..3 for kBlockN = 128: a 4-way conflict on every scale load).
  static constexpr int kScaleQuadFloats = kBlockN / 4 + 4;
  static constexpr int kScaleBytes = 4 * kScaleQuadFloats * 4;
  static constexpr int kProducerThreads = 128;  // the producer warpgroup: all 4 warps copy scales
  static constexpr int kFullArrivals = 1 + kProducerThreads;
  static constexpr int kEmptyArrivals = kMathThreads / 32 * kClusterN;  // math warps of all CTAs of the cluster
  static constexpr int kAccRegs = kBlockN / 2;
  // Decode shift tables from the 32-entry shared table indexed by (shift & 31) (decode_raw_lut32)
  // instead of the warp vote + arithmetic LUT: measured on H200 (docs/perf-notes.md) for the 8-token
  // decode kernel (-7-8 % time) and the register path (+3-4 % prefill); the 16/32-token kernels keep
  // the arithmetic LUT (not measured with it).
  static constexpr bool kSmemLut32 = kPath == WeightPath::kRegs || kBlockN == 8;

  // Shared memory plan (offsets from a 1024-byte aligned base).
  static constexpr int kTokenOff = 0;
  static constexpr int kWeightOff = kTokenOff + kNumStages * kTokenTileBytes;
  static constexpr int kScaleOff = kWeightOff + kNumStages * kWeightBytes;
  // Epilogue storage. BF16: the L1 epilogue's bytes are unused (kept: the BF16 kernels' plan is the
  // measured one). L1: per-token partial maxima [kBlockN][8 math warps] FP32.
  static constexpr int kEpilogueOff = kScaleOff + kNumStages * kScaleBytes;
  static constexpr int kEpilogueBytes = kL1 ? kBlockN * 8 * 4 : 2 * kBlockN * 8 * 4;
  // L1 only: the output scale of each token of the tile pair [kBlockN] FP32, and the first half's
  // activations (the stash) [kBlockN / 8][kMathThreads][2] FP32, each thread's values as float2s
  // (thread-private: no barrier orders them; conflict-free: a warp's float2s are contiguous).
  static constexpr int kL1ScaleOff = kEpilogueOff + kEpilogueBytes;
  static constexpr int kL1ScaleBytes = kL1 ? kBlockN * 4 : 0;
  static constexpr int kStashOff = kL1ScaleOff + kL1ScaleBytes;
  static constexpr int kStashBytes = kL1 ? kBlockN / 4 * kMathThreads * 4 : 0;
  // Staging tile of the output (register path only). BF16: per math warpgroup [kBlockN tokens][64
  // channels + 16 bytes] (epilogue.cuh store_bf16_staged); one row = an odd number of 16-byte units,
  // so the 8 rows one stmatrix writes fall in 8 different bank groups. L1: one tile for the CTA,
  // [kBlockN tokens][128 E4M3 channels + 16 bytes] (store_l1_pair), written by both warpgroups.
  static constexpr bool kStagedStore = kPath == WeightPath::kRegs;
  static constexpr int kStoreRowBytes = kL1 ? 2 * WL::kRowsPerWarpgroup + 16 : WL::kRowsPerWarpgroup * 2 + 16;
  static constexpr int kStoreOff = kStashOff + kStashBytes;
  static constexpr int kStoreBytes = !kStagedStore ? 0 : kL1 ? kBlockN * kStoreRowBytes
                                                             : kMathThreads / 128 * kBlockN * kStoreRowBytes;
  static constexpr int kTableOff = kStoreOff + kStoreBytes;  // the scheduler's unit table [kMaxTableGroups] i32
  static constexpr int kTableBytes = kUnitTableBytes;
  static constexpr int kLutOff = kTableOff + kTableBytes;  // decode_raw's slow-path table (!kSmemLut32 only)
  static constexpr int kLutBytes = kSmemLut32 ? 0 : kNumShifts * 8;
  static constexpr int kLut32Off = (kLutOff + kLutBytes + 7) / 8 * 8;
  static constexpr int kLut32Bytes = kSmemLut32 ? kLut32Entries * 8 : 0;
  static constexpr int kBarOff = (kLut32Off + kLut32Bytes + 7) / 8 * 8;
  static constexpr int kSmemBytes = kBarOff + 2 * kNumStages * 8;

  static_assert(kBlockN % 8 == 0 && kBlockN >= 8 && kBlockN <= 256, "wgmma N is 8..256 in steps of 8");
  static_assert(!kL1 || kBlockN <= kMathThreads, "one math thread per token computes the L1 scales");
  static_assert(kStashOff % 8 == 0 && kL1ScaleOff % 8 == 0, "float2 stash and scale reads");
  static_assert(kTokenTileBytes % 1024 == 0, "swizzle-128B atoms are 1024 bytes: tiles stay aligned");
  static_assert(kTmaBoxBytes % 1024 == 0 && kTmaBoxRows <= 256,
                "each CTA's half tile starts on a swizzle atom (same layout as one full box); TMA box <= 256 rows");
  static_assert(!kMulticast || (kPath == WeightPath::kRegs && kCtasPerSm == 1),
                "token multicast is implemented for the kRegs loop (mma_stream_regs) only");
  static_assert(kWeightBytes % 16 == 0 && kWeightOff % 16 == 0, "bulk copy alignment");
  // 227 KB per SM for all resident CTAs, 1 KB of which the system reserves per CTA.
  static_assert(kSmemBytes <= 232448 / kCtasPerSm - (kCtasPerSm > 1 ? 1024 : 0), "shared memory per CTA");
  static_assert(kBlockK == 128, "one activation scale per stage");
  static_assert(kStoreOff % 16 == 0 && kStoreRowBytes % 16 == 0 && (kStoreRowBytes / 16) % 2 == 1,
                "16-byte stmatrix rows and copy-out loads; an odd number of 16-byte units per row");
  static_assert((kScaleQuadFloats * 4) % (kBlockN >= 16 ? 16 : 8) == 0 && kScaleBytes % 16 == 0,
                "scale runs stay aligned for their vector loads");
};

template <class Cfg>
struct SmemView {
  uint8_t* base;
  __device__ uint8_t* tokens(int s) const { return base + Cfg::kTokenOff + s * Cfg::kTokenTileBytes; }
  __device__ uint8_t* weights(int s) const { return base + Cfg::kWeightOff + s * Cfg::kWeightBytes; }
  __device__ float* scales(int s) const { return reinterpret_cast<float*>(base + Cfg::kScaleOff + s * Cfg::kScaleBytes); }
  __device__ float* epilogue() const { return reinterpret_cast<float*>(base + Cfg::kEpilogueOff); }
  __device__ float* l1_scales() const { return reinterpret_cast<float*>(base + Cfg::kL1ScaleOff); }
  __device__ float* stash() const { return reinterpret_cast<float*>(base + Cfg::kStashOff); }
  __device__ uint8_t* store_tile(int wg) const { return base + Cfg::kStoreOff + wg * Cfg::kBlockN * Cfg::kStoreRowBytes; }
  __device__ uint2* lut() const { return reinterpret_cast<uint2*>(base + Cfg::kLutOff); }
  __device__ int* unit_table() const { return reinterpret_cast<int*>(base + Cfg::kTableOff); }
  __device__ uint8_t* lut32() const { return base + Cfg::kLut32Off; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + s; }
  __device__ uint64_t* empty(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + Cfg::kNumStages + s; }
};

// Position in the stage ring: stage = iteration % kNumStages, phase = (iteration / kNumStages) & 1,
// advanced incrementally (kNumStages is not a power of two: the division cost ~6 instructions per
// use, ~25 per K block in the decode-sized loop).
template <class Cfg>
struct RingPos {
  uint32_t stage, phase;
  __device__ static RingPos at(uint32_t iter) { return {iter % Cfg::kNumStages, (iter / Cfg::kNumStages) & 1}; }
  __device__ RingPos next() const {
    return stage + 1 == uint32_t(Cfg::kNumStages) ? RingPos{0, phase ^ 1} : RingPos{stage + 1, phase};
  }
};

// Token scales live in shared memory permuted so that a math thread's kBlockN / 4 scales are
// contiguous (vector loads): token 8j + 2q + c (q = lane % 4) sits at q * kScaleQuadFloats + 2j + c.
template <class Cfg>
__device__ __forceinline__ int scale_slot(int token) {
  return ((token % 8) / 2) * Cfg::kScaleQuadFloats + 2 * (token / 8) + token % 2;
}

template <class Cfg>
__device__ __forceinline__ void init_pipeline(const SmemView<Cfg>& sm, int tid, int nthreads) {
  if (tid == 0) {
    for (int s = 0; s < Cfg::kNumStages; ++s) {
      ptx::mbar_init(sm.full(s), Cfg::kFullArrivals);
      ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
    }
    ptx::fence_mbar_init();
  }
  if constexpr (Cfg::kSmemLut32)
    fill_shift_lut32(sm.lut32(), tid, nthreads);
  else
    fill_shift_lut(sm.lut(), tid, nthreads);
}

struct WeightOperand {
  const uint8_t* packed;     // [G][N / kBlockRows][K / kBlockK][kBlockChunkBytes]
  const float* row_scale;    // [G][N]
};

struct TokenOperand {
  const float* scales;       // [rows][K / 128] FP32
  int64_t scale_stride;      // elements between rows of `scales`
};

// Packed weight chunks of tile t: k_blocks chunks of WL::kBlockChunkBytes.
__device__ __forceinline__ const uint8_t* tile_weights(const WeightOperand& w, const GroupedProblem& pb, const Tile& t) {
  return w.packed + (int64_t(t.group) * (pb.n / WL::kBlockRows) + t.n_block) * int64_t(pb.k / WL::kBlockK) *
                        WL::kBlockChunkBytes;
}

// Producer (the kProducerThreads threads of a warpgroup, `ptid` 0..127): streams the K blocks of
// one tile into the ring; thread 0 issues the bulk copies, every thread copies the scales of
// tokens ptid, ptid + 128, ... (one copy per thread per stage at 128 tokens: a single warp's four
// strided 4-byte copies per stage kept it busy most of the time). Returns false on timeout.
// Multicast (Cfg::kMulticast): `cta_rank` is this CTA's cluster rank; thread 0 loads only its half
// of the token tile, into both CTAs, and arms full[s] for the whole tile (contract at the top).
template <class Cfg>
__device__ __forceinline__ bool produce_tile(const SmemView<Cfg>& sm, const CUtensorMap* tmap,
                                             const WeightOperand& w, const TokenOperand& x,
                                             const GroupedProblem& pb, const Tile& t, uint32_t& iter,
                                             int ptid, const ErrSink& err, uint64_t timeout_ns,
                                             uint32_t cta_rank = 0) {
  const int k_blocks = pb.k / Cfg::kBlockK;
  const uint8_t* wsrc = tile_weights(w, pb, t);
  // First token row of this CTA's TMA box. Multicast: rank 1's half starts 64 rows in; if that is
  // past the tensor's last row, every row of that half is past it too (no valid token of the tile
  // lives there: t.rows <= rows - row0 <= 64), so any in-bounds start will do. Clamped so no box is
  // entirely out of bounds (partial boxes are zero-filled and count their full bytes, as today).
  int32_t box_row = int32_t(t.row0);
  if constexpr (Cfg::kMulticast)
    box_row = int32_t(min(t.row0 + int64_t(cta_rank) * Cfg::kTmaBoxRows, pb.rows - 1));
  RingPos<Cfg> pos = RingPos<Cfg>::at(iter);
  for (int kb = 0; kb < k_blocks; ++kb, ++iter, pos = pos.next()) {
    const int s = pos.stage;
    const uint32_t phase = pos.phase;
    // Multicast: empty[s] completes with the peer CTA's arrivals too (CTA-scope acquire suffices:
    // contract at the top of this file).
    if (!ptx::mbar_wait(sm.empty(s), phase ^ 1, timeout_ns)) {
      moe::claim_error(err, Err::kTimeoutEmpty);
      return false;
    }
    if (ptid == 0) {
      ptx::mbar_arrive_expect_tx(sm.full(s), Cfg::kTokenTileBytes + Cfg::kWeightBytes);
      if constexpr (Cfg::kMulticast) {
        ptx::tma_load_2d_multicast(tmap, sm.full(s), sm.tokens(s) + cta_rank * Cfg::kTmaBoxBytes, kb * Cfg::kBlockK,
                                   box_row, uint16_t((1u << Cfg::kClusterN) - 1));
      } else {
        ptx::tma_load_2d(tmap, sm.full(s), sm.tokens(s), kb * Cfg::kBlockK, box_row);
      }
      if constexpr (Cfg::kPath == WeightPath::kSmem) {
        ptx::bulk_load(sm.weights(s), wsrc + int64_t(kb) * Cfg::kWeightBytes, Cfg::kWeightBytes, sm.full(s));
      } else {  // the math threads load this chunk themselves ~kNumStages K blocks from now: warm L2
        ptx::prefetch_l2(wsrc + int64_t(kb) * WL::kBlockChunkBytes, WL::kBlockChunkBytes);
      }
    }
    // Token scales: rows past the tile's valid rows are left as they are (their outputs are never
    // stored, and each output column depends only on its own token).
    float* dst = sm.scales(s);
    for (int i = ptid; i < t.rows; i += Cfg::kProducerThreads)
      ptx::cp_async_4(dst + scale_slot<Cfg>(i), x.scales + (t.row0 + i) * x.scale_stride + kb);
    ptx::cp_async_arrive_noinc(sm.full(s));
  }
  return true;
}

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

// Decodes one K block's A fragments (4 k32 steps). `lut` is the shared-memory table for shifts
// below kMinFastShift (a warp-uniform slow path: realistic weights rarely take it).
__device__ __forceinline__ void decode_raw(const RawFragment& r, const uint2* lut_smem,
                                           uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  constexpr int kSteps = WL::kStepsPerBlockK;
  // sh[2 * step + h]: shift of row r + 8h in k32 step `step`.
  int sh[2 * kSteps];
  int smin = WL::kMaxShift;
#pragma unroll
  for (int i = 0; i < 2 * kSteps; ++i) {
    // Byte i % 4, sign-extended, in one PRMT (selector nibbles 8|b replicate byte b's sign bit).
    sh[i] = int(ptx::prmt(i < 4 ? r.shifts.x : r.shifts.y, 0u, 0x8880u | (0x1111u * uint32_t(i % 4))));
    smin = min(smin, sh[i]);
  }
  uint2 lut[2 * kSteps];
  if (__any_sync(0xffffffffu, smin < kMinFastShift)) {
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) lut[i] = lut_smem[min(max(sh[i], WL::kMinShift), WL::kMaxShift) - WL::kMinShift];
  } else {
#pragma unroll
    for (int i = 0; i < 2 * kSteps; ++i) lut[i] = fast_shift_lut(sh[i]);
  }
#pragma unroll
  for (int st = 0; st < kSteps; ++st) decode_step(r.codes[st], lut[2 * st], lut[2 * st + 1], a[st]);
}

// The same with the 8 shift tables looked up in the 32-entry shared table (decode.cuh) by
// (shift & 31): the byte offsets 8 * (shift & 31) of four shifts are formed at once (shift left by 3,
// keep the top 5 bits of each byte: the bits shifted in from the byte below are masked off), then
// one PRMT (zero-extended byte) and one LDS.64 per shift: ~20 instructions instead of the vote, the
// min chain and 16 IMADs (~33), and no warp-uniform branch on the decode's critical path.
__device__ __forceinline__ void decode_raw_lut32(const RawFragment& r, const uint8_t* lut32,
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
__device__ __forceinline__ void decode_any(const SmemView<Cfg>& sm, const RawFragment& r,
                                           uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  if constexpr (Cfg::kSmemLut32)
    decode_raw_lut32(r, sm.lut32(), a);
  else
    decode_raw(r, sm.lut(), a);
}

template <class Cfg>
__device__ __forceinline__ void decode_stage(const SmemView<Cfg>& sm, int s, const DecodeOffsets& off,
                                             uint32_t (&a)[WL::kStepsPerBlockK][4]) {
  // All shared-memory loads first (codes do not depend on the shifts): one load latency, not two.
  RawFragment r;
  load_raw_smem(sm.weights(s), off, r);
  decode_any(sm, r, a);
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
                                         const ErrSink& err, uint64_t timeout_ns) {
  static_assert(Cfg::kPath == WeightPath::kSmem, "the kRegs path runs mma_stream_regs");
  static_assert(Cfg::kBlockN <= 32, "two partial-sum buffers: registers allow up to 32 tokens");
  constexpr int kSteps = WL::kStepsPerBlockK;
  constexpr int kScales = Cfg::kBlockN / 4;
  int lane = tid_in_wg % 32;
  ptx::keep_in_register(lane);  // an S2R of %tid inside the loop stalled the wgmma issue
  const int k_blocks = pb.k / Cfg::kBlockK;
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
  decode_any(sm, r0, a0);
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
      decode_any(sm, r_next, a_next);
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
