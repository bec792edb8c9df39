"""symm_comm.Buffer: a symmetric buffer (one per rank, mapped into every peer) + expert-granular
EP dispatch / combine over NVLink. See include/symm_comm/layout.cuh for what lives where."""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import _arrays
from ._lib import ERR_WORDS, LIB
from ._validate import Config, check_buffer_args, check_combine, check_dispatch
from .backends import LocalBackend, keep_multicast_off, make_backend
from .errors import SymmCommError, is_timeout, make_error, require_cuda
from .layout import compute_layout, describe, region_bytes

log = logging.getLogger("symm_comm")

_STATE_EPOCH, _STATE_ERR = 0, 128
SINGLE_BACKENDS = ("torch", "nvshmem", "ipc", "local")  # accepted names in single-process mode (all: a local allocation)


def resolve_group(group=None, single_rank: bool = False):
    """(single, group, num_ranks, rank) as Buffer sees them. Single-process mode: single_rank=True, or
    group None while torch.distributed is not initialised (one rank, rank 0, no collectives)."""
    if single_rank:
        if group is not None:
            raise ValueError("single_rank: pass group=None with single_rank=True (one rank, no process group)")
        return True, None, 1, 0
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return True, None, 1, 0
    group = group if group is not None else dist.group.WORLD
    return False, group, dist.get_world_size(group), dist.get_rank(group)


@dataclass
class Handle:
    """What combine needs from one dispatch. Valid until the buffer's next dispatch."""
    seq: int
    num_tokens: int
    masked: bool
    expert_offsets: torch.Tensor  # int32 [L + 1] on the GPU: segment starts; [L] = pool rows used
    expert_counts: torch.Tensor   # int32 [L] on the GPU: valid rows per local expert
    row_src: torch.Tensor         # int32 [P]: (src_rank * T_max + token) * K + k, -1 = padding
    arrivals: torch.Tensor        # int32 (u32 bits) [P / block_m], == epoch * block_m when a block is complete
    epoch: int | None             # the dispatch epoch (1-based) this handle belongs to: a consumer waits
                                  # for arrivals[b] == epoch * block_m (mod 2^32). None when the dispatch
                                  # was captured into a CUDA graph: every replay is a new epoch, so a
                                  # captured consumer reads the device's epoch (Buffer.epochs[0]) instead
    framework: str = "torch"
    pulled: bool = False          # combined once from buf.combine_input() (the pull path allows one per dispatch)

    def num_rows(self) -> int:
        """Pool rows used (synchronises)."""
        return int(self.expert_offsets[-1].item())

    def host_counts(self) -> list[int]:
        """Per-local-expert counts copied to the host (synchronises)."""
        return self.expert_counts.cpu().tolist()


