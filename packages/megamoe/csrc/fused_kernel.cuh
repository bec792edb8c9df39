// csrc/fused_kernel.cuh — the fused MegaMoE kernel (device side; csrc/fused.cu launches it): dispatch -> L1 GEMM (SwiGLU x top-k -> FP8) -> L2 GEMM -> pull combine in ONE
// persistent, cooperative launch per rank (docs/design.md section 5). It is an assembly of the
// standalone packages' device parts, called exactly as the staged pipeline's kernels call them, so the
// output is bitwise the staged one (same tiles, same accumulation order, same epilogues):
//   phase D  symm_comm's dispatch worker (metadata, cross-rank barrier, pool layout, pull): all threads, or
//            at two CTAs per SM the math warpgroups at a raised register budget (CommRegs)
//   grid barrier 0 (this rank's CTAs: the pool, its scales / top-k weights and the layout are complete)
//   phase L1 producer warpgroup + 2 math warpgroups (setmaxnreg split): fp4_gemm's mainloop + L1 epilogue
//   grid barrier 1 (the L1 output complete)
//   phase L2 the same roles, a fresh pipeline: fp4_gemm's mainloop + BF16 epilogue into the combine input
//   grid barrier 2 (this rank's L2 rows complete: the pull combine's start signal may go out)
//   phase C  symm_comm's pull combine (explicit release start signal): the same workers as phase D
// What the kernel boundaries gave the staged pipeline, the grid barriers give here (symm_comm's
// grid_barrier_gpu: every write before it precedes every access after it, gpu scope); TMA reads of rows written by
// generic stores earlier in the launch are preceded by fence.proxy.async.global in the issuing thread.
// Overlap of the phases (per-block arrival / readiness counters instead of grid barriers, the wave
// scheduler of include/megamoe/scheduler.cuh) is the next step (docs/perf-notes.md).
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp4_gemm/roles.cuh"
#include "megamoe/layout.cuh"
#include "megamoe/tile_queue.cuh"
#include "megamoe_api.h"
#include "symm_comm/symm_comm.cuh"
#include "tensor_map.h"

