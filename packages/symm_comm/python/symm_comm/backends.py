"""Symmetric allocations: one buffer per rank, mapped into every peer; returns the local tensor and
the peer base-pointer table. NVLink multicast is never requested (and disabled by environment)."""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def keep_multicast_off() -> None:
    for k, v in NVLS_OFF.items():
        os.environ.setdefault(k, v)


def nvshmem_available() -> bool:
    try:
        import nvshmem.core  # noqa: F401
        return True
    except Exception:
        return False


class TorchSymmBackend:
    name = "torch"

    def __init__(self, nbytes: int, group, device: torch.device):
        keep_multicast_off()
        import torch.distributed._symmetric_memory as symm_mem
        gname = group.group_name
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            try:
                enable(gname)
            except Exception:
                pass
        self.tensor = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        try:
            self.handle = symm_mem.rendezvous(self.tensor, group)
        except (TypeError, RuntimeError):
            self.handle = symm_mem.rendezvous(self.tensor, gname)
        # the tensor may sit at an offset inside the symmetric allocation; the offset is the same on
        # every rank (that is what makes it symmetric)
        rank = dist.get_rank(group)
        base = int(self.handle.buffer_ptrs[rank])
        off = int(self.tensor.data_ptr()) - base
        if not 0 <= off < int(getattr(self.handle, "buffer_size", off + 1)):
            raise RuntimeError(f"symm_comm: symmetric tensor at offset {off} outside its allocation")
        self.peer_ptrs = [int(p) + off for p in self.handle.buffer_ptrs]

    def close(self):
        self.handle = None
        self.tensor = None


class LocalBackend:
    """Single-process mode (Buffer(None, ...) without torch.distributed, or single_rank=True): one rank,
    a plain CUDA allocation as the "symmetric" buffer, peer table = [own pointer], no collectives."""
    name = "local"
    ALIGN = 4096  # the caching allocator aligns to 512 B; symmetric heaps to pages: match them

    def __init__(self, nbytes: int, device: torch.device):
        self._storage = torch.empty(nbytes + self.ALIGN, dtype=torch.uint8, device=device)
        off = (-int(self._storage.data_ptr())) % self.ALIGN
        self.tensor = self._storage[off:off + nbytes]
        self.peer_ptrs = [int(self.tensor.data_ptr())]

    def close(self):
        self.tensor = None
        self._storage = None


_NVSHMEM = {"init": False, "group_size": None}


def _nvshmem_init(group, device: torch.device, nbytes: int):
    import nvshmem.core as nvc
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if _NVSHMEM["init"]:
        if _NVSHMEM["group_size"] != size:
            raise RuntimeError("symm_comm: NVSHMEM is already initialised for another group size")
        return
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(int(nbytes * 1.25) + (1 << 30))
    try:
        from cuda.core import Device
    except ImportError:  # older cuda-python
        from cuda.core.experimental import Device
    dev = Device(device.index)
    dev.set_current()
    uid = nvc.get_unique_id(empty=(rank != 0))
    payload = [uid._data.view(np.int8).tobytes() if rank == 0 else None]
    dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
    if rank != 0:
        uid._data.view(np.int8)[:] = np.frombuffer(payload[0], dtype=np.int8)
    nvc.init(device=dev, uid=uid, rank=rank, nranks=size, initializer_method="uid")
    _NVSHMEM.update(init=True, group_size=size)


class NvshmemBackend:
    name = "nvshmem"

    def __init__(self, nbytes: int, group, device: torch.device):
        keep_multicast_off()
        import nvshmem.core as nvc
        _nvshmem_init(group, device, nbytes)
        size = dist.get_world_size(group)
        # collective: every PE allocates the same size in the same order
        self.tensor = nvc.tensor((nbytes,), dtype=torch.uint8, except_on_del=False)
        self.peer_ptrs = [int(nvc.get_peer_tensor(self.tensor, pe).data_ptr()) for pe in range(size)]
        if any(p == 0 for p in self.peer_ptrs):
            raise RuntimeError("symm_comm: a peer's NVSHMEM buffer is not directly addressable (not on this "
                               "node's NVLink domain)")

    def close(self):
        if self.tensor is not None:
            import nvshmem.core as nvc
            nvc.free_tensor(self.tensor)
            self.tensor = None


