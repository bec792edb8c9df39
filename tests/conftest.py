"""Shared pytest setup: GPU tests skip cleanly on machines without the GPUs they need."""
from __future__ import annotations

import pytest


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:  # CPU-only installs without torch still run the torch-free tests
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    n_gpus = _cuda_device_count()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if "gpu" in item.keywords and n_gpus < 1:
            item.add_marker(skip_gpu)
        if "multigpu" in item.keywords and n_gpus < 2:
            item.add_marker(skip_multi)
