"""Exceptions and the decoding of the device error word (include/symm_comm/errors.cuh)."""
from __future__ import annotations


class SymmCommError(RuntimeError):
    """An error a symm_comm kernel reported (bad expert id, capacity overflow, ...)."""

    def __init__(self, msg: str, words: tuple | None = None):
        super().__init__(msg)
        self.words = words
        if words:
            self.code, self.rank, self.phase, self.what, self.detail, self.epoch = words[:6]


from ._native import NoCudaDeviceError, require_cuda_device  # noqa: E402  (one error for every package)


def require_cuda(what: str = "symm_comm.Buffer") -> None:
    """NoCudaDeviceError (not torch's AssertionError) on a CPU-only torch or without a visible GPU."""
    require_cuda_device(what)


class SymmTimeoutError(SymmCommError, TimeoutError):
    """A spin-wait (grid or cross-rank barrier) passed its time limit; the kernel returned."""


CODES = {1: "timeout", 2: "expert id out of range", 3: "pool capacity exceeded",
         4: "more slots than max_tokens_per_rank for one (expert, source) (duplicate expert ids in a token?)",
         5: "expert_out has fewer rows than the pool uses", 6: "masked layout: an expert got more than max_m rows",
         7: "ranks disagree on the combine mode (every rank must pass buf.combine_input() as expert_out, or none)",
         8: "pull combine: a row has no valid owner row (the dispatch failed, or cmb_in_rows is below the pool rows used)",
         9: "dispatch scratch (shared memory) smaller than the phase needs"}
PHASES = {1: "dispatch phase A (scan, metadata to the owners)", 2: "dispatch metadata scan (grid barrier between this rank's CTAs)", 3: "dispatch cross-rank barrier",
          4: "dispatch phase B (pool layout)", 5: "combine peer stores",
          7: "combine start (peers finishing their previous combine)",
          8: "combine reduce (row arrivals)",
          10: "pull combine (owners' start signals, their rows)",
          11: "pool consumer waiting for a block's rows (wait_block)",
          12: "grid barrier between a fused kernel's phases"}


def register_phases(phases: dict) -> None:
    """Phase names of a kernel that reports into a buffer's error record with its own phase numbers
    (megamoe's fused kernel: 64 + its grid barrier); symm_comm's own numbers cannot be redefined."""
    for k, v in phases.items():
        if PHASES.get(k, v) != v:
            raise ValueError(f"phase {k} is already {PHASES[k]!r}")
        PHASES[k] = v


# Codes another package's kernels write into a buffer's record (fp4_gemm's 32..63 from megamoe's fused
# kernel): code -> (describe(words) -> text, is_timeout).
FOREIGN_CODES: dict = {}


def register_codes(codes: dict, describe_fn, timeouts=()) -> None:
    """Codes outside symm_comm's range (1..31) that a kernel reporting into a buffer's error record writes:
    `describe_fn(words)` gives their text; those in `timeouts` raise SymmTimeoutError and need a resync."""
    timeouts = {int(t) for t in timeouts}
    for c in codes:
        if c < 32:
            raise ValueError(f"code {c} is in symm_comm's own range 1..31")
        FOREIGN_CODES[int(c)] = (describe_fn, int(c) in timeouts)


def is_timeout(code: int) -> bool:
    return code == 1 or FOREIGN_CODES.get(int(code), (None, False))[1]


def describe(words) -> str:
    code, rank, phase, what, detail, epoch = (int(w) for w in words[:6])
    if code in FOREIGN_CODES:
        return (f"rank {rank}: {FOREIGN_CODES[code][0](words)}" +
                (". After a timeout call resync() on all ranks" if FOREIGN_CODES[code][1] else ""))
    ph = PHASES.get(phase, f"phase {phase}")
    ep = f" (epoch {epoch})" if epoch else ""  # 0: a phase that reports without the call's epoch (fused GEMMs)
    if code == 1 and phase == 8:
        return (f"rank {rank}: timed out in {ph}{ep} waiting for the expert rows of token {what} "
                f"(from any rank); {detail} had arrived. Every rank must make the same sequence of "
                "dispatch/combine calls; after a timeout call buf.resync() on all ranks")
    if code == 1:
        who = "the other CTAs of this rank (grid barrier)" if what < 0 else f"rank {what}"
        return (f"rank {rank}: timed out in {ph}{ep} waiting for {who}; last value seen {detail}. "
                "Every rank must make the same sequence of dispatch/combine calls; after a timeout call "
                "buf.resync() on all ranks")
    if code == 2:
        return f"rank {rank}: topk_idx holds expert id {detail} at flat index {what} (token {what}//topk), " \
               "outside [-1, num_experts)"
    if code == 3:
        return f"rank {rank}: pool capacity exceeded in {ph}: {what} rows needed, capacity {detail} rows " \
               "(raise pool_rows); nothing was written"
    if code == 4:
        return f"rank {rank}: {CODES[4]}: expert {what} got {detail} slots"
    if code == 5:
        return f"rank {rank}: {CODES[5]}: pool uses {what} rows, expert_out has {detail}"
    if code == 6:
        return f"rank {rank}: {CODES[6]}: local expert {what} got {detail} rows (raise max_m)"
    if code == 7:
        return f"rank {rank}: {CODES[7]}: rank {what} differs (epoch {epoch})"
    if code == 8:
        return f"rank {rank}: {CODES[8]}: token {what}, k {detail} (epoch {epoch})"
    return f"rank {rank}: error code {code} in {ph} (what {what}, detail {detail})"


def make_error(words) -> SymmCommError:
    cls = SymmTimeoutError if is_timeout(int(words[0])) else SymmCommError
    return cls("symm_comm: " + describe(words), tuple(int(w) for w in words))