def nvshmem_finalize():
    if _NVSHMEM["init"]:
        import nvshmem.core as nvc
        nvc.finalize()
        _NVSHMEM.update(init=False, group_size=None)


class IpcBackend:
    """backend="ipc": each rank allocates its buffer with torch's caching allocator and maps every peer's
    through CUDA IPC (cudaIpcOpenMemHandle with lazy peer access, in this rank's device context).

    When to use it: several ranks on one GPU (tests, emulating R ranks on fewer GPUs; see
    symm_comm.testing), which torch symmetric memory and NVSHMEM refuse. Peers on other GPUs of the node
    are reached over NVLink / PCIe peer access. Single node only (CUDA IPC handles do not cross hosts),
    one process per rank (a process cannot open its own handle). Not a performance path: ranks sharing
    a GPU are time-sliced. Works with any process group that can all_gather_object (gloo included).

    Implementation: torch's own CUDA IPC (UntypedStorage._share_cuda_ / _new_shared_cuda, what
    torch.multiprocessing uses), one share per peer so torch's per-share reference counts balance; no
    CuPy (passed 2 and 4 ranks on one H200, 2026-12-01). close() is collective (Buffer.destroy on every
    rank): no rank frees its buffer while a peer may still use it or before every peer unmapped it."""
    name = "ipc"

    def __init__(self, nbytes: int, group, device: torch.device):
        self._group = group
        self._dev = device.index if device.index is not None else torch.cuda.current_device()
        self._peer_storages = []
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        with torch.cuda.device(self._dev):
            self._init_torch(nbytes, group, rank, size)

    def _init_torch(self, nbytes, group, rank, size):
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", self._dev))
        storage = self.tensor.untyped_storage()
        torch.cuda.synchronize(self._dev)
        # one share per peer: each share carries its own reference count, released by that peer's unmap
        shares = [None if r == rank else tuple(storage._share_cuda_()) for r in range(size)]
        every = [None] * size
        dist.all_gather_object(every, shares, group=group)
        self.peer_ptrs = []
        for r in range(size):
            if r == rank:
                self.peer_ptrs.append(int(self.tensor.data_ptr()))
                continue
            args = list(every[r][rank])
            # (device, handle, size, offset, ref counter, its offset, event, event sync): open the mapping in
            # THIS rank's device context (the peer's memory may live on another GPU: mapped for peer access)
            args[0] = self._dev
            # no IPC event wait: every producer synchronised its device before sharing (nothing pending)
            args[7] = False
            st = torch.UntypedStorage._new_shared_cuda(*args)
            if st.nbytes() != nbytes:
                raise RuntimeError(f"symm_comm: rank {r}'s IPC buffer has {st.nbytes()} bytes, expected {nbytes}")
            self._peer_storages.append(st)
            self.peer_ptrs.append(int(st.data_ptr()))

    def close(self):
        torch.cuda.synchronize(self._dev)
        dist.barrier(group=self._group)  # every rank's kernels on every buffer done
        self._peer_storages = []  # unmaps the peers' buffers (and releases their reference counts)
        torch.cuda.synchronize(self._dev)
        dist.barrier(group=self._group)  # every peer unmapped mine
        self.tensor = None
        torch.cuda.ipc_collect()


BACKENDS = ("torch", "nvshmem", "ipc")


def make_backend(name: str, nbytes: int, group, device):
    if name == "torch":
        return TorchSymmBackend(nbytes, group, device)
    if name == "nvshmem":
        return NvshmemBackend(nbytes, group, device)
    if name == "ipc":
        return IpcBackend(nbytes, group, device)
    raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, got {name!r}")
