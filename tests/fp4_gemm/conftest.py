"""fp4_gemm tests' shared fixtures."""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture
def gen():
    """A fresh seeded generator per test; the seed is printed (shown on failure) and MEGAMOE_TEST_SEED pins it."""
    seed = int(os.environ.get("MEGAMOE_TEST_SEED", "0")) or int.from_bytes(os.urandom(8), "little") >> 1
    print(f"seed={seed}  (rerun with MEGAMOE_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)
