"""symm_comm.testing.placement (pure) and the "ipc" backend's name checks, on CPU."""
from __future__ import annotations

import pytest

from symm_comm.testing import placement


def test_one_gpu_per_rank():
    p = placement(1, 2, n_gpus=2)
    assert (p.device.index, p.backend, p.pg_backend, p.shared_gpu) == (1, "torch", "cpu:gloo,cuda:nccl", False)
    assert placement(0, 2, "nvshmem", n_gpus=8).backend == "nvshmem"
    assert placement(0, 2, "ipc", n_gpus=2).backend == "ipc"


def test_fewer_gpus_than_ranks():
    ps = [placement(r, 4, n_gpus=1) for r in range(4)]
    assert [p.device.index for p in ps] == [0, 0, 0, 0]
    assert all(p.backend == "ipc" and p.pg_backend == "gloo" and p.shared_gpu for p in ps)
    assert [placement(r, 4, n_gpus=2).device.index for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="nvshmem"):
        placement(0, 4, "nvshmem", n_gpus=2)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        placement(0, 2, n_gpus=0)
    with pytest.raises(ValueError):
        placement(2, 2, n_gpus=2)


def test_backend_names():
    from symm_comm._validate import check_buffer_args
    from symm_comm.backends import BACKENDS, make_backend
    assert "ipc" in BACKENDS
    with pytest.raises(ValueError, match="'ipc'"):
        make_backend("nccl", 1024, None, None)
    with pytest.raises(ValueError, match="'ipc'"):
        check_buffer_args(2, 16, 256, 2, 8, 128, "nccl")
