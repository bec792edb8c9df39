"""megamoe.MegaMoE across R processes (R = 1, 2, 4) on the GPUs there are (rank r on GPU r % #GPUs):
every rank checks its own rows against the global reference (tests/megamoe/layer_worker.py).
1 rank: single-process mode (no torch.distributed). Ranks sharing a GPU: gloo + comm backend "ipc"."""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.dirname(__file__))
import layer_worker  # noqa: E402
from layer_cases import fresh_seed, why  # noqa: E402


def _n_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


def _libs_ok() -> bool:
    from fp4_gemm._lib import LIB as F
    from symm_comm._lib import LIB as S
    return F.available() and S.available()


# (world, comm backend): torch symmetric memory (or "ipc" where ranks share a GPU), and NVSHMEM where every
# rank has its GPU (issue 25 / 26's multi-GPU runs; skipped with fewer GPUs or without nvshmem4py).
WORLDS = [(1, "torch"), (2, "torch"), (4, "torch"), (8, "torch"), (2, "nvshmem"), (4, "nvshmem"), (8, "nvshmem")]


@pytest.mark.parametrize("world,comm", WORLDS, ids=[f"{w}-{c}" for w, c in WORLDS])
def test_layer_ranks(world, comm):
    if not _libs_ok():
        pytest.skip("libfp4_gemm.so / libsymm_comm.so not built")
    if world > _n_gpus() and not layer_worker.can_oversubscribe():
        pytest.skip(f"{world} ranks on {_n_gpus()} GPUs need symm_comm's 'ipc' backend or cupy")
    if (skip := layer_worker.backend_skip(world, comm)) is not None:
        pytest.skip(skip)
    seed = fresh_seed()
    print(f"world {world} ({comm}): {why(seed)}")
    res = layer_worker.launch(world, seed, timeout_s=900, backend=comm)
    bad = [r for r in res if not r["ok"]]
    assert not bad, f"{why(seed)}\n" + "\n".join(
        f"rank {r['rank']}: {r.get('error')}\n{r.get('traceback', '')}" for r in bad)
    for r in res:
        assert set(r["done"]) == {"cases", "back_to_back", "graph"}, f"rank {r['rank']} finished only {r['done']}"
        worst = min(r["cases"].items(), key=lambda kv: kv[1]["within"])
        print(f"rank {r['rank']} ({r.get('comm_backend')}): {len(r['cases'])} cases, worst within-1-ulp "
              f"{worst[1]['within']:.5f} ({worst[0]}), max rel-fro {max(m['rel'] for m in r['cases'].values()):.3e}")
