"""megamoe.MegaMoE(backend="fused") == backend="staged" BITWISE at 1, 2 and 4 ranks (tests/megamoe/fused_worker.py;
ranks sharing a GPU: symm_comm's "ipc" backend), with a timeout and its recovery at 2+ ranks."""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.dirname(__file__))
import fused_worker  # noqa: E402
import layer_worker  # noqa: E402
from layer_cases import fresh_seed, why  # noqa: E402


def _libs_ok() -> bool:
    from fp4_gemm._lib import LIB as F
    from megamoe._lib import LIB as M
    from symm_comm._lib import LIB as S
    return F.available() and S.available() and M.available()


# (world, comm backend): torch symmetric memory (or "ipc" where ranks share a GPU), and NVSHMEM where every
# rank has its GPU (issue 25 / 26's multi-GPU runs; skipped with fewer GPUs or without nvshmem4py).
WORLDS = [(1, "torch"), (2, "torch"), (4, "torch"), (8, "torch"), (2, "nvshmem"), (4, "nvshmem"), (8, "nvshmem")]


@pytest.mark.parametrize("world,comm", WORLDS, ids=[f"{w}-{c}" for w, c in WORLDS])
def test_fused_ranks(world, comm):
    if not _libs_ok():
        pytest.skip("libfp4_gemm.so / libsymm_comm.so / libmegamoe.so not built")
    if (skip := layer_worker.backend_skip(world, comm)) is not None:
        pytest.skip(skip)
    seed = fresh_seed()
    print(f"world {world} ({comm}): {why(seed)}")
    res = fused_worker.launch(world, seed, backend=comm)
    bad = [r for r in res if not r["ok"]]
    assert not bad, f"{why(seed)}\n" + "\n".join(
        f"rank {r['rank']}: {r.get('error')}\n{r.get('traceback', '')}" for r in bad)
    for r in res:
        assert set(r["done"]) == set(fused_worker.SCENARIOS), f"rank {r['rank']} finished only {r['done']}"
        print(f"rank {r['rank']} ({r.get('comm_backend')}): {len(r['cases'])} compared scenarios, "
              f"timeout report: {r.get('timeout_error', '-')}, seconds {r.get('seconds')}")
