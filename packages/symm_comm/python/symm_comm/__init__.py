"""symm_comm: symmetric memory and expert-granular EP dispatch/combine over NVLink.

    buf = symm_comm.Buffer(group, num_experts, hidden, topk, max_tokens_per_rank, backend="torch")
    pool, pool_scales, pool_topk_w, expert_counts, handle = buf.dispatch(x_fp8, x_scales, topk_idx, topk_w)
    y = buf.combine(expert_out, handle)
    buf = symm_comm.Buffer(None, ...)   # without torch.distributed initialised: one rank, all experts local


Device code (include/symm_comm/*.cuh) can be composed into other kernels; the standalone kernels
live in libsymm_comm.so (plain C ABI, csrc/symm_api.h)."""
from ._native import KernelsNotBuiltError, NoCudaDeviceError, require_cuda_device  # noqa: F401
from .errors import SymmCommError, SymmTimeoutError  # noqa: F401
from .layout import REGIONS, compute_layout, describe, region_bytes  # noqa: F401


def __getattr__(name):  # torch-dependent parts load lazily
    if name in ("Buffer", "Handle", "resolve_group"):
        from . import buffer
        return getattr(buffer, name)
    if name in ("nvshmem_available", "nvshmem_finalize", "keep_multicast_off"):
        from . import backends
        return getattr(backends, name)
    raise AttributeError(name)


def include_dir() -> str:
    """Folder holding symm_comm/*.cuh (for composing the device code in another project)."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.path.join(here, "include"), os.path.join(here, "..", "..", "include")):
        if os.path.isdir(os.path.join(cand, "symm_comm")):
            return os.path.abspath(cand)
    raise FileNotFoundError("symm_comm headers not found")
