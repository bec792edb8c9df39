"""megamoe.MegaMoE: the expert-parallel MoE layer (DESIGN.md section 1) on Hopper GPUs.

    layer = MegaMoE(weights, max_tokens_per_rank=T_max, topk=K)          # one GPU: all experts local
    layer = MegaMoE(local_weights, group=pg, max_tokens_per_rank=T_max, topk=K)  # R ranks, one GPU each
    y = layer(x, topk_idx, topk_w)  # x BF16 [T, H], ids int32/int64 [T, K] (-1: none), weights FP32 [T, K]

backend="fused" runs ONE persistent kernel per rank after the input quantisation (libmegamoe.so,
csrc/fused.cu): the same device code as the staged kernels (symm_comm's dispatch and pull-combine
workers, fp4_gemm's mainloop and epilogues) in one launch, so its output is bitwise the staged one.
backend="auto" picks per call (AUTO_FUSED_MAX_TOKENS).
backend="staged" runs four kernels from the standalone packages on the current stream:
  quantize (fp4_gemm) -> dispatch (symm_comm, expert-major pool) -> L1 grouped GEMM (SwiGLU x top-k
  weight -> FP8 + per-128 scales, preallocated) -> L2 grouped GEMM (BF16 rows straight into the pull
  combine's input region of the symmetric buffer) -> pull combine (FP32 sum over k in slot order -> BF16).
No host synchronisation and no allocation inside a call except y (and, while fp4_gemm's quantiser
has no `out=`, its FP8 / scale outputs), so calls can be captured into CUDA graphs.

One rank (torch.distributed not initialised, group=None) and R ranks (a process group, one process
per GPU) run the same code: symm_comm.Buffer is a plain allocation in the first case.
"""
from __future__ import annotations

import logging
import math

import torch

from . import _ops
from ._validate import LayerConfig, check_forward, check_ids as _check_ids, check_layer_args
from .weights import SCALE_GROUP, check_weights, weight_bytes

log = logging.getLogger("megamoe")

__all__ = ["MegaMoE", "AUTO_FUSED_MAX_TOKENS"]

# backend="auto": the fused kernel up to this many tokens per rank, the staged pipeline above. -1: staged at
# every size, as measured (bench/results/moe-flash-pro-1r-2026-12-04-59ae151.md: the fused kernel takes
# 1.01-1.17x the staged call's time at 1..8192 tokens on one H200; docs/perf-notes.md says why).
AUTO_FUSED_MAX_TOKENS = -1


_SPLITK = {}  # device index -> the layers' shared fp4_gemm SplitKWorkspace


def _shared_splitk(ops, device):
    d = device.index
    if d not in _SPLITK:
        _SPLITK[d] = ops.SplitKWorkspace(device)
    return _SPLITK[d]