namespace megamoe {
namespace {

namespace fg = fp4_gemm;
namespace ptx = ::moe::ptx;
constexpr int kThreads = 128 + fg::kMathThreads;  // producer warpgroup + 2 math warpgroups
static_assert(kTileReaders == kThreads - 1, "the tile ring's readers: every thread but producer thread 0");
// Phases D / C's in-flight batches (symm_comm's standalone values: combine k batch 8, plain pull 16 vectors
// per lane, for its 128-register kernels). At two CTAs per SM the kernel has 80 registers and they are
// halved: the callees then spill 0 / 164-304 instead of 116-120 / 460-648 bytes and the CTAs that move the
// rows finish sooner (flash, 1 token: phase C 11.3 -> 6.7 us, D 27.9 -> 24.1, the call 101.4 -> 91.8;
// docs/perf-notes.md). Top-k above the k batch: batches of k rows, the same sum order.
constexpr int kPullUnroll = 7;
template <int kCtasPerSm>
struct CommBatch {
  static constexpr int kCombineK = kCtasPerSm == 2 ? 4 : 8;
  static constexpr int kPullPlain = kCtasPerSm == 2 ? 8 : 16;
};

// The kernel's one named-barrier list: 0 = __syncthreads; 1 = all 256 math threads (the L1 epilogue, the
// split-K arrival), and
// the math threads' aligned barrier before L2;
// 2 + wg = the staged BF16 store of math warpgroup wg; kRegBarrier (below).
constexpr uint32_t kL1Barrier = 1;
constexpr fg::MathBarriers kMathBarriers{kL1Barrier, 2};
// 4: at two CTAs per SM, the math warpgroups' register return after phase D before the producer's inc.
constexpr uint32_t kRegBarrier = kMathBarriers.store0 + fg::kMathThreads / 128;
static_assert(kRegBarrier < 16, "named barrier ids");
// Grid barriers (symm_comm's grid_barrier_gpu), in call order: one caller-owned word each (grid_words,
// zero at creation and after a resync; a barrier's word never needs a reset otherwise).
enum GridBar : int { kBarPool = 0, kBarL1 = 1, kBarL2 = 2 };
// The dynamic tile order's counters (8- / 16- / 32-token tiles): one u32 per GEMM phase after the barrier
// words, zero at creation; CTA 0 zeroes each after the grid barrier that ends its phase (no CTA takes a
// tile after it; the next launch's first atomicAdd is ordered after it by the kernel boundary). After a
// timeout the counter stays as it is: every timeout asks for resync(), which zeroes the grid words.
enum TileCounter : int { kCountL1 = 3, kCountL2 = 4 };
// Added to twice the call's limit for the math threads' waits (why: at math_timeout_ns in the kernel).
constexpr uint64_t kMathSlackNs = 1000000;
// The codes after which a call needs resync(): a wait timed out (symm_comm's, or a GEMM role's claim).
__device__ __forceinline__ bool needs_resync(int32_t code) {
  return code == SYMM_ERR_TIMEOUT || code == fg::Err::kTimeoutFull || code == fg::Err::kTimeoutEmpty;
}
// Phase stamps (FusedParams::stamps, megamoe_api.h): 0 start, 1 dispatch done, 2 after grid barrier 0,
// 3 this CTA's L1 tiles produced, 4 after grid barrier 1, 5 L2 produced, 6 after grid barrier 2, 7 combine done;
// 8: the CTA's SM (%smid).
constexpr int kStamps = 9;
static_assert(kCountL2 < moe::kGridWords, "grid barrier and tile counter words");

struct FusedParams {
  SymmLayout L;
  const uint64_t* peers;
  int32_t* host_err;
  uint64_t timeout_ns;
  symm::DispatchArgs d;
  int idx_bytes;
  int dedup;            // the pull's dedup variant (symm_comm's dispatch picks it the same way)
  int onepass;          // dispatch: the one-pass metadata scan fits in shared memory
  fg::GroupedProblem pb1, pb2;
  fg::WeightOperand w1, w2;
  fg::TokenOperand x1, x2;
  fg::EpilogueParams e1, e2;  // L1: the L1 epilogue's arguments; L2: BF16 rows into the pull combine's input (cmb_in)
  uint16_t* y;
  uint32_t* grid_words;
  int32_t* err_dev;  // this rank's error record (symm state_err): the GEMM phases' and grid barriers' sink
  uint64_t* stamps;  // optional (null): kStamps %globaltimer values per CTA (profiling; thread 0 writes, stamp 7 phase C's lead)
};

}  // namespace
}  // namespace megamoe

