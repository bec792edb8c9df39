"""GPU entry points of fp4_gemm (ctypes launchers over libfp4_gemm.so).

Inputs are torch CUDA tensors or CuPy arrays; outputs are allocated with the input's framework.
Every argument is checked here (dtype, shape, device, strides, alignment) and again in C.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from . import _arrays as A
from ._lib import LIB
from ._native import header_constants, package_header, require_cuda_device
from .layout import constants as _constants

# Channels per activation scale (layout.cuh kScaleGroup): the layer input (DeepEP's convention on
# Hopper) and the L1 output = L2 input use the same granularity.
SCALE_GROUP = _constants()["kScaleGroup"]


def _require_cuda(entry: str, x) -> None:
    """A torch tensor off the GPU where torch has no CUDA device: NoCudaDeviceError naming `entry`
    (not torch's AssertionError, nor a bare "expected a CUDA tensor"). CuPy inputs need no check."""
    if A.is_torch(x) and not x.is_cuda:
        require_cuda_device(entry)


def quantize_fp8_cuda(x, gran: int = SCALE_GROUP, pow2: bool = False, out=None):
    """BF16 [T, H] (CuPy: uint16 raw BF16 bits) -> (E4M3 [T, H], FP32 scales [T, H/128]); zero tokens
    launch nothing. out: optional preallocated (q, scales) of those shapes (contiguous), written and returned."""
    LIB.require()
    _require_cuda("fp4_gemm.quantize_fp8", x)
    if gran != SCALE_GROUP:
        raise ValueError(f"gran: the CUDA quantiser supports gran={SCALE_GROUP} only, got {gran}")
    xv = A.view(x, "x")
    A.check(xv, "x", ("bf16", "u16"), ndim=2)
    T, H = xv.shape
    if H % SCALE_GROUP:
        raise ValueError(f"x: hidden size {H} is not a multiple of {SCALE_GROUP}")
    if T > 0 and xv.strides[1] != 1:
        raise ValueError(f"x: the last dimension must be contiguous (strides {xv.strides})")
    if T > 1 and xv.strides[0] % 4:
        raise ValueError(f"x: row stride {xv.strides[0]} must be a multiple of 4 elements")
    if T > 0 and xv.ptr % 8:
        raise ValueError("x: data pointer must be 8-byte aligned")
    if out is None:
        q = A.empty_like_framework(xv, (T, H), "fp8")
        s = A.empty_like_framework(xv, (T, H // SCALE_GROUP), "f32")
        if T == 0:  # a rank with no tokens: empty outputs, nothing launched
            return q, s
    else:
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError("out: expected a (q, scales) pair")
        q, s = out
    qv, sv = A.view(q, "out[0] (q)"), A.view(s, "out[1] (scales)")
    A.check(qv, "out[0] (q)", ("fp8", "u8"), ndim=2, contiguous=True)
    A.check(sv, "out[1] (scales)", ("f32",), ndim=2, contiguous=True)
    if tuple(qv.shape) != (T, H) or tuple(sv.shape) != (T, H // SCALE_GROUP):
        raise ValueError(f"out: expected shapes {(T, H)} and {(T, H // SCALE_GROUP)}, got {qv.shape} and {sv.shape}")
    A.same_device(xv, qv, sv)
    if T == 0:  # a rank with no tokens: nothing to launch
        return q, s
    with A.device_of(xv):
        LIB.call("fp4g_quantize_fp8", xv.ptr, qv.ptr, sv.ptr, T, H, xv.strides[0] if T > 1 else H,
                 int(bool(pow2)), A.stream_of(xv))
    return q, s


BLOCK_NS = (8, 16, 32, 64, 128)
_LAYOUT = {"contiguous": 0, "masked": 1}
_err_words: dict = {}
ERR_WORDS = 8  # moe_common/errors.cuh kErrWords: code, rank, phase, what, detail, epoch, 0, 0
# Limit of each pipeline wait inside a GEMM (a stuck pipeline, not a slow one): then the kernel
# records the error and returns, and check_errors() raises it.
DEFAULT_TIMEOUT_S = 20.0


@dataclass
class PackedWeights:
    """Device-resident transformed weights in the kernel's chunk order (see layout.cuh)."""
    packed: object      # uint8 [G, N/128, K/128, chunk]
    row_scale: object   # float32 [G, N]
    num_groups: int
    n: int
    k: int
    gate_up_interleave: bool = False


def prepare_weights(tw, device="cuda") -> PackedWeights:
    """TransformedWeights (fp4_gemm.numerics.transform_weights, [G, N, K/2]) -> PackedWeights on `device`."""
    import torch
    from .layout import pack_weights
    require_cuda_device("fp4_gemm.ops.prepare_weights", device)
    codes, shift = tw.codes, tw.shift
    if codes.dim() == 2:
        codes, shift = codes[None], shift[None]
    G, N, K = codes.shape[0], codes.shape[1], codes.shape[2] * 2
    packed = pack_weights(codes.to(device), shift.to(device))
    row_scale = tw.row_scale.reshape(G, N).to(device=device, dtype=torch.float32).contiguous()
    return PackedWeights(packed.contiguous(), row_scale, G, N, K, bool(getattr(tw, "gate_up_interleave", False)))


def error_word(device):
    """The GEMMs' device error word of a torch device (created once; create it outside CUDA-graph
    capture, e.g. when setting up a layer, so no graph's memory pool owns it)."""
    import torch
    d = torch.device(device)
    return _error_word_for("torch", d.index if d.index is not None else torch.cuda.current_device())


def _error_word(a: A.DevArray):
    return _error_word_for(a.framework, a.device)


def _error_word_for(framework: str, device: int):
    key = (framework, device)
    if key not in _err_words:
        if framework == "torch":
            import torch
            _err_words[key] = torch.zeros(ERR_WORDS, dtype=torch.int32, device=f"cuda:{device}")
        else:
            import cupy
            with cupy.cuda.Device(device):
                _err_words[key] = cupy.zeros(ERR_WORDS, dtype=cupy.int32)
    return _err_words[key]


def _error_tables():
    """(codes, phases): {number: text} from include/fp4_gemm/errors.cuh (the numbers the kernels write)."""
    from pathlib import Path
    C = header_constants(package_header(str(Path(__file__).resolve().parent), "fp4_gemm/errors.cuh"))
    codes = {C["kTimeoutFull"]: "a math warp timed out waiting for a stage's data (pipeline stalled)",
             C["kTimeoutEmpty"]: "the producer timed out waiting for a free pipeline stage",
             C["kSmemAlign"]: "dynamic shared memory was not 1024-byte aligned (nothing computed)"}
    phases = {C["kSetup"]: "setup", C["kProducer"]: "producer", C["kMath"]: "math"}
    return codes, phases, C


def error_codes():
    """(codes, timeout codes): the error codes fp4_gemm's device code writes ({number: text}), and which of
    them are timeouts (a kernel that embeds the GEMMs, like megamoe's fused one, decodes its record so)."""
    codes, _, C = _error_tables()
    return codes, (C["kTimeoutFull"], C["kTimeoutEmpty"])


def describe_error(words) -> str:
    """The text of an error record (ERR_WORDS ints as the kernel left them)."""
    code, _rank, phase, what, _detail = (int(v) for v in words[:5])
    codes, phases, C = _error_tables()
    # Timeouts leave the code only (fp4_gemm/errors.cuh): the code names the role.
    phase = phase or {C["kTimeoutFull"]: C["kMath"], C["kTimeoutEmpty"]: C["kProducer"]}.get(code, 0)
    msg = f"{codes.get(code, f'code {code}')} (phase {phases.get(phase, phase)}"
    if code == C["kSmemAlign"]:
        msg += f", shared address % 1024 = {what}"
    return msg + ")"


def check_errors():
    """Raise if any GEMM launched so far reported a device-side error (synchronises). Clears it, and zeroes
    the counters of every live SplitKWorkspace (a stopped split-K call can leave them mid-count)."""
    for key, w in _err_words.items():
        words = w.tolist() if key[0] == "torch" else w.get().tolist()
        if words[0]:
            w.fill(0)
            reset_splitk_workspaces()
            raise RuntimeError(f"fp4_gemm kernel error on device {key[1]}: {describe_error(words)}")


def reset_splitk_workspaces():
    """Zero the counters of every live SplitKWorkspace (after any kernel error)."""
    for ws in list(_live_workspaces or ()):
        ws.reset()


def _timeout_ns(timeout_s) -> int:
    if not timeout_s > 0:
        raise ValueError(f"timeout_s: must be > 0 seconds, got {timeout_s}")
    return int(timeout_s * 1e9)


SPLITK_SLOTS_PER_CTA = 4  # workspace slots per CTA of the few-token grid (2 per SM): scheduler.cuh's S <= slots / units


_live_workspaces = None  # weakref.WeakSet of SplitKWorkspace (check_errors zeroes them after an error)


class SplitKWorkspace:
    """Scratch of the few-token GEMMs' split-K (block_n 8 / 16, when a call has fewer tiles than CTAs:
    e.g. 1-4 tokens on a handful of experts): FP32 partial sums and u32 arrival counters, ZERO between
    calls (every completed call leaves them so). Pass it as `splitk=` to grouped_gemm / grouped_gemm_l1;
    without one those GEMMs run unsplit. One workspace per stream (calls in flight together must not
    share one); after a kernel error the counters may be mid-count: check_errors() zeroes every live
    workspace when it raises, else call reset(). torch tensors on `device`."""

    def __init__(self, device="cuda", slots: int | None = None):
        LIB.require()
        import torch
        require_cuda_device("fp4_gemm.ops.SplitKWorkspace", device)
        d = torch.device(device)
        if d.type != "cuda":
            raise ValueError(f"device: expected a CUDA device, got {device!r}")
        idx = d.index if d.index is not None else torch.cuda.current_device()
        if slots is None:
            slots = SPLITK_SLOTS_PER_CTA * 2 * torch.cuda.get_device_properties(idx).multi_processor_count
        if not isinstance(slots, int) or slots <= 0:
            raise ValueError(f"slots: expected a positive int, got {slots!r}")
        per_slot = max(LIB.lib.fp4g_splitk_floats_per_slot(b, l1) for b in (8, 16) for l1 in (0, 1))
        self.slots = slots
        self.partials = torch.empty(slots * per_slot, dtype=torch.float32, device=f"cuda:{idx}")
        self.counters = torch.zeros(slots, dtype=torch.int32, device=f"cuda:{idx}")
        self.device = idx
        global _live_workspaces
        if _live_workspaces is None:
            import weakref
            _live_workspaces = weakref.WeakSet()
        _live_workspaces.add(self)

    @property
    def nbytes(self) -> int:
        return self.partials.numel() * 4 + self.counters.numel() * 4

    def reset(self):
        """Zero the counters (after an error: a stopped call can leave them mid-count)."""
        self.counters.zero_()

    def args_ptrs(self):
        """(partials, floats, counters, slots) as the C ABI takes them (fp4_gemm_api.h sk_*)."""
        return (self.partials.data_ptr(), self.partials.numel(), self.counters.data_ptr(), self.slots)

    def args(self, x: A.DevArray):
        if x.device != self.device:
            raise ValueError(f"splitk: workspace on cuda:{self.device}, operands on cuda:{x.device}")
        return self.args_ptrs()


def _splitk_args(splitk, x: A.DevArray):
    if splitk is None:
        return (None, 0, None, 0)
    if not isinstance(splitk, SplitKWorkspace):
        raise TypeError(f"splitk: expected a fp4_gemm.ops.SplitKWorkspace or None, got {type(splitk).__name__}")
    return splitk.args(x)


def pick_block_n(expected_m: int) -> int:
    """The smallest token tile that holds `expected_m` rows (the GEMM's default for a known group size)."""
    for b in BLOCK_NS:
        if expected_m <= b:
            return b
    return BLOCK_NS[-1]


# Time of one (tile, K block) of each token tile relative to the 8-token tile's, all SMs busy (speed only, no
# effect on results): the layer's GEMMs alone per K block per SM in megamoe-bench 59ae151 (H200), 0.30 / 0.36 /
# 0.43 / 0.63 / 0.84 us at 8 / 16 / 32 / 64 / 128 tokens, with 32 and 64 scaled by what the 32-entry decode
# table (32: -5..-13 %) and the 64-token shared-memory loop (64: -9..-16 %) gained on an H100 (tile_sweep,
# 2026-12-07); docs/perf-notes.md, "The 16 / 32 / 64-token tiles and the tile rule". A full sweep on an H100
# (2f87c1b, bench/results/tile-sweep-2026-12-07-2f87c1b-h100.md) found each pick fastest or within 2 %.
TILE_KBLOCK_COST = {8: 1.0, 16: 1.2, 32: 1.35, 64: 1.85, 128: 2.8}


def _poisson_pmf(mean_m: float) -> tuple[int, list[float]]:
    """(k0, p): P(X = k0 + i) = p[i] for X ~ Poisson(mean_m) over mean +- 12 sd (the rest is below 1e-30)."""
    sd = math.sqrt(mean_m)
    lo, hi = max(1, int(mean_m - 12 * sd - 10)), int(mean_m + 12 * sd + 10)
    log_m = math.log(mean_m)
    return lo, [math.exp(k * log_m - mean_m - math.lgamma(k + 1)) for k in range(lo, hi + 1)]


def expected_tiles(mean_m: float, block_n: int) -> float:
    """E[ceil(X / block_n)] for X ~ Poisson(mean_m): the tiles a group takes on average when its size spreads as
    uniformly random routing spreads the tokens per expert (each tile streams the group's weights once)."""
    if mean_m <= 0:
        return 0.0
    return _tiles(*_poisson_pmf(mean_m), block_n)


def _tiles(k0: int, p: list[float], block_n: int) -> float:
    return sum(pk * -(-(k0 + i) // block_n) for i, pk in enumerate(p))


@functools.lru_cache(maxsize=1024)
def pick_block_n_spread(mean_m: float) -> int:
    """The token tile for groups whose sizes spread around `mean_m` (an MoE layer's tokens per expert): the
    least expected tiles x per-tile cost (TILE_KBLOCK_COST), the smaller tile on a tie. A tile that holds most
    groups whole streams each expert's weights once; the mean alone (pick_block_n) gave 1.41 tiles per expert
    at 8 tokens per expert. Host cost: under 1 ms per new mean (cached)."""
    if mean_m >= 4 * BLOCK_NS[-1]:  # every tile nearly full: the least cost per row
        return min(BLOCK_NS, key=lambda b: (TILE_KBLOCK_COST[b] / b, b))
    if mean_m <= 0:
        return BLOCK_NS[0]
    k0, p = _poisson_pmf(mean_m)
    cost = {b: _tiles(k0, p, b) * TILE_KBLOCK_COST[b] for b in BLOCK_NS}
    least = min(cost.values())
    return next(b for b in BLOCK_NS if cost[b] <= least * (1 + 1e-6))


@dataclass
class _Problem:
    x: A.DevArray
    scales: A.DevArray
    sizes: A.DevArray
    packed: A.DevArray
    row_scale: A.DevArray
    layout: int
    groups: int
    rows: int
    max_m: int
    lead: tuple      # leading output dims: (rows,) or (G, max_m)
    block_n: int
    counts: A.DevArray | None = None  # contiguous: optional valid rows per group

    @property
    def counts_ptr(self):
        return self.counts.ptr if self.counts is not None else None


def _problem(x, x_scales, w: PackedWeights, group_offsets, masked_m, block_n, group_counts=None,
             entry: str = "fp4_gemm.ops.grouped_gemm") -> _Problem:
    """Checks the operands shared by every grouped GEMM entry point (names the bad argument)."""
    LIB.require()
    _require_cuda(entry, x)
    if (group_offsets is None) == (masked_m is None):
        raise ValueError("pass exactly one of group_offsets (contiguous) or masked_m (masked)")
    masked = masked_m is not None
    sizes_name = "masked_m" if masked else "group_offsets"
    xv, sv = A.view(x, "x"), A.view(x_scales, "x_scales")
    A.check(xv, "x", ("fp8", "u8"), ndim=3 if masked else 2, contiguous=True)
    A.check(sv, "x_scales", ("f32",), ndim=3 if masked else 2, contiguous=True)
    gv = A.view(masked_m if masked else group_offsets, sizes_name)
    A.check(gv, sizes_name, ("i32",), ndim=1, contiguous=True)
    pv, rv = A.view(w.packed, "w.packed"), A.view(w.row_scale, "w.row_scale")
    A.same_device(xv, sv, gv, pv, rv)
    G, K = w.num_groups, w.k
    _check_weights(w, pv, rv)
    if xv.shape[-1] != K:
        raise ValueError(f"x: last dimension {xv.shape[-1]} != weights' K {K}")
    if tuple(sv.shape) != tuple(xv.shape[:-1]) + (K // SCALE_GROUP,):
        raise ValueError(f"x_scales: expected shape {tuple(xv.shape[:-1]) + (K // SCALE_GROUP,)}, got {sv.shape}")
    if masked:
        if xv.shape[0] != G or gv.shape[0] != G:
            raise ValueError(f"x / masked_m: expected {G} groups, got {xv.shape[0]} / {gv.shape[0]}")
        max_m, rows, lead = xv.shape[1], G * xv.shape[1], (G, xv.shape[1])
    else:
        if gv.shape[0] != G + 1:
            raise ValueError(f"group_offsets: expected {G + 1} entries, got {gv.shape[0]}")
        max_m, rows, lead = 0, xv.shape[0], (xv.shape[0],)
    cv = None
    if group_counts is not None:
        if masked:
            raise ValueError("group_counts: only for the contiguous layout (masked_m gives the masked rows)")
        cv = A.view(group_counts, "group_counts")
        A.check(cv, "group_counts", ("i32",), ndim=1, contiguous=True)
        if cv.shape[0] != G:
            raise ValueError(f"group_counts: expected {G} entries, got {cv.shape[0]}")
        A.same_device(xv, cv)
    if block_n is None:
        block_n = pick_block_n(max_m if masked else -(-rows // max(G, 1)))
    if block_n not in BLOCK_NS:
        raise ValueError(f"block_n: must be one of {BLOCK_NS}, got {block_n}")
    return _Problem(xv, sv, gv, pv, rv, _LAYOUT["masked" if masked else "contiguous"], G, rows, max_m, lead, block_n,
                    cv)


def _check_weights(w: PackedWeights, pv: A.DevArray, rv: A.DevArray):
    """The packed buffers must be exactly what (G, N, K) says: the kernel trusts these sizes."""
    from .layout import constants
    C = constants()
    if w.n <= 0 or w.k <= 0 or w.n % C["kBlockRows"] or w.k % C["kBlockK"]:
        raise ValueError(f"w: N={w.n} must be a positive multiple of {C['kBlockRows']} and K={w.k} of {C['kBlockK']}")
    want = (w.num_groups, w.n // C["kBlockRows"], w.k // C["kBlockK"], C["kBlockChunkBytes"])
    A.check(pv, "w.packed", ("u8",), contiguous=True)
    if tuple(pv.shape) != want:
        raise ValueError(f"w.packed: expected shape {want} for G={w.num_groups}, N={w.n}, K={w.k}, got {pv.shape}")
    A.check(rv, "w.row_scale", ("f32",), contiguous=True)
    if tuple(rv.shape) != (w.num_groups, w.n):
        raise ValueError(f"w.row_scale: expected shape {(w.num_groups, w.n)}, got {rv.shape}")


def _output(p: _Problem, out, shape, kinds, name):
    if out is None:
        out = A.empty_like_framework(p.x, shape, kinds[0])
    ov = A.view(out, name)
    A.check(ov, name, kinds, contiguous=True)
    A.same_device(p.x, ov)
    if tuple(ov.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {ov.shape}")
    return out, ov


def grouped_gemm(x, x_scales, w: PackedWeights, *, group_offsets=None, group_counts=None, masked_m=None,
                 block_n=None, out=None, timeout_s: float = DEFAULT_TIMEOUT_S, splitk: SplitKWorkspace | None = None):
    """FP8 x MXFP4 grouped GEMM, BF16 output: out[r] = W_g @ (x[r] * scale) for the rows r of group g.

    Contiguous: x [M, K] (groups are row segments), group_offsets int32 [G + 1] on the GPU; optional
    group_counts int32 [G]: group g's rows are offsets[g] .. offsets[g] + min(counts[g], segment)
    (the rest, e.g. a dispatch pool's padding rows, are neither read nor written).
    Masked:     x [G, max_m, K], masked_m int32 [G] on the GPU (valid rows per group).
    x: FP8 E4M3 (CuPy: uint8), x_scales FP32 [..., K/128]. No host synchronisation.
    out (optional): BF16 [..., N], contiguous, data pointer 16-byte aligned.
    timeout_s: limit of each pipeline wait; past it the kernel returns and check_errors() raises.
    splitk: optional SplitKWorkspace (few tokens: K split over more CTAs; the sum order is fixed, so
    the bits do not depend on timing, but they differ from an unsplit call's in the last places).
    """
    p = _problem(x, x_scales, w, group_offsets, masked_m, block_n, group_counts)
    out, ov = _output(p, out, p.lead + (w.n,), ("bf16", "u16"), "out")
    if ov.ptr % 16:
        raise ValueError("out: data pointer must be 16-byte aligned (the kernel stores 16-byte row pieces)")
    tns = _timeout_ns(timeout_s)
    err = A.view(_error_word(p.x), "err")
    with A.device_of(p.x):
        LIB.call("fp4g_grouped_gemm_bf16", p.x.ptr, p.scales.ptr, p.packed.ptr, p.row_scale.ptr, p.sizes.ptr,
                 p.counts_ptr, ov.ptr,
                 p.layout, p.groups, p.rows, p.max_m, w.n, w.k, p.block_n, 0, *_splitk_args(splitk, p.x), err.ptr,
                 tns, A.stream_of(p.x))
    return out




def grouped_gemm_l1(x, x_scales, w: PackedWeights, topk_w, *, group_offsets=None, group_counts=None, masked_m=None,
                    activation_clamp: float = float("inf"), pow2: bool = False, block_n=None, out=None,
                    timeout_s: float = DEFAULT_TIMEOUT_S, splitk: SplitKWorkspace | None = None):
    """Grouped GEMM with the L1 epilogue over gate/up-interleaved W1 ([G, 2I, K], I % 128 == 0):
    a = silu(min(gate, c)) * clamp(up, -c, c) * topk_w[row] -> (E4M3 [..., I], FP32 scales
    [..., I / 128]: one per token per 128 channels, a valid x_scales of the L2 GEMM as it stands).
    topk_w: FP32, one per row of x ([M] or [G, max_m]). group_offsets / group_counts / masked_m: as
    grouped_gemm. out: optional preallocated (q, scales) of those shapes (q 16-byte aligned).
    timeout_s, splitk: as grouped_gemm."""
    if not w.gate_up_interleave:
        raise ValueError("w: the L1 epilogue needs weights transformed with gate_up_interleave=True")
    if not activation_clamp >= 0:
        raise ValueError(f"activation_clamp: must be >= 0 (inf for none), got {activation_clamp}")
    p = _problem(x, x_scales, w, group_offsets, masked_m, block_n, group_counts, entry="fp4_gemm.ops.grouped_gemm_l1")
    if (w.n // 2) % SCALE_GROUP:
        raise ValueError(f"w: the L1 epilogue needs an intermediate size (N / 2 = {w.n // 2}) that is a multiple of "
                         f"{SCALE_GROUP} (one output scale per {SCALE_GROUP} channels)")
    tv = A.view(topk_w, "topk_w")
    A.check(tv, "topk_w", ("f32",), ndim=len(p.lead), contiguous=True)
    if tuple(tv.shape) != p.lead:
        raise ValueError(f"topk_w: expected shape {p.lead}, got {tv.shape}")
    A.same_device(p.x, tv)
    inter = w.n // 2
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise ValueError("out: expected a (q, scales) pair")
    q, qv = _output(p, None if out is None else out[0], p.lead + (inter,), ("fp8", "u8"), "out[0] (q)")
    s, s_v = _output(p, None if out is None else out[1], p.lead + (inter // SCALE_GROUP,), ("f32",),
                     "out[1] (scales)")
    if qv.ptr % 16:
        raise ValueError("out[0] (q): data pointer must be 16-byte aligned (16-byte row-piece stores)")
    tns = _timeout_ns(timeout_s)
    err = A.view(_error_word(p.x), "err")
    with A.device_of(p.x):
        LIB.call("fp4g_grouped_gemm_l1", p.x.ptr, p.scales.ptr, p.packed.ptr, p.row_scale.ptr, p.sizes.ptr,
                 p.counts_ptr, tv.ptr, qv.ptr, s_v.ptr, p.layout, p.groups, p.rows, p.max_m, w.n, w.k, p.block_n,
                 float(activation_clamp), int(bool(pow2)), 0, *_splitk_args(splitk, p.x), err.ptr, tns,
                 A.stream_of(p.x))
    return q, s