class MegaMoE(torch.nn.Module):
    """The MoE layer of one rank. Rank r of R holds experts [r*E/R, (r+1)*E/R).

    weights: megamoe.ExpertWeights (or megamoe.reference.MoEWeights) holding this rank's experts:
        w1 TransformedWeights [E_local, 2I, H] (gate_up_interleave=True), w2 [E_local, H, I];
        H and I multiples of 128.
    group: the process group (None: the default group if torch.distributed is initialised, else one rank).
    max_tokens_per_rank: the most tokens one call takes (sizes the buffer and the intermediates).
    topk: experts per token (K).
    activation_clamp: c of the SwiGLU clamp (gate <= c, -c <= up <= c); inf: none.
    pow2_scales: round the FP8 scales (input and L2 input) up to powers of two.
    backend: "staged" (four kernels), "fused" (one kernel after the quantisation; bitwise equal to staged) or
        "auto" (fused where the benchmark measured it faster: T <= AUTO_FUSED_MAX_TOKENS, else staged).
    comm_backend: symm_comm's symmetric memory backend ("torch", "nvshmem", "ipc"); unused with one rank.
    timeout_s: symm_comm's cross-rank wait limit (an error naming rank and phase instead of a hang).
    check_ids: check topk_idx against [-1, E) on the host before each call (one device -> host sync). Skipped
        automatically under CUDA-graph capture and torch.compile tracing; with it off (or there), the
        dispatch kernel's own device-side error word still reports a bad id: the next call on the layer
        (or layer.check_errors()) raises it, and that call's output is undefined.

    splitk_workspace: the fp4_gemm.ops.SplitKWorkspace its few-token GEMMs use (None: one per device, shared
        by every layer on it, whose calls run in stream order; give a layer called concurrently with another
        on a different stream its own).
    pool_rows: the dispatch pool's capacity in rows (0: the worst case, every rank's tokens x topk, so it never
        overflows). Smaller saves memory; a call that needs more raises SymmCommError (pool overflow; nothing
        is computed for it) from the next call or check_errors(), and the layer stays usable.

    forward is COLLECTIVE for R > 1: every rank must call it, the same number of times, in the same order
    (T may differ per rank, T = 0 included), on one stream per layer. An argument error is raised on the
    rank that sees it before anything is launched (that rank's layer stays usable), but its peers, which
    did launch, then time out (SymmTimeoutError naming rank and phase): call layer.resync() on
    every rank before the next call. Under torch.compile keep the output used: the op is functional, so
    a call whose result is unused may be eliminated on one rank and not on another.
    """

    def __init__(self, weights, *, max_tokens_per_rank: int, topk: int, group=None,
                 activation_clamp: float = math.inf, pow2_scales: bool = False, backend: str = "staged",
                 comm_backend: str = "torch", timeout_s: float = 10.0, device=None, check_ids: bool = True,
                 num_sms: int = 0, pool_rows: int = 0, verbose: bool = False, splitk_workspace=None):
        super().__init__()
        check_layer_args(max_tokens_per_rank=max_tokens_per_rank, topk=topk, activation_clamp=activation_clamp,
                         backend=backend, timeout_s=timeout_s)
        from symm_comm.buffer import resolve_group  # lazy: symm_comm's torch parts
        self._single, group, R, r = resolve_group(group)
        shapes = check_weights(weights, R, r)  # CPU-checkable: before anything touches a GPU
        from symm_comm.errors import require_cuda
        require_cuda("megamoe.MegaMoE")
        from fp4_gemm import ops
        self._ops = ops

        dev_index = None if device is None else torch.device(device).index
        self.device = torch.device("cuda", torch.cuda.current_device() if dev_index is None else dev_index)
        self.num_ranks, self.rank, self.group = R, r, group
        self.num_experts, self.num_local_experts = shapes.num_experts, shapes.num_local
        self.hidden, self.intermediate, self.topk = shapes.hidden, shapes.intermediate, topk
        self.experts = shapes.experts
        self.max_tokens = max_tokens_per_rank
        self.activation_clamp = float(activation_clamp)
        self.pow2_scales = bool(pow2_scales)
        self.backend = backend
        self.check_ids = bool(check_ids)
        self.config = LayerConfig(self.num_experts, self.hidden, self.intermediate, topk, max_tokens_per_rank,
                                  self.device)
        n_clamped = int(getattr(weights.w1, "n_clamped", 0)) + int(getattr(weights.w2, "n_clamped", 0))
        if n_clamped:
            log.warning("megamoe: up to %d weight groups were clamped by the FP4 -> FP8 transform (lossy; a count over "
                        "the weight set these experts came from)", n_clamped)

        with torch.cuda.device(self.device):
            self.w1 = ops.prepare_weights(weights.w1, device=self.device)
            self.w2 = ops.prepare_weights(weights.w2, device=self.device)
            if not self.w1.gate_up_interleave:
                raise ValueError("w1: the packed weights lost gate_up_interleave")
            import symm_comm
            self.buffer = symm_comm.Buffer(group, self.num_experts, self.hidden, topk, max_tokens_per_rank,
                                           block_m=128, pool_rows=pool_rows, backend=comm_backend, timeout_s=timeout_s,
                                           num_sms=num_sms, check=False, device=self.device,
                                           combine_input_rows=-1, single_rank=self._single)
            if backend != "staged":
                from . import _lib
                _lib.LIB.require()  # before anything is allocated: a missing libmegamoe.so names itself
                self._mlib = _lib.LIB
                from symm_comm.errors import register_codes, register_phases
                register_phases(_lib.PHASES)
                codes, timeouts = self._ops.error_codes()  # the GEMM roles report into the buffer's record
                register_codes(codes, self._ops.describe_error, timeouts)
                # the fused kernel's rank-local grid words (include/megamoe/layout.cuh kGridWords: the grid
                # barriers' words and the tile counters; zero at creation and after resync(); a call that
                # completes leaves them consistent, one that timed out needs the resync)
                self._grid_words = torch.zeros(_lib.grid_words(), dtype=torch.int32, device=self.device)
                # profiling only (bench/fused_phases.py): an int64 [2 x SMs, 9] tensor here makes the kernel
                # write %globaltimer at its phase boundaries (csrc/fused_kernel.cuh kStamps)
                self._phase_stamps = None
            P, H, I = self.buffer.pool_rows, self.hidden, self.intermediate
            self._aq = torch.empty((P, I), dtype=torch.float8_e4m3fn, device=self.device)
            self._a_s = torch.empty((P, I // SCALE_GROUP), dtype=torch.float32, device=self.device)
            self._xq = torch.empty((max_tokens_per_rank, H), dtype=torch.float8_e4m3fn, device=self.device)
            self._xs = torch.empty((max_tokens_per_rank, H // SCALE_GROUP), dtype=torch.float32, device=self.device)
            # The few-token GEMMs' split-K scratch (fp4_gemm SplitKWorkspace; both backends, both GEMMs): one
            # per device, shared by the layers on it (calls of one device's layers run in stream order; a
            # layer called concurrently on another stream needs its own: splitk_workspace=).
            if splitk_workspace is not None and (not isinstance(splitk_workspace, ops.SplitKWorkspace) or
                                                 splitk_workspace.device != self.device.index):
                raise ValueError(f"splitk_workspace: expected a fp4_gemm.ops.SplitKWorkspace on {self.device}, got "
                                 f"{splitk_workspace!r}")
            self._splitk = splitk_workspace if splitk_workspace is not None else _shared_splitk(ops, self.device)
            # The GEMMs' device error word, created here: a first call inside CUDA-graph capture would
            # otherwise allocate it in the graph's pool, and every replay would zero it.
            ops.error_word(self.device)
            torch.cuda.synchronize(self.device)
        self._layer_id = _ops.register(self)
        self._closed = False
        msg = self.describe_memory()
        log.info(msg)
        if verbose and self.rank == 0:
            print(msg, flush=True)

    # ---- setup helpers -------------------------------------------------------------------------
    def memory_report(self) -> dict:
        """Device bytes this layer holds on its GPU: the symm buffer's regions, the packed weights and the
        preallocated intermediates (FP8 L1 output and its scales; the quantised input when preallocated)."""
        buf = self.buffer.memory_report()
        inter = {"l1_q": self._aq.numel(), "l1_s": self._a_s.numel() * 4,
                 "x_q": self._xq.numel(), "x_s": self._xs.numel() * 4, "splitk": self._splitk.nbytes}
        wts = {"w1": weight_bytes(self.w1), "w2": weight_bytes(self.w2)}
        total = buf["total"] + sum(inter.values()) + sum(wts.values())
        return {"buffer": buf, "weights": wts, "intermediates": inter, "total": total}

    def describe_memory(self) -> str:
        m = self.memory_report()
        mib = 2.0 ** 20
        return (f"megamoe.MegaMoE rank {self.rank}/{self.num_ranks}: {m['total'] / mib:.1f} MiB on {self.device} "
                f"(E={self.num_experts}, local {self.num_local_experts}, H={self.hidden}, I={self.intermediate}, "
                f"K={self.topk}, T_max={self.max_tokens}, backend {self.backend}): symm buffer "
                f"{m['buffer']['total'] / mib:.1f} MiB (pool {self.buffer.pool_rows} rows), weights "
                f"{sum(m['weights'].values()) / mib:.1f} MiB, intermediates {sum(m['intermediates'].values()) / mib:.1f} MiB")

    def extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, experts={self.experts}, hidden={self.hidden}, "
                f"intermediate={self.intermediate}, topk={self.topk}, max_tokens_per_rank={self.max_tokens}, "
                f"ranks={self.num_ranks}, backend={self.backend!r}, activation_clamp={self.activation_clamp}, "
                f"pow2_scales={self.pow2_scales}")

    # ---- the call ------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor) -> torch.Tensor:
        """y BF16 [T, H] = sum_k topk_w[t, k] * expert_{topk_idx[t, k]}(x[t]) (-1 ids contribute 0).
        Collective for R > 1 (every rank calls it, in the same order)."""
        return torch.ops.megamoe.moe_forward(x, topk_idx, topk_w, self._layer_id)

    def _forward_impl(self, x, topk_idx, topk_w):
        try:
            return self._forward_checked(x, topk_idx, topk_w)
        except Exception:
            # A kernel error surfaces here at the next call (the buffer raises the previous call's record):
            # that call may have left the split-K counters mid-count.
            if getattr(self, "_splitk", None) is not None:
                self._splitk.reset()
            raise

    def _forward_checked(self, x, topk_idx, topk_w):
        if self._closed:
            raise RuntimeError("megamoe.MegaMoE: the layer was destroyed")
        T = check_forward(self.config, x, topk_idx, topk_w)
        ops, buf = self._ops, self.buffer
        with torch.cuda.device(self.device):
            if self.check_ids and not torch.cuda.is_current_stream_capturing():
                _check_ids(topk_idx, self.num_experts)
            xq, xs = self._xq[:T], self._xs[:T]  # contiguous row prefixes: the dispatch's alignment holds
            ops.quantize_fp8_cuda(x, pow2=self.pow2_scales, out=(xq, xs))  # zero tokens: nothing launched
            if self.backend == "fused" or (self.backend == "auto" and T <= AUTO_FUSED_MAX_TOKENS):
                return self._fused(T, xq, xs, topk_idx, topk_w)
            pool, ps, pw, counts, h = buf.dispatch(xq, xs, topk_idx, topk_w, check=False)
            cin = self._expert_gemms(T, pool, ps, pw, h.expert_offsets, counts)
            return buf.combine(cin, h, check=False)

    def _block_n(self, T):
        """The token tile of both GEMMs (either backend: the same tile, the same bits): from the mean tokens per
        expert, T * R * K / E, and their spread under random routing (fp4_gemm.ops.pick_block_n_spread)."""
        return self._ops.pick_block_n_spread(max(T, 1) * self.num_ranks * self.topk / self.num_experts)

    def _fused(self, T, xq, xs, topk_idx, topk_w):
        """The fused kernel: dispatch -> L1 -> L2 -> pull combine in one launch (csrc/fused.cu)."""
        y = torch.empty((T, self.hidden), dtype=torch.bfloat16, device=self.device)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        idx_bytes = topk_idx.element_size()

        def launch(layout_ref, peers, host_words, timeout_ns, num_sms):
            self._mlib.call("megamoe_fused_forward", layout_ref, peers, host_words, timeout_ns, num_sms,
                            self._grid_words.data_ptr(),
                            xq.data_ptr() or None, xs.data_ptr() or None, topk_idx.data_ptr() or None, idx_bytes,
                            topk_w.data_ptr() or None, T, self.w1.packed.data_ptr(), self.w1.row_scale.data_ptr(),
                            self.w2.packed.data_ptr(), self.w2.row_scale.data_ptr(), self.intermediate,
                            self._aq.data_ptr(), self._a_s.data_ptr(), y.data_ptr() or None, self._block_n(T),
                            self.activation_clamp, int(self.pow2_scales), self.buffer.raw.data_ptr(),
                            None if self._phase_stamps is None else self._phase_stamps.data_ptr(),
                            *self._splitk.args_ptrs(), stream)

        self.buffer.run_fused(launch, xq)
        return y

    def _expert_gemms(self, T, pool=None, ps=None, pw=None, offsets=None, counts=None):
        """L1 (SwiGLU x top-k weight -> FP8, preallocated) then L2 (BF16 into the combine input) over the
        dispatch pool; returns the combine input. Without pool arguments: the last call's pool as it
        stands (benchmarks time the GEMMs alone this way). T: that call's tokens (picks the token tile)."""
        ops, buf = self._ops, self.buffer
        if pool is None:
            pool, ps, pw, offsets, counts = buf.pool_x, buf.pool_s, buf.pool_w, buf.exp_offsets, buf.exp_counts
        block_n = self._block_n(T)
        ops.grouped_gemm_l1(pool, ps, self.w1, pw, group_offsets=offsets, group_counts=counts,
                            activation_clamp=self.activation_clamp, pow2=self.pow2_scales, block_n=block_n,
                            out=(self._aq, self._a_s), splitk=self._splitk)
        cin = buf.combine_input()
        ops.grouped_gemm(self._aq, self._a_s, self.w2, group_offsets=offsets, group_counts=counts, block_n=block_n,
                         out=cin, splitk=self._splitk)
        return cin

    # ---- errors and teardown ---------------------------------------------------------------------
    def check_errors(self) -> None:
        """Synchronise and raise the first device-side error any of the layer's kernels reported (a bad
        expert id seen by dispatch, a timeout naming rank and phase, a GEMM pipeline error). A stopped call
        can leave the split-K counters mid-count: they are zeroed before the error propagates."""
        try:
            self.buffer.check_errors()
            self._ops.check_errors()
        except Exception:
            self._splitk.reset()
            raise

    def resync(self) -> None:
        """Collective for R > 1: after a timeout (or a device-side error) bring every rank's buffer state back
        in step (symm_comm.Buffer.resync) and clear the fused kernel's barrier words."""
        self.buffer.resync()
        self._splitk.reset()
        if getattr(self, "_grid_words", None) is not None:
            self._grid_words.zero_()
            torch.cuda.synchronize(self.device)

    def destroy(self) -> None:
        """Free the symmetric buffer (collective for R > 1: every rank calls it)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        _ops.unregister(self._layer_id)
        self.buffer.destroy()
