"""The GEMMs' error record (moe_common/errors.cuh, codes in fp4_gemm/errors.cuh) decodes into a
message naming the error, the role and the stage, and the timeout argument is checked."""
from __future__ import annotations

import pytest

from fp4_gemm import ops


def test_describe_timeouts_and_alignment():
    codes, phases, C = ops._error_tables()
    assert len(set(codes)) == 3 and all(32 <= c < 64 for c in codes), "fp4_gemm's code range (symm_comm: 1..31)"
    msg = ops.describe_error([C["kTimeoutEmpty"], 0, 0, 0, 0, 0, 0, 0])  # timeouts: the code only
    assert "producer timed out" in msg and "phase producer" in msg
    msg = ops.describe_error([C["kTimeoutFull"], 0, 0, 0, 0, 0, 0, 0])
    assert "math warp timed out" in msg and "phase math" in msg
    assert "1024-byte aligned" in ops.describe_error([C["kSmemAlign"], 0, C["kSetup"], 512, 0, 0, 0, 0])
    assert "code 99" in ops.describe_error([99, 0, 0, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("t", [0, -1.0, float("nan")])
def test_timeout_must_be_positive(t):
    with pytest.raises(ValueError, match="timeout_s"):
        ops._timeout_ns(t)
    assert ops._timeout_ns(ops.DEFAULT_TIMEOUT_S) == 20 * 10**9