namespace megamoe {
namespace {

// ---- phases L1 / L2: fp4_gemm's roles (roles.cuh) with its scheduler's tiles (the few-token configurations in
// a dynamic order: megamoe/tile_queue.cuh) -----------------------------------------------------------------
// The pipeline is fresh (initialised by the caller). `table`: the problem's unit table (built before the
// register split).
template <class Cfg>
using Sched = fg::GroupedScheduler<Cfg::kBlockN, fg::WL::kBlockRows, 1, Cfg::kPairN, Cfg::kSplitK>;

template <class Cfg>
__device__ __forceinline__ void produce_phase(const fg::SmemView<Cfg>& sm, const CUtensorMap* tmap,
                                              const fg::GroupedProblem& pb, const fg::WeightOperand& w,
                                              const fg::TokenOperand& x, const int* table, const moe::ErrSink& err,
                                              uint64_t timeout_ns, TileQueue* q, uint32_t* counter) {
  const fg::Worker worker{int(blockIdx.x), int(gridDim.x), 0};  // one worker per CTA
  // (A role's timeouts only claim the record, no stores in their loops: the kernel's end fills it.)
  if constexpr (Cfg::kPath == fg::WeightPath::kSmem) {
    const DynSched<Sched<Cfg>> ds(Sched<Cfg>(pb, table, worker), q, counter, &err, timeout_ns, threadIdx.x == 0);
    fg::Mainloop<Cfg>::produce(sm, tmap, pb, w, x, ds, threadIdx.x, err, timeout_ns);
  } else {
    fg::Mainloop<Cfg>::produce(sm, tmap, pb, w, x, Sched<Cfg>(pb, table, worker), threadIdx.x, err, timeout_ns);
  }
}

template <class Cfg, fg::EpilogueKind kEpi>
__device__ __forceinline__ void math_phase(const fg::SmemView<Cfg>& sm, const fg::GroupedProblem& pb,
                                           const fg::WeightOperand& w, const fg::EpilogueParams& e, const int* table,
                                           int wg, int tid_in_wg, const moe::ErrSink& err, uint64_t timeout_ns,
                                           TileQueue* q, uint32_t* counter) {
  const fg::TileEpilogue<Cfg, kEpi> epilogue{sm, pb, w, e, wg, tid_in_wg, kMathBarriers};
  const fg::Worker worker{int(blockIdx.x), int(gridDim.x), 0};
  if constexpr (Cfg::kPath == fg::WeightPath::kSmem) {
    const DynSched<Sched<Cfg>> ds(Sched<Cfg>(pb, table, worker), q, counter, &err, timeout_ns, false);
    fg::Mainloop<Cfg>::math(sm, pb, w, ds, wg, tid_in_wg, err, timeout_ns, epilogue);
  } else {
    fg::Mainloop<Cfg>::math(sm, pb, w, Sched<Cfg>(pb, table, worker), wg, tid_in_wg, err, timeout_ns, epilogue);
  }
}

// A GEMM configuration whose stage ring's barriers live at kRingOff, outside both GEMM plans (FusedSmem):
// both rings are initialised once, before the roles split, and never re-initialised. (Initialising L2's ring
// inside L1's plan after L1, by the math threads between two CTA barriers met at different code locations,
// drew compute-sanitizer racecheck reports against the producer's first wait at the 128-token tile.) The
// plan itself (tiles, tables, epilogue storage) and hence the bits are the configuration's.
template <class Cfg, int kRingOff>
struct RingAt : Cfg {
  static constexpr int kBarOff = kRingOff;
  static_assert(kRingOff % 8 == 0, "mbarrier alignment");
};

// The calls' starts, kept in shared memory across the GEMM phases: in registers they stayed live through
// the math warpgroups' mainloops (~26 registers over the standalone kernel's budget, which spilled the
// 128-token loop). Every thread reads them where it needs them (error paths, grid barriers, the combine).
struct FusedState {
  symm::CallStart dc, cc;
  int grid_ok;  // a grid barrier's result, broadcast by warp 0 (grid_barrier_gpu s_ok)
  int failed;   // after grid barrier 2: this rank's call holds a timeout (phase C's lead broadcasts)
  SymmLayout L;  // phases D / C's parameters, copied here before the dispatch (why: dispatch_phase)
  symm::DispatchArgs d;
  TileQueue q1, q2;  // the dynamic tile order's rings of L1 and L2 (initialised with the pipelines)
};
// The dispatch call's deadline, read where a wait needs it (ptx::ld_shared_u64: ONE load the compiler
// cannot re-issue inside the wait's polling loop; a plain load there cost the whole kernel its uniform
// datapath: +12 % instructions in the math loops, ncu and SASS 2026-12-02).
__device__ __forceinline__ uint64_t load_deadline(const FusedState* st) { return ptx::ld_shared_u64(&st->dc.deadline); }

// Shared memory: the GEMM phases' plans (one at a time) and, after the larger of them, the L2 problem's
// unit table (built with L1's before the register split), the peer table and the FusedState.
template <class CL1, class CL2>
struct FusedSmem {
  static constexpr int kGemmBytes = CL1::kSmemBytes > CL2::kSmemBytes ? CL1::kSmemBytes : CL2::kSmemBytes;
  static constexpr int kTable2Off = (kGemmBytes + 15) / 16 * 16;
  static constexpr int kPeersOff = kTable2Off + fg::kUnitTableBytes;
  static constexpr int kStateOff = kPeersOff + SYMM_MAX_RANKS * 8;
  // The two stage rings' barriers (RingAt): above the dispatch scratch [0, kPeersOff) and both plans.
  static constexpr int kRing1Off = (kStateOff + int(sizeof(FusedState)) + 7) / 8 * 8;
  static constexpr int kRing2Off = kRing1Off + 2 * CL1::kNumStages * 8;
  static constexpr int kBytes = kRing2Off + 2 * CL2::kNumStages * 8;
  static_assert(kBytes <= 232448 / CL1::kCtasPerSm - (CL1::kCtasPerSm > 1 ? 1024 : 0), "shared memory per CTA");
  static_assert(CL1::kCtasPerSm == CL2::kCtasPerSm && CL1::kBlockN == CL2::kBlockN, "one token tile, one split");
  // The staged GEMMs split K at block_n 8 / 16 (grouped_gemm.cu's configurations): the fused kernel must
  // split exactly there too, or the two paths' bits would differ.
  static_assert(CL1::kSplitK == (CL1::kBlockN <= 16) && CL2::kSplitK == CL1::kSplitK, "split-K where staged splits");
};

// ---- phases D and C: symm_comm's dispatch and pull combine, called, not inlined ------------------------
// Inlined, their code shared one register allocation with the GEMM phases: the kernel spilled 1456 / 1792
// bytes at the 8- / 16-token tiles, much of it in the GEMM regions, and its L1 phase ran 12-23 % slower than
// the same kernel without phases D and C (16 bytes of spills; experiments/patches/fused-skip-dc.patch).
// As calls: 92 / 332 bytes, L1 phase -3..-15 % (docs/perf-notes.md). Their parameters (layout, calls'
// starts, dispatch arguments) come from the FusedState in shared memory, addressed by its 32-bit shared
// address: through a pointer into the parameter space every read was a generic load re-issued after each
// store (dispatch +4..+7 us), local copies lived on the stack (+10 us). Their workers: the whole CTA (bar 0), or
// at two CTAs per SM the math warpgroups (dispatch_group, bar 1).
// `st`: the FusedState's 32-bit shared address (a generic pointer argument would make its reads generic).
__device__ __forceinline__ const FusedState& state_at(uint32_t st) {
  return *static_cast<const FusedState*>(__cvta_shared_to_generic(st));
}
// W: the whole CTA, or (2 CTAs per SM) the math warpgroups' group: dispatch_group.
template <typename IdxT, int kUnroll, bool kDedup>
__device__ __noinline__ void dispatch_phase(uint32_t st, int onepass, const uint64_t* s_peers, int32_t* dsm,
                                            int64_t dsm_ints, symm::Workers W) {
  const FusedState& S = state_at(st);
  symm::dispatch_run<IdxT, kUnroll, kDedup>(W, S.L, s_peers, S.dc, S.d, dsm, dsm_ints, onepass);
  symm::end_call(W, S.dc.local, S.L, SYMM_OP_DISPATCH, S.dc.epoch);
}

// Phase D's workers at two CTAs per SM: the two math warpgroups (threads 128..383) with named barrier
// kL1Barrier (free until the GEMM phases: it is theirs there too), the producer warpgroup idle at 24
// registers, so the dispatch runs at CommRegs::kMath (104) instead of the launch's 80: at 80 its callee spilled
// 164-384 bytes (the row pull's vectors and the tables' state) and the row-pulling CTAs ended ~7 us after
// the others (docs/perf-notes.md). One group per CTA, as Workers::cta(): the same rows and tables.
// The same split as the GEMM roles' (fg::RegisterSplit) with the producer warpgroup at setmaxnreg's minimum:
// 80 launch registers -> 104 for the math warpgroups at two CTAs per SM.
using CommRegs = fg::RegisterSplit<kThreads, 2, 24>;
static_assert(CommRegs::kLaunchRegs == 80 && CommRegs::kMath == 104, "the budgets the notes measured");
__device__ __forceinline__ symm::Workers dispatch_group() {
  // One code location (the dispatch / combine callee): aligned bar.sync / bar.red after a __syncwarp
  // (Workers::sync). The non-aligned barrier.red drew 8416 synccheck divergent-barrier reports at T 9.
  return symm::Workers::warps(128 / 32, fg::kMathThreads / 32, kL1Barrier, /*any_pc=*/false);
}

// The L1 epilogue applied the top-k weights (topk_w null).
template <int kCombineK>
__device__ __noinline__ void combine_phase(uint32_t st, const uint64_t* s_peers, uint16_t* y, symm::Workers W) {
  const FusedState& S = state_at(st);
  symm::combine_pull_run_all<kCombineK, symm::Order::kInKernel>(W, S.L, s_peers, S.cc, nullptr, y, S.d.num_tokens);
  symm::combine_end(W, S.cc.local, S.L, S.cc.epoch);
}

template <class CL1, class CL2>
__global__ void __launch_bounds__(kThreads, CL1::kCtasPerSm)
    fused_moe_kernel(const __grid_constant__ CUtensorMap tmap_pool, const __grid_constant__ CUtensorMap tmap_l1,
                     const __grid_constant__ FusedParams p) {
  using S = FusedSmem<CL1, CL2>;
  using R1 = RingAt<CL1, S::kRing1Off>;  // the configurations with their rings outside the plans
  using R2 = RingAt<CL2, S::kRing2Off>;
  using Regs = fg::RegisterSplit<kThreads, CL1::kCtasPerSm>;
  using Sched1 = Sched<CL1>;
  using Sched2 = Sched<CL2>;
  static_assert(Sched1::kTableThreads == kThreads, "the whole CTA builds the unit tables");
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x;
  uint64_t* s_peers = reinterpret_cast<uint64_t*>(smem + S::kPeersOff);
  int* table2 = reinterpret_cast<int*>(smem + S::kTable2Off);
  const symm::Workers W = symm::Workers::cta();  // the whole CTA (bar 0): setup, grid barrier 0, 1 CTA/SM D / C
  const SymmLayout& L = p.L;
  // Thread 0 only (the producer warpgroup from the register split on); stamp 7 is phase C's lead's (phase_c).
  auto stamp = [&](int i) {
    if (p.stamps != nullptr && tid == 0) p.stamps[int64_t(blockIdx.x) * kStamps + i] = ptx::globaltimer_ns();
  };
  stamp(0);
  if (p.stamps != nullptr && tid == 0) p.stamps[int64_t(blockIdx.x) * kStamps + 8] = ptx::smid();
  // Both ops' starts first (each op runs once per launch: both epochs come from earlier launches).
  const symm::CallStart dc = symm::begin_call(W, L, p.peers, s_peers, SYMM_OP_DISPATCH, p.host_err, p.timeout_ns);
  const symm::CallStart cc = symm::begin_next_call(dc, L, SYMM_OP_COMBINE, p.host_err);
  if (ptx::smem_addr(smem) % 1024 != 0) {  // the GEMMs' 128-byte swizzle; the same in every CTA
    if (blockIdx.x == 0 && tid == 0)
      moe::report_error(dc.err, fg::Err::kSmemAlign, fg::Phase::kSetup, int(ptx::smem_addr(smem) % 1024), 0);
    return;  // every CTA leaves before any wait (the peers time out: a broken build, not a data error)
  }
  FusedState* st = reinterpret_cast<FusedState*>(smem + S::kStateOff);
  const uint32_t st_s = ptx::smem_addr(st);
  if (tid == 0) {
    st->dc = dc;
    st->cc = cc;
    st->d = p.d;
  }
  static_assert(sizeof(SymmLayout) % 4 == 0, "copied as words");
  for (int i = tid; i < int(sizeof(SymmLayout) / 4); i += kThreads)
    reinterpret_cast<uint32_t*>(&st->L)[i] = reinterpret_cast<const uint32_t*>(&p.L)[i];
  __syncthreads();  // the state complete before phase D reads it

  // ---- phase D -----------------------------------------------------------------------------------------
  int32_t* dsm = reinterpret_cast<int32_t*>(smem);
  const int64_t dsm_ints = S::kPeersOff / 4;
  constexpr int kPlain = CommBatch<CL1::kCtasPerSm>::kPullPlain;
  auto dispatch = [&](const symm::Workers& Wd) {
    if (p.idx_bytes == 8) {
      if (p.dedup) dispatch_phase<int64_t, kPullUnroll, true>(st_s, p.onepass, s_peers, dsm, dsm_ints, Wd);
      else dispatch_phase<int64_t, kPlain, false>(st_s, p.onepass, s_peers, dsm, dsm_ints, Wd);
    } else {
      if (p.dedup) dispatch_phase<int32_t, kPullUnroll, true>(st_s, p.onepass, s_peers, dsm, dsm_ints, Wd);
      else dispatch_phase<int32_t, kPlain, false>(st_s, p.onepass, s_peers, dsm, dsm_ints, Wd);
    }
  };
  if constexpr (CL1::kCtasPerSm == 2) {
    using DR = CommRegs;
    if (tid < 128) {
      ptx::setmaxnreg_dec<DR::kProducer>();
      // The producer warpgroup takes its registers back only after the math warpgroups returned theirs: an
      // inc right after its dec could re-take the registers it had just freed before their inc, which would
      // then wait forever (setmaxnreg has no time limit; the first build of this hung the H200).
      ptx::barrier_sync_any(kRegBarrier, kThreads);
      ptx::setmaxnreg_inc<DR::kLaunchRegs>();
    } else {
      ptx::setmaxnreg_inc<DR::kMath>();  // waits for the producer warpgroup's dec
      dispatch(dispatch_group());
      __syncwarp();  // setmaxnreg is .sync.aligned: whole warps (end_call's tail is the leader's alone)
      ptx::setmaxnreg_dec<DR::kLaunchRegs>();
      ptx::barrier_arrive_any(kRegBarrier, kThreads);
    }
  } else {
    dispatch(W);
  }
  stamp(1);
  // The generic-proxy smem writes of phase D before the GEMMs' TMA writes into the same bytes.
  ptx::fence_proxy_async_smem();
  // From here on the starts come from shared memory (FusedState), not from dc / cc. The GEMM phases and
  // the grid barriers report through a sink built from kernel parameters (constant bank: no register,
  // no shared-memory load in their loops; the call's epoch is not recorded, 0): a sink referenced in
  // shared memory inside those loops cost the kernel its uniform datapath (load_deadline says how).
  const moe::ErrSink err{p.err_dev, p.host_err, L.rank, 0u};
  bool ok = symm::grid_barrier_gpu(W, p.grid_words + kBarPool, load_deadline(st), err, MOE_PHASE_GRID0 + kBarPool);
  int* const s_ok = &st->grid_ok;
  stamp(2);

  // ---- phases L1, L2 ---------------------------------------------------------------------------------------
  fg::SmemView<R1> sm1{smem};
  fg::SmemView<R2> sm2{smem};
  fg::fill_decode_table(sm1, tid, kThreads);
  if (tid == 0) {  // ordered before every use by the __syncthreads below
    fg::init_ring(sm1);
    fg::init_ring(sm2);
    st->q1.init();
    st->q2.init();
  }
  Sched1::build_table(p.pb1, sm1.unit_table(), reinterpret_cast<int*>(sm1.epilogue()), tid, 0);
  __syncthreads();
  // Each table its own 12 scratch ints: with the setmaxnreg hand-off of phase D before the tables,
  // racecheck reported Sched1's scratch writes against Sched2's reads (4 hazards at T 9) although two CTA
  // barriers separate them; a setmaxnreg pair alone before the unchanged tables drew hazards inside one
  // build_table, across its aligned barrier (8, T 9). Disjoint scratch: clean, and costs nothing.
  static_assert(R1::kEpilogueBytes >= 2 * 16 * 4 && Sched2::kTableThreads / 32 <= 16, "two scratch runs");
  Sched2::build_table(p.pb2, table2, reinterpret_cast<int*>(sm1.epilogue()) + 16, tid, 0);
  __syncthreads();
  // The roles keep their register budgets until the combine: every CTA barrier and grid barrier below is
  // reached from inside both branches, so ptxas sees one budget per region. Those barriers are therefore
  // met at different code locations: barrier.sync without .aligned (Wr).
  symm::Workers Wr = W;
  Wr.any_pc = true;
  // The math threads' pipeline and tile-ring waits get a longer limit than the waits that can stop their
  // producer (its pool-block and grid waits: the call's deadline; its ring waits: timeout_ns). So either a
  // stage's data arrives for every math thread or it never arrives and they all time out at the same stage:
  // with equal per-thread limits one warpgroup could give up just before a late stage landed while the other
  // took it and went on into a 256-thread barrier (split-K arrival, L1 epilogue) that the first never
  // reaches, a hang no limit could end.
  const uint64_t math_timeout_ns = 2 * p.timeout_ns + kMathSlackNs;

  // ---- phase C (after both roles' grid barrier 2): every rank's L2 rows and the dispatch's peer stores are
  // ordered before the start signal by grid barrier 2 (kInKernel: a released signal).
  // Not after a timeout in this rank's call (any CTA's: every claim and report precedes its CTA's arrival at
  // grid barrier 2, whose acquire orders this load after them): its L2 rows may be incomplete, and the
  // peers would pull them without an error. Skipped, the peers time out waiting for this rank's start
  // signal and raise too; a timeout asks every rank for resync() anyway. (Other errors, e.g. a capacity
  // overflow, keep the combine: they need no resync and the epochs stay in step.)
  // Wc: the whole CTA (lead 0), or at two CTAs per SM the math warpgroups (lead 128) at the dispatch's budget,
  // called inside their branch: after the roles' branches merge ptxas allocates for the smaller budget (the
  // producer's 24), which spilled the combine callee 624-760 bytes.
  // The GEMM roles' timeouts (fp4_gemm's pipeline and the tile ring: a ring timeout ends the role as if
  // its tiles were done) only claimed the record: fill it, or the host mirror, which the layer reads,
  // would never see them. Each claiming thread's CAS precedes this CTA's barriers after its role (bar 0 of
  // the grid barriers), hence this load of the lead thread (one L2 load per CTA where nothing failed); a
  // claim in another CTA is filled by that CTA's lead.
  constexpr bool kMathComm = CL1::kCtasPerSm == 2;
  auto phase_c = [&](const symm::Workers& Wc, int lead) {
    if (tid == lead) st->failed = needs_resync(ptx::ld_relaxed_gpu_s32(p.err_dev));
    Wc.sync();
    if (!st->failed) combine_phase<CommBatch<CL1::kCtasPerSm>::kCombineK>(st_s, s_peers, p.y, Wc);
    if (p.stamps != nullptr && tid == lead) p.stamps[int64_t(blockIdx.x) * kStamps + 7] = ptx::globaltimer_ns();
    static_assert(fg::Err::kTimeoutEmpty == fg::Err::kTimeoutFull + 1, "the claim-only codes, one range");
    if (tid == lead) moe::fill_claimed_error(err, fg::Err::kTimeoutFull, fg::Err::kTimeoutEmpty);
  };
  if (tid < 128) {
    ptx::setmaxnreg_dec<Regs::kProducer>();
    if (tid == 0) ptx::fence_proxy_async_global();  // TMA reads pool rows other CTAs' generic stores wrote
    if (__all_sync(0xffffffffu, ok))  // (as for the math warpgroups' L1 below)
      produce_phase<R1>(sm1, &tmap_pool, p.pb1, p.w1, p.x1, sm1.unit_table(), err, p.timeout_ns, &st->q1,
                         p.grid_words + kCountL1);
    stamp(3);
    const bool all1 = symm::grid_barrier_gpu(Wr, p.grid_words + kBarL1, load_deadline(st), err, MOE_PHASE_GRID0 + kBarL1, s_ok);
    ok = all1 && ok;
    stamp(4);
    // Every CTA took its last L1 unit before arriving; after a timeout a late CTA may still take units, so
    // the counter stays as it is (the call holds its error; resync() zeroes the grid words).
    if (all1 && tid == 0 && blockIdx.x == 0) p.grid_words[kCountL1] = 0;
    Wr.sync();  // (the math threads fill L2's decode table here)
    Wr.sync();
    if (tid == 0) ptx::fence_proxy_async_global();  // TMA reads L1 rows other CTAs' epilogues wrote
    produce_phase<R2>(sm2, &tmap_l1, p.pb2, p.w2, p.x2, table2, err, p.timeout_ns, &st->q2,
                       p.grid_words + kCountL2);  // unguarded: below
    stamp(5);
    const bool all2 = symm::grid_barrier_gpu(Wr, p.grid_words + kBarL2, load_deadline(st), err, MOE_PHASE_GRID0 + kBarL2, s_ok);
    ok = all2 && ok;
    stamp(6);
    if (all2 && tid == 0 && blockIdx.x == 0) p.grid_words[kCountL2] = 0;  // (as for L1)
    __syncwarp();  // (thread 0's stores and stamps above: setmaxnreg needs the whole warp)
    if constexpr (kMathComm) ptx::setmaxnreg_dec<CommRegs::kProducer>();  // idle to its exit (phase C: the math's)
    else ptx::setmaxnreg_inc<Regs::kLaunchRegs>();
  } else {
    ptx::setmaxnreg_inc<Regs::kMath>();
    const int wg = (tid - 128) / 128, tid_in_wg = tid % 128;
    // `ok` through a warp vote: ptxas cannot tell that grid barrier 0's __syncthreads_and result is uniform,
    // and a branch on it around the mainloop made the whole L1 loop divergent for it (stage index,
    // descriptors and barrier addresses in vector registers, R2UR before every wgmma: 334 instead of 313
    // instructions per pair of K blocks at the 8-token tile, SASS 2026-12-04). The vote's result is uniform.
    if (__all_sync(0xffffffffu, ok))
      math_phase<R1, fg::EpilogueKind::kL1>(sm1, p.pb1, p.w1, p.e1, sm1.unit_table(), wg, tid_in_wg, err,
                                            math_timeout_ns, &st->q1, p.grid_words + kCountL1);
    ptx::fence_proxy_async_smem();  // L1's epilogue smem writes before L2's TMA writes into the same bytes
    ok = symm::grid_barrier_gpu(Wr, p.grid_words + kBarL1, load_deadline(st), err, MOE_PHASE_GRID0 + kBarL1, s_ok) && ok;
    Wr.sync();  // every L1 read of the plan done
    fg::fill_decode_table(sm2, tid - 128, fg::kMathThreads);  // (L2's ring: initialised before the split)
    Wr.sync();
    // L2 runs even after a failed barrier (the call already holds its error; both roles run it, so
    // nothing waits for a tile that never comes): `ok` comes from a shared-memory broadcast, and a
    // branch on it around the mainloop made ptxas treat the loop as divergent (vector registers for
    // its uniform addresses, as above).
    ptx::named_barrier(kL1Barrier, fg::kMathThreads);  // .aligned at one code location: converged (ptxas)
    math_phase<R2, fg::EpilogueKind::kBF16>(sm2, p.pb2, p.w2, p.e2, table2, wg, tid_in_wg, err, math_timeout_ns,
                                            &st->q2, p.grid_words + kCountL2);
    ok = symm::grid_barrier_gpu(Wr, p.grid_words + kBarL2, load_deadline(st), err, MOE_PHASE_GRID0 + kBarL2, s_ok) && ok;
    if constexpr (kMathComm) {
      ptx::setmaxnreg_inc<CommRegs::kMath>();
      phase_c(dispatch_group(), 128);
    } else {
      ptx::setmaxnreg_dec<Regs::kLaunchRegs>();
    }
  }

  if constexpr (!kMathComm) phase_c(W, 0);
}

}  // namespace
}  // namespace megamoe
