"""Shared by the CPU tests that call libsymm_comm.so directly: skip cleanly when it is not built."""
from __future__ import annotations

import pytest


def lib_or_skip():
    from symm_comm._lib import LIB
    if not LIB.available():
        pytest.skip("libsymm_comm.so not built")
    return LIB


def layout(*a, **k):
    """symm_comm.layout.compute_layout, or skip."""
    lib_or_skip()
    from symm_comm.layout import compute_layout
    return compute_layout(*a, **k)
