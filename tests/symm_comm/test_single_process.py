"""symm_comm single-process mode (Buffer(None, ...) without torch.distributed) and the no-CUDA error,
checked without a GPU; the GPU round trip is in tests/megamoe/test_layer_gpu.py
(test_single_process_buffer_roundtrip) and the multi-rank paths in test_comm_gpu.py."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import symm_comm
from symm_comm.buffer import SINGLE_BACKENDS, resolve_group


def test_resolve_group_single_without_distributed():
    assert not (dist.is_available() and dist.is_initialized())
    assert resolve_group() == (True, None, 1, 0)
    assert resolve_group(None, single_rank=True) == (True, None, 1, 0)
    with pytest.raises(ValueError, match="single_rank"):
        resolve_group(object(), single_rank=True)
    assert {"torch", "nvshmem", "ipc"} <= set(SINGLE_BACKENDS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_buffer_without_cuda_is_a_clear_error():
    with pytest.raises(symm_comm.NoCudaDeviceError, match="no CUDA device"):
        symm_comm.Buffer(None, 8, 256, 2, 16)
    with pytest.raises(RuntimeError):  # a RuntimeError subclass, not torch's AssertionError
        symm_comm.Buffer(None, 8, 256, 2, 16, combine_input_rows=-1)
