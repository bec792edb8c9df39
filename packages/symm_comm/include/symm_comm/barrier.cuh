// symm_comm/barrier.cuh — grid barriers among a kernel's groups (atomic words with the bit-31 flip,
// time limit), a call's start / end (begin_call, end_call), the ordering policy (Order) and the
// cross-rank barriers: combine's start signal (monotonic epochs stored with st.release.sys /
// red.max.sys) and dispatch's counted barrier (per-group red.release.sys, 2^32 per call), both polled with ld.acquire.sys under a time limit. No word is ever reset between calls: they only grow
// (or flip bit 31 once per barrier), so a late reader can never see a value from a reset race. On a
// timeout the functions report to the error word and return false; the caller returns from the kernel.
#pragma once
#include <stdint.h>
#include "symm_comm/errors.cuh"
#include "symm_comm/layout.cuh"
#include "symm_comm/peers.cuh"
#include "symm_comm/ptx.cuh"
#include "symm_comm/workers.cuh"

#if defined(__CUDACC__)
namespace symm {

__device__ __forceinline__ bool timed_out(uint64_t deadline) { return ptx::globaltimer_ns() > deadline; }

// Where a phase's inputs were written, i.e. what orders them before the phase (a compile-time policy:
// the standalone kernels pick kKernelBoundary, a fused kernel kInKernel). Each use says what it changes.
enum class Order {
  kKernelBoundary,  // by an EARLIER launch on this stream: the kernel boundary publishes them (local data
                    // may be read through the non-coherent path, a signal may be relaxed)
  kInKernel,        // earlier in the SAME launch (other groups / roles of this kernel): coherent loads
                    // after an acquire, every publication a release
};

// Grid barrier among the first n groups, run by ONE warp per group, for data local to this GPU
// (dispatch's one-pass metadata scan). gpu scope on purpose: a fence.sys would also wait for the
// warp's outstanding peer stores, which the cross-rank barrier orders later anyway.
// Contract: every lane fences (fence.acq_rel.gpu) its own writes, __syncwarp, lane 0 arrives with
// atom.add.acq_rel.gpu with the bit-31 flip increments (group 0 adds 0x80000000 - (n - 1), the
// others 1: each completed barrier adds exactly 2^31, so the word needs no reset and any n works).
// Lane 0 alone polls with relaxed loads until bit 31 flipped (an acquire per poll is a CCTL.IVALL:
// the whole L1 of the SM, the co-resident CTA's too, invalidated per iteration), then EVERY lane
// reads the word once with ld.acquire.gpu: the flip is final for the launch (each barrier has its
// own word), so each lane's own acquire synchronises with every group's arrival and its later loads
// are ordered after all n groups' pre-barrier writes without relying on __syncwarp for cumulativity.
// No warp-collective operation inside the loop: a vote / shuffle loop here cost the kernel after it
// its uniform datapath (ptxas kept the GEMM mainloop's stage and smem addresses in vector registers,
// +12 % instructions in the fused kernel's math loop, SASS of 2026-12-02). Time limit: lane 0
// reports (what = -1, detail = the word) and every lane returns false.
__device__ __forceinline__ bool warp_grid_barrier_gpu(uint32_t* bar, bool first_group, uint32_t n, int lane,
                                                      uint64_t deadline, const ErrSink& err, int phase) {
  ptx::fence_acq_rel_gpu();
  __syncwarp();
  bool ok = true;
  if (lane == 0) {
    const uint32_t old = ptx::atom_add_acq_rel_gpu_u32(bar, first_group ? (0x80000000u - (n - 1u)) : 1u);
    int spins = 0;
    uint32_t cur;
    while ((((cur = ptx::ld_relaxed_gpu_u32(bar)) ^ old) & 0x80000000u) == 0) {
      if ((++spins & 63) == 0 && timed_out(deadline)) {
        report_error(err, SYMM_ERR_TIMEOUT, phase, -1, (int32_t)cur);
        ok = false;
        break;
      }
    }
  }
  ok = __shfl_sync(0xffffffffu, ok, 0);
  if (ok) (void)ptx::ld_acquire_gpu_u32(bar);
  return ok;
}

// Thread `r` (r < num_ranks) of ONE group publishes `epoch` to rank r's signal slot for this rank.
__device__ __forceinline__ void rank_signal(const uint64_t* peers, const SymmLayout& L, int op, uint64_t epoch,
                                            int r) {
  if (r < L.num_ranks) ptx::st_release_sys_u64(signals(peers[r], L, op) + L.rank, epoch);
}
// The same with red.release.sys.max: for a slot that two CTAs of one call publish into (the word keeps
// the larger value whichever lands last).
// relaxed: no release (the caller publishes nothing written by this kernel; see its contract).
__device__ __forceinline__ void rank_signal_max(const uint64_t* peers, const SymmLayout& L, int op, uint64_t value,
                                                int r, bool relaxed = false) {
  if (r >= L.num_ranks) return;
  if (relaxed) ptx::red_max_relaxed_sys_u64(signals(peers[r], L, op) + L.rank, value);
  else ptx::red_max_release_sys_u64(signals(peers[r], L, op) + L.rank, value);
}

// Thread `r` (r < num_ranks) of EVERY group waits until rank r's word for us is >= want.
// Returns false on timeout (error reported, what = r, detail = the word >> detail_shift).
// seen (optional): the word the successful acquire observed (callers that inspect it need no second
// load: one dependent round trip fewer).
__device__ __forceinline__ bool rank_wait(uint64_t local_base, const SymmLayout& L, int op, uint64_t want, int r,
                                          uint64_t deadline, const ErrSink& err, int phase, int detail_shift = 0,
                                          uint64_t* seen = nullptr) {
  if (r >= L.num_ranks) return true;
  const uint64_t* sig = signals(local_base, L, op) + r;
  uint64_t v;
  int spins = 0;
  while ((v = ptx::ld_acquire_sys_u64(sig)) < want) {
    if ((++spins & 15) == 0 && timed_out(deadline)) {
      report_error(err, SYMM_ERR_TIMEOUT, phase, r, (int32_t)(v >> detail_shift));
      return false;
    }
  }
  if (seen) *seen = v;
  return true;
}

// ---- one-hop cross-rank barrier (dispatch): no grid barrier in front of it -------------------------
// Every group of rank s adds to signals[op][s] in EVERY rank r (itself included) once per call: group 0
// adds 2^32 - (n - 1), the others 1 (n = W.ngroups of s), so a completed call adds exactly 2^32 and
// "word >= epoch << 32" holds iff all n groups of s arrived for this epoch (no reset, any n per call).
// Contract: group barrier (bar.red), then the arrival is a red.release.sys by thread r (cumulative over
// the group: every thread's earlier writes — peer metadata, own staging — precede it in causality order
// through the barrier, as in cooperative groups' grid sync, where one thread fences after
// __syncthreads). The waiter's ld.acquire.sys of the word therefore makes every write of every group of
// s made before its arrival visible: the metadata s pushed here and the staging it will read from.
// Writes of threads OUTSIDE the group (other roles of a fused kernel's CTA) are not covered.
// (No per-thread fence.acq_rel.sys before the arrival: not needed by the model; measured 2.5-3.6 us per
// CTA at 1 and 128 tokens even in CTAs that stored only locally: 2112 warps' MEMBAR.SYS, per-CTA stamps.)
// All threads of the group call it; returns the same bool in every thread (false: timeout reported,
// what = the rank waited for). arrive = false in any thread (its part of phase A failed, error
// reported): the group neither arrives nor waits, so the peers time out instead of reading incomplete
// data (a timeout always needs resync(), which resets the signals).
__device__ __forceinline__ bool rank_barrier_counted(const Workers& W, const uint64_t* peers, uint64_t local_base,
                                                     const SymmLayout& L, int op, uint64_t epoch, uint64_t deadline,
                                                     const ErrSink& err, int phase, bool arrive = true) {
  if (!W.sync_and(arrive)) return false;
  const int r = W.tid();
  if (r < L.num_ranks) {
    const uint64_t inc = W.group == 0 ? ((uint64_t)1 << 32) - (uint64_t)(W.ngroups - 1) : (uint64_t)1;
    ptx::red_add_release_sys_u64(signals(peers[r], L, op) + L.rank, inc);
  }
  const bool ok = rank_wait(local_base, L, op, epoch << 32, r, deadline, err, phase, /*detail = epochs*/ 32);
  return W.sync_and(ok);
}

// ---- grid barrier among the groups, gpu scope (a fused kernel between its phases) -------------------
// All threads of every group: group barrier, warp 0 runs warp_grid_barrier_gpu on `word` (a u32 the
// CALLER owns, zero when first used, used by no other barrier; it never needs a reset), group barrier.
// Every write any thread of any group made before it (local or to peers) precedes, in causality order,
// every access of any thread of any group after it. Returns false in every thread of the group on a
// timeout (reported by warp 0: what = -1, detail = the word).
// s_ok: null = the result through the group's reduction barrier (bar.red.and); else a shared-memory
// int of the group through which warp 0 broadcasts it between two plain group barriers: for groups
// whose threads meet the barrier from different code locations (Workers::any_pc), where bar.red is
// reported by compute-sanitizer synccheck ("divergent threads in block"). Reuse of *s_ok by the next
// call is safe: every reader reads it before it reaches that call's first group barrier, after which
// alone warp 0 writes it again.
__device__ __forceinline__ bool grid_barrier_gpu(const Workers& W, uint32_t* word, uint64_t deadline,
                                                 const ErrSink& err, int phase, int* s_ok = nullptr) {
  bool ok = true;
  W.sync();
  if (W.warp == 0) ok = warp_grid_barrier_gpu(word, W.group == 0, (uint32_t)W.ngroups, W.lane, deadline, err, phase);
  if (s_ok == nullptr) return W.sync_and(ok);
  if (W.warp == 0 && W.lane == 0) ptx::st_shared_s32(s_ok, ok ? 1 : 0);
  W.sync();
  return ptx::ld_shared_s32(s_ok) != 0;
}

// ---- start of a call: peers, this call's epoch, its time limit and error sink ------------------------
struct CallStart {
  uint64_t local;     // this rank's buffer base
  uint64_t epoch;     // this call of `op`: the last completed epoch + 1
  uint64_t deadline;  // %globaltimer limit of every wait of the call
  ErrSink err;
};
// The CallStart of op on the buffer at `local` with the given deadline: its last completed epoch + 1 (a relaxed
// load: why below) and the error sink of that call.
__device__ __forceinline__ CallStart call_start_at(uint64_t local, const SymmLayout& L, int op, uint64_t deadline,
                                                   int32_t* host_err) {
  const uint64_t epoch = ptx::ld_relaxed_gpu_u64(state_epoch(local, L) + op) + 1;
  return CallStart{local, epoch, deadline, ErrSink{state_err(local, L), host_err, L.rank, (uint32_t)epoch}};
}
// All threads of the group: copies the peer table to s_peers (the group's shared memory, >= num_ranks
// entries) and reads the op's last completed epoch with a relaxed load. Why relaxed suffices: the epoch
// was published by the previous call's last group out (end_call), in an EARLIER launch on this stream,
// and the kernel boundary orders it. A fused kernel may run dispatch and combine in one launch (their
// epochs and end words are separate) but each op at most once per launch, so both epochs it reads come
// from earlier launches; it may call begin_call for both ops at its start (begin_next_call: the second).
__device__ __forceinline__ CallStart begin_call(const Workers& W, const SymmLayout& L, const uint64_t* peers_g,
                                                uint64_t* s_peers, int op, int32_t* host_err, uint64_t timeout_ns) {
  const uint64_t deadline = ptx::globaltimer_ns() + timeout_ns;
  load_peers(s_peers, peers_g, L.num_ranks, W.tid(), W.nthreads());
  W.sync();
  return call_start_at(s_peers[L.rank], L, op, deadline, host_err);
}

// A second op's start in the same launch (a fused kernel running dispatch and combine, each once), after
// begin_call of the first: the same CallStart as a second begin_call (same peer table, same deadline) without
// its reload of the table and its group barrier, so both epochs' loads are in flight together (the fused
// kernel's start to its dispatch's first stamp, 1 rank, 1 / 16 tokens: 2.5-2.7 -> 1.9-2.3 us,
// experiments/fused_d_stamps.py, 2026-12-04).
__device__ __forceinline__ CallStart begin_next_call(const CallStart& first, const SymmLayout& L, int op,
                                                     int32_t* host_err) {
  return call_start_at(first.local, L, op, first.deadline, host_err);
}

// ---- end of a call: the last group out publishes the op's completed epoch ---------------------------
// All threads of every group, on EVERY exit path (errors included): group barrier, then the leader
// adds (atom.acq_rel.gpu) to the op's end word (state_grid_bar: one word per op, so a dispatch and a
// combine in one launch never share one) with the bit-31 flip increments, so the word's low 31 bits
// are back to 0 after each call (nobody waits). Only the last arrival sees the low 31 bits at 0; it
// stores the epoch, which the next launch on this stream reads at its start (kernel boundary orders
// it; begin_call). No group of this launch reads the epoch again. Returns true in the leader of the
// last group out.
__device__ __forceinline__ bool end_call(const Workers& W, uint64_t local, const SymmLayout& L, int op,
                                         uint64_t epoch) {
  W.sync();
  if (!W.leader()) return false;
  const uint32_t inc = W.group == 0 ? (0x80000000u - (uint32_t)(W.ngroups - 1)) : 1u;
  const uint32_t old = ptx::atom_add_acq_rel_gpu_u32(state_grid_bar(local, L, op), inc);
  if (((old + inc) & 0x7fffffffu) != 0u) return false;
  ptx::st_relaxed_gpu_u64(state_epoch(local, L) + op, epoch);
  return true;
}

// Diagnostics: %globaltimer into state stamp i (one thread; plain local store, read by the host).
__device__ __forceinline__ void stamp(uint64_t local, const SymmLayout& L, int i) {
  state_stamps(local, L)[i] = ptx::globaltimer_ns();
}

}  // namespace symm
#endif