class Buffer:
    """Symmetric buffer + dispatch/combine for one process group (one GPU per rank, one node).

    Rank r owns experts [r*E/R, (r+1)*E/R). All ranks must create the buffer with the same arguments
    and make the same sequence of dispatch/combine calls.

    Single-process mode: group None while torch.distributed is not initialised (or single_rank=True):
    one rank holding every expert, a plain CUDA allocation as the buffer (peer table = its own pointer),
    no collectives; the same kernels and layout as R ranks. `backend` is then only checked by name.

    Outputs of dispatch are VIEWS into the buffer: they stay valid until the next dispatch.

    combine_input_rows > 0 (or -1: pool_rows) adds the pull combine's input region (BF16 [rows, H] per
    rank, `combine_input()`): a producer that writes its expert outputs there (pool row order) gets the
    pull combine, which reads every rank's rows in place and reduces them in registers (no combine
    buffer, no second pass; the faster path for small calls, docs/perf-notes-symm_comm.md).
    """

    def __init__(self, group, num_experts: int, hidden: int, topk: int, max_tokens_per_rank: int, *,
                 block_m: int = 128, pool_rows: int = 0, max_m: int = 0, backend: str = "torch",
                 timeout_s: float = 10.0, num_sms: int = 0, check: bool = True, device=None,
                 verbose: bool = False, combine_input_rows: int = 0, single_rank: bool = False):
        keep_multicast_off()
        require_cuda("symm_comm.Buffer")
        self._single, group, self.num_ranks, self.rank = resolve_group(group, single_rank)
        self.group = group
        if self._single:
            if backend not in SINGLE_BACKENDS:
                raise ValueError(f"backend: expected one of {SINGLE_BACKENDS}, got {backend!r}")
            check_buffer_args(1, num_experts, hidden, topk, max_tokens_per_rank, block_m, "torch")
        else:
            check_buffer_args(self.num_ranks, num_experts, hidden, topk, max_tokens_per_rank, block_m, backend)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: {timeout_s} must be > 0")
        if not isinstance(combine_input_rows, int) or combine_input_rows < -1:
            raise ValueError(f"combine_input_rows: {combine_input_rows!r} must be an int >= -1 (-1: pool_rows)")
        dev_index = None if device is None else torch.device(device).index
        self.device = torch.device("cuda", torch.cuda.current_device() if dev_index is None else dev_index)
        try:
            self.layout = compute_layout(self.num_ranks, self.rank, num_experts, hidden, topk, max_tokens_per_rank,
                                         block_m, pool_rows, max_m, combine_input_rows)
        except RuntimeError:
            if combine_input_rows > 0:  # name the argument if it is the one out of range
                P = compute_layout(self.num_ranks, self.rank, num_experts, hidden, topk, max_tokens_per_rank,
                                   block_m, pool_rows, max_m).pool_rows
                if combine_input_rows > P:
                    raise ValueError(f"combine_input_rows: {combine_input_rows} exceeds the pool's {P} rows "
                                     "(-1: one row per pool row)") from None
            raise
        # Every rank must place every region at the same offset (peers store into our buffer by offset):
        # compare the layouts before the collective allocation (e.g. combine_input_rows 0 on one rank).
        mine = (int(self.layout.total_bytes), int(self.layout.pool_rows), int(self.layout.max_m),
                int(self.layout.cmb_in_rows))
        every = [mine]
        if not self._single:
            every = [None] * self.num_ranks
            dist.all_gather_object(every, mine, group=group)
        if any(v != mine for v in every):
            raise ValueError(f"symm_comm.Buffer: the ranks' layouts differ (total_bytes, pool_rows, max_m, "
                             f"combine_input_rows per rank: {every}); create the buffer with the same arguments "
                             "on every rank")
        L = self.layout
        self.num_experts, self.hidden, self.topk = num_experts, hidden, topk
        self.max_tokens = max_tokens_per_rank
        self.num_local_experts = L.num_local_experts
        self.block_m, self.pool_rows, self.max_m = L.block_m, L.pool_rows, L.max_m
        self.timeout_ns = int(timeout_s * 1e9)
        self.num_sms = num_sms
        self.check = check
        self.backend_name = "local" if self._single else backend
        self.nbytes = int(L.total_bytes)
        self._cfg = Config(hidden, topk, max_tokens_per_rank, num_experts, L.num_local_experts, L.max_m,
                           self.device.index)

        with torch.cuda.device(self.device):
            self._backend = (LocalBackend(self.nbytes, self.device) if self._single else
                             make_backend(backend, self.nbytes, group, self.device))
            self.raw = self._backend.tensor
            self.raw.zero_()
            self.peers = torch.tensor(self._backend.peer_ptrs, dtype=torch.int64, device=self.device)
            self._hw = ctypes.POINTER(ctypes.c_int32)()
            LIB.call("symm_host_words_alloc", ctypes.byref(self._hw))
            self._base = int(self.raw.data_ptr())
            if self._backend.peer_ptrs[self.rank] != self._base:
                raise RuntimeError("symm_comm: the backend's own-rank pointer differs from the local tensor")
            self._make_views()
            LIB.call("symm_reset_state", ctypes.byref(L), self._base, 0, 0,
                     torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
        if not self._single:
            dist.barrier(group)
        self._dispatch_seq = 0
        self._epoch = 0  # host mirror of the device dispatch epoch (1-based after the first call)
        self._epoch_unknown = False  # a dispatch was captured: graph replays advance the device epoch unseen
        self._needs_resync = False
        self._closed = False
        msg = describe(L) + f", backend {self.backend_name}"
        log.info(msg)
        if verbose and self.rank == 0:
            print(msg, flush=True)

    # ---- views -------------------------------------------------------------------------------
    def _v(self, off, count, dtype, shape=None):
        nb = count * torch.empty((), dtype=dtype).element_size()
        t = self.raw[off:off + nb].view(dtype)
        return t.view(shape) if shape is not None else t

    def _make_views(self):
        L = self.layout
        P, H, S, Lx = L.pool_rows, L.hidden, L.scale_cols, L.num_local_experts
        self.pool_x = self._v(L.off_pool_x, P * H, torch.float8_e4m3fn, (P, H))
        self.pool_s = self._v(L.off_pool_s, P * S, torch.float32, (P, S))
        self.pool_w = self._v(L.off_pool_w, P, torch.float32, (P,))
        self.exp_counts = self._v(L.off_exp_counts, Lx, torch.int32, (Lx,))
        self.exp_offsets = self._v(L.off_exp_offsets, Lx + 1, torch.int32, (Lx + 1,))
        self.row_src = self._v(L.off_row_src, P, torch.int32, (P,))
        self.arrivals = self._v(L.off_arrivals, L.num_blocks, torch.int32, (L.num_blocks,))
        self.epochs = self._v(L.off_state + _STATE_EPOCH, 2, torch.int64, (2,))
        self.err_words = self._v(L.off_state + _STATE_ERR, ERR_WORDS, torch.int32, (ERR_WORDS,))

    def combine_input(self, masked: bool = False):
        """The pull combine's input rows on this rank: BF16 [combine_input_rows, H] (masked: [L, max_m, H]),
        a view of the symmetric buffer. Write the expert outputs here in pool row order (after this
        rank's dispatch, as a GEMM reading the pool does) and pass this view as combine's expert_out: every
        rank must do so in the same call. The rows must stay unchanged until every rank's combine has
        read them; the next dispatch on this buffer guarantees it (its cross-rank barrier)."""
        L = self.layout
        rows, H = int(L.cmb_in_rows), self.hidden
        if rows <= 0:
            raise ValueError("combine_input: the buffer has no pull combine input (create it with combine_input_rows)")
        v = self._v(L.off_cmb_in, rows * H, torch.bfloat16, (rows, H))
        if masked:
            n = self.num_local_experts * self.max_m
            if n > rows:
                raise ValueError(f"combine_input: masked view needs {n} rows (L * max_m), the region has {rows}")
            v = v[:n].view(self.num_local_experts, self.max_m, H)
        return v

    def _is_combine_input(self, ea, masked: bool) -> bool:
        """True iff expert_out is this buffer's combine_input() (the pull path). A view that starts there
        with another shape (a slice) is refused: the pull reads every row the dispatch used in place."""
        L = self.layout
        if int(L.cmb_in_rows) <= 0 or ea.ptr != self._base + int(L.off_cmb_in):
            return False
        want = (self.num_local_experts, self.max_m, self.hidden) if masked else (int(L.cmb_in_rows), self.hidden)
        if tuple(ea.shape) != want:
            raise ValueError(f"expert_out: starts at the buffer's combine input but has shape {tuple(ea.shape)}; "
                             f"pass buf.combine_input({'masked=True' if masked else ''}) itself (shape {want})")
        return True

    def memory_report(self) -> dict:
        """Bytes per region of this rank's buffer (and the total)."""
        rb = region_bytes(self.layout)
        rb["total"] = self.nbytes
        return rb

    # ---- errors ------------------------------------------------------------------------------
    def _host_words(self):
        return tuple(int(self._hw[i]) for i in range(ERR_WORDS))

    def _clear_errors(self):
        for i in range(ERR_WORDS):
            self._hw[i] = 0
        self.err_words.zero_()

    def _raise_if_error(self):
        w = self._host_words()
        if w[0] != 0:
            if is_timeout(w[0]):
                self._needs_resync = True
            self._clear_errors()
            raise make_error(w)

    def check_errors(self):
        """Synchronise the device and raise the first error a kernel reported since the last check."""
        torch.cuda.synchronize(self.device)
        self._raise_if_error()

    def _ready(self):
        if self._closed:
            raise RuntimeError("symm_comm: the buffer was destroyed")
        if self._needs_resync:
            raise SymmCommError("symm_comm: a previous call timed out; call buf.resync() on ALL ranks first")
        self._raise_if_error()  # an error of an unchecked earlier call (no sync)

    def resync(self):
        """Collective: after a timeout, bring every rank's epochs and local state back in step."""
        torch.cuda.synchronize(self.device)
        ep = self.epochs.clone()
        if not self._single:
            dist.all_reduce(ep, op=dist.ReduceOp.MAX, group=self.group)
        e = ep.cpu().tolist()
        self._epoch = int(e[0])
        LIB.call("symm_reset_state", ctypes.byref(self.layout), self._base, int(e[0]), int(e[1]),
                 torch.cuda.current_stream(self.device).cuda_stream)
        torch.cuda.synchronize(self.device)
        for i in range(ERR_WORDS):
            self._hw[i] = 0
        self._needs_resync = False
        # Handles from before the reset describe state that no longer exists: make them stale.
        self._dispatch_seq += 1
        if not self._single:
            dist.barrier(self.group)

    # ---- dispatch / combine --------------------------------------------------------------------
    def dispatch(self, x_fp8, x_scales, topk_idx, topk_w=None, layout: str = "contiguous", *,
                 check: bool | None = None):
        """Returns (pool, pool_scales, pool_topk_w, expert_counts, handle).

        contiguous: pool FP8 [P, H] (expert le's rows start at handle.expert_offsets[le], segments
        aligned to block_m), pool_scales FP32 [P, H/128], pool_topk_w FP32 [P], expert_counts int32 [L].
        masked: pool [L, max_m, H], pool_scales [L, max_m, H/128], pool_topk_w [L, max_m].
        CuPy inputs give CuPy outputs (uint8 for FP8)."""
        xa = _arrays.view(x_fp8, "x_fp8")
        sa = _arrays.view(x_scales, "x_scales")
        ia = _arrays.view(topk_idx, "topk_idx")
        wa = _arrays.view(topk_w, "topk_w") if topk_w is not None else None
        T, idx_bytes = check_dispatch(self._cfg, xa, sa, ia, wa, layout)
        self._ready()
        masked = layout == "masked"
        stream = _arrays.stream_of(xa)
        with _arrays.device_of(xa):  # the C launcher launches on the current device (the buffer's: checked)
            captured = _arrays.capturing(xa)
            if self._epoch_unknown and not captured:
                # First eager call after a capture: replays (any number, any stream) advanced the device
                # epoch without the host; re-read it once (synchronises the device).
                torch.cuda.synchronize(self.device)
                self._epoch = int(self.epochs[0].item())
                self._epoch_unknown = False
            LIB.call("symm_dispatch", ctypes.byref(self.layout), self.peers.data_ptr(), xa.ptr or None,
                     sa.ptr or None, ia.ptr or None, idx_bytes, wa.ptr if wa is not None and wa.ptr else None, T,
                     int(masked), self.num_sms, self.timeout_ns, self._hw, stream)
        self._dispatch_seq += 1
        self._epoch += 1
        self._epoch_unknown |= captured
        h = Handle(self._dispatch_seq, T, masked, self.exp_offsets, self.exp_counts, self.row_src,
                   self.arrivals, None if captured else self._epoch, xa.framework)
        if check if check is not None else self.check:
            self._sync_check(xa)
        Lx, mm = self.num_local_experts, self.max_m
        if masked:
            n = Lx * mm
            outs = (self.pool_x[:n].view(Lx, mm, self.hidden), self.pool_s[:n].view(Lx, mm, -1),
                    self.pool_w[:n].view(Lx, mm), self.exp_counts)
        else:
            outs = (self.pool_x, self.pool_s, self.pool_w, self.exp_counts)
        if xa.framework != "torch":
            outs = tuple(_to_cupy(o) for o in outs)
        return (*outs, h)

    def combine(self, expert_out, handle: Handle, topk_w=None, *, out=None, check: bool | None = None):
        """y[t] = BF16(sum_k [topk_w[t, k] *] expert_out[row(t, k)]) over the k the dispatch sent, FP32, k order.
        expert_out: BF16 [P', H] (contiguous; P' >= rows used) or [L, max_m, H] (masked); buf.combine_input()
        itself (every rank in the same call, once per dispatch): the pull combine, which reads the rows in
        place; leave them unchanged until the next dispatch."""
        if not isinstance(handle, Handle):
            raise TypeError(f"handle: expected the Handle returned by dispatch, got {type(handle).__name__}")
        if handle.seq != self._dispatch_seq:
            raise ValueError(f"handle: stale (dispatch #{handle.seq}, the buffer's last dispatch is "
                             f"#{self._dispatch_seq}); combine must follow its own dispatch")
        ea = _arrays.view(expert_out, "expert_out")
        wa = _arrays.view(topk_w, "topk_w") if topk_w is not None else None
        oa = _arrays.view(out, "out") if out is not None else None
        rows = check_combine(self._cfg, ea, handle.masked, handle.num_tokens, wa, oa)
        self._ready()
        pull = self._is_combine_input(ea, handle.masked)
        if pull:
            # The peers read this rank's rows in place until their combine ends; a second pull of the
            # same dispatch would invite rewriting them in between (nothing orders that write after the
            # peers' reads). Combine again with a plain tensor (push path) instead.
            if handle.pulled:
                raise ValueError("expert_out: this dispatch was already combined from buf.combine_input(); "
                                 "combine it again from a plain tensor (the rows may be rewritten only after "
                                 "the next dispatch)")
            handle.pulled = True
        if out is None:
            y = torch.empty((handle.num_tokens, self.hidden), dtype=torch.bfloat16, device=self.device)
            ya = _arrays.view(y, "out")
        else:
            y, ya = out, oa
        stream = _arrays.stream_of(ea)
        with _arrays.device_of(ea):
            if pull:  # the rows are in every rank's cmb_in: pull them in place
                LIB.call("symm_combine_pull", ctypes.byref(self.layout), self.peers.data_ptr(),
                         wa.ptr if wa is not None and wa.ptr else None, ya.ptr or None, handle.num_tokens,
                         self.num_sms, self.timeout_ns, self._hw, stream)
            else:
                LIB.call("symm_combine", ctypes.byref(self.layout), self.peers.data_ptr(), ea.ptr or None, rows,
                         wa.ptr if wa is not None and wa.ptr else None, ya.ptr or None, handle.num_tokens,
                         self.num_sms, self.timeout_ns, self._hw, stream)
        if check if check is not None else self.check:
            self._sync_check(ea)
        if out is None and ea.framework != "torch":
            return _to_cupy(y)
        return y

    def run_fused(self, launch, stream_tensor) -> None:
        """For ONE kernel that performs this buffer's dispatch AND its pull combine itself (megamoe's fused
        kernel, built from symm_comm's device workers): the host side of a dispatch() + combine() pair.
        Errors of earlier calls are raised first (and a needed resync); then
        launch(layout_ref, peers_ptr, host_words, timeout_ns, num_sms) is called (it enqueues the kernel on
        stream_tensor's stream); the dispatch epoch advances (re-read after graph replays, as dispatch()
        does) and earlier handles become stale. The kernel must keep symm_comm's epoch protocol (the
        dispatch and combine phases' begin / end on every exit path) so that mixing it with plain
        dispatch / combine calls on the same buffer stays valid."""
        self._ready()
        ta = _arrays.view(stream_tensor, "x")
        with _arrays.device_of(ta):
            captured = _arrays.capturing(ta)
            if self._epoch_unknown and not captured:
                torch.cuda.synchronize(self.device)
                self._epoch = int(self.epochs[0].item())
                self._epoch_unknown = False
            launch(ctypes.byref(self.layout), self.peers.data_ptr(), self._hw, self.timeout_ns, self.num_sms)
        self._dispatch_seq += 1
        self._epoch += 1
        self._epoch_unknown |= captured

    def _sync_check(self, a):
        if a.framework == "torch":
            torch.cuda.current_stream(self.device).synchronize()
        else:
            import cupy
            cupy.cuda.get_current_stream().synchronize()
        self._raise_if_error()

    def destroy(self):
        """Free the symmetric allocation (collective for NVSHMEM)."""
        if self._closed:
            return
        torch.cuda.synchronize(self.device)
        self._closed = True
        for n in ("pool_x", "pool_s", "pool_w", "exp_counts", "exp_offsets", "row_src", "arrivals", "epochs",
                  "err_words", "raw"):
            setattr(self, n, None)
        self._backend.close()
        if self._hw:
            LIB.lib.symm_host_words_free(self._hw)
            self._hw = ctypes.POINTER(ctypes.c_int32)()

    def __del__(self):
        try:
            if not self._closed and self.backend_name in ("torch", "local"):
                self.destroy()
        except Exception:
            pass


def _to_cupy(t: torch.Tensor):
    import cupy
    if t.dtype == torch.float8_e4m3fn:
        t = t.view(torch.uint8)
    elif t.dtype == torch.bfloat16:
        return cupy.from_dlpack(t.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(t)
