// fp4_gemm/pipeline.cuh — the FP8 x FP4 mainloop's pipeline: configuration (MainloopConfig), shared
// memory plan (SmemView), ring position, operands and the producer role (produce_tile). The math role
// (decode, wgmma, promotion, the two loops) is in mainloop.cuh.
//
// Pipeline contract (one ring of kNumStages stages, each = token tile + weight chunk + token scales):
//  - full[s]  : 1 arrive.expect_tx by producer thread 0 (TMA + bulk bytes) and one arrive
//               (release.cta) per producer thread (kProducerThreads), each after its own token
//               scale's shared-memory store                                         -> kFullArrivals.
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
//  - empty[s] counts kEmptyArrivals. kSmem path (weights in the stage, read by LDS): every math thread
//    arrives (release.cta) after its own reads of stage s (256 arrivals; one lane's arrive after a
//    __syncwarp is as correct, but compute-sanitizer racecheck reported it as a race with the next
//    bulk copy; the per-thread arrivals measured no slower, gemm A/B 2026-12-02). kRegs path with
//    multicast: 8 warps x 2 CTAs: each math warp, after the wgmma.wait_group
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
  // kSmem: every math thread releases (its own weight LDS reads of the stage before its own arrive: the
  // order compute-sanitizer racecheck can follow; one lane's arrive after __syncwarp it reported as a
  // race with the next bulk copy). kRegs (weights never in shared memory): the math warps.
  static constexpr bool kLaneRelease = kPath == WeightPath::kSmem;
  static constexpr int kEmptyArrivals = kLaneRelease ? kMathThreads : kMathThreads / 32 * kClusterN;
  static constexpr int kAccRegs = kBlockN / 2;
  // Split-K (scheduler.cuh, roles.cuh) in the decode configurations (few tokens, two CTAs per SM), where a
  // launch's units can be fewer than its CTAs.
  static constexpr bool kSplitK = kPath == WeightPath::kSmem && kCtasPerSm == kSplitKCtasPerSm;

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
  static constexpr int kLut32Off = (kTableOff + kTableBytes + 7) / 8 * 8;  // the decode's shift tables (decode.cuh)
  static constexpr int kLut32Bytes = kLut32Entries * 8;
  static constexpr int kBarOff = (kLut32Off + kLut32Bytes + 7) / 8 * 8;
  // kSplitK: the split-K reduction's last-arriver flag (one word, math thread 0 writes it, roles.cuh).
  static constexpr int kSplitFlagOff = kBarOff + 2 * kNumStages * 8;
  static constexpr int kSmemBytes = kSplitFlagOff + (kSplitK ? 8 : 0);

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
  __device__ int* unit_table() const { return reinterpret_cast<int*>(base + Cfg::kTableOff); }
  __device__ uint8_t* lut32() const { return base + Cfg::kLut32Off; }
  __device__ uint64_t* full(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + s; }
  __device__ uint64_t* empty(int s) const { return reinterpret_cast<uint64_t*>(base + Cfg::kBarOff) + Cfg::kNumStages + s; }
  __device__ int32_t* split_flag() const { return reinterpret_cast<int32_t*>(base + Cfg::kSplitFlagOff); }
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

// A pipeline's two parts: the ring's barriers (one thread) and the decode table (any threads). A kernel
// that runs several pipelines may initialise every ring once, up front (the fused kernel: its rings lie
// outside the GEMM plans), and refill only the table of each phase's plan.
template <class Cfg>
__device__ __forceinline__ void init_ring(const SmemView<Cfg>& sm) {
  for (int s = 0; s < Cfg::kNumStages; ++s) {
    ptx::mbar_init(sm.full(s), Cfg::kFullArrivals);
    ptx::mbar_init(sm.empty(s), Cfg::kEmptyArrivals);
  }
  ptx::fence_mbar_init();
}

template <class Cfg>
__device__ __forceinline__ void fill_decode_table(const SmemView<Cfg>& sm, int tid, int nthreads) {
  fill_shift_lut32(sm.lut32(), tid, nthreads);
}

template <class Cfg>
__device__ __forceinline__ void init_pipeline(const SmemView<Cfg>& sm, int tid, int nthreads) {
  if (tid == 0) init_ring(sm);
  fill_decode_table(sm, tid, nthreads);
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

// Producer (the kProducerThreads threads of a warpgroup, `ptid` 0..127): streams K blocks [kb0, kb0 +
// kbn) of one tile into the ring (kbn < 0: all); thread 0 issues the bulk copies, every thread copies the scales of
// tokens ptid, ptid + 128, ... (one copy per thread per stage at 128 tokens: a single warp's four
// strided 4-byte copies per stage kept it busy most of the time). Returns false on timeout.
// Multicast (Cfg::kMulticast): `cta_rank` is this CTA's cluster rank; thread 0 loads only its half
// of the token tile, into both CTAs, and arms full[s] for the whole tile (contract at the top).
template <class Cfg>
__device__ __forceinline__ bool produce_tile(const SmemView<Cfg>& sm, const CUtensorMap* tmap,
                                             const WeightOperand& w, const TokenOperand& x,
                                             const GroupedProblem& pb, const Tile& t, uint32_t& iter,
                                             int ptid, const ErrSink& err, uint64_t timeout_ns,
                                             uint32_t cta_rank = 0, int kb0 = 0, int kbn = -1) {
  const int k_end = kbn < 0 ? pb.k / Cfg::kBlockK : kb0 + kbn;
  const uint8_t* wsrc = tile_weights(w, pb, t);
  // First token row of this CTA's TMA box. Multicast: rank 1's half starts 64 rows in; if that is
  // past the tensor's last row, every row of that half is past it too (no valid token of the tile
  // lives there: t.rows <= rows - row0 <= 64), so any in-bounds start will do. Clamped so no box is
  // entirely out of bounds (partial boxes are zero-filled and count their full bytes, as today).
  int32_t box_row = int32_t(t.row0);
  if constexpr (Cfg::kMulticast)
    box_row = int32_t(min(t.row0 + int64_t(cta_rank) * Cfg::kTmaBoxRows, pb.rows - 1));
  RingPos<Cfg> pos = RingPos<Cfg>::at(iter);
  // Token scales: thread ptid owns row ptid of the tile (kBlockN <= kProducerThreads: one per stage).
  // Coherent loads (ld.relaxed.gpu, never the L1-allocating cp.async.ca): a fused kernel's dispatch or
  // L1 epilogue wrote them earlier in the same launch (ordered before this by its grid barrier /
  // readiness acquire). Issued before the empty wait, so their L2 latency hides under it. Rows past the
  // tile's valid rows are left as they are (their outputs are never stored, and each output column
  // depends only on its own token).
  static_assert(Cfg::kBlockN <= Cfg::kProducerThreads, "one token scale per producer thread per stage");
  const bool has_row = ptid < t.rows;
  const float* src_scale = x.scales + (t.row0 + ptid) * x.scale_stride;
  float* const dst_scale = sm.scales(0) + scale_slot<Cfg>(ptid);
  for (int kb = kb0; kb < k_end; ++kb, ++iter, pos = pos.next()) {
    const int s = pos.stage;
    const uint32_t phase = pos.phase;
    const float sv = has_row ? ptx::ld_relaxed_gpu_f32(src_scale + kb) : 0.f;
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
    if (has_row) dst_scale[s * (Cfg::kScaleBytes / 4)] = sv;
    ptx::mbar_arrive(sm.full(s));  // release.cta: this thread's scale store before the math warps' acquire
  }
  return true;
}

}  // namespace fp4_gemm
