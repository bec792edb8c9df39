"""The benchmark CLI runs the reference over 2 CPU ranks and prints its table."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(ROOT / "packages" / p / "python") for p in ("fp4_gemm", "symm_comm", "megamoe"))
TIMEOUT_S = 120  # the run takes a few seconds; this only stops a hung process group


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, CUDA_VISIBLE_DEVICES="")  # CPU ranks even on a GPU host
    return subprocess.run([sys.executable, "-m", "megamoe.bench", *args], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


def test_tiny_table(tmp_path):
    out = tmp_path / "bench.json"
    r = _bench("--preset", "tiny", "--tokens", "1,4", "--ranks", "2", "--reps", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "not measured in this run" in r.stdout
    header = next(i for i, l in enumerate(lines) if l.split()[:1] == ["tokens/rank"])
    assert [l.split()[0] for l in lines[header + 1:]] == ["1", "4"], r.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [row["tokens_per_rank"] for row in rows] == [1, 4]
    for row in rows:
        assert row["time_us"] > 0 and row["floor_us"] > 0 and row["bound"] in ("fp8", "hbm", "nvlink")
        assert row["pairs"] == 2 * row["tokens_per_rank"] * 4  # tiny: top-4, no missing slots


def test_unbuilt_backend_is_a_clear_error():
    r = _bench("--backend", "fused")
    assert r.returncode != 0 and "not built yet" in r.stderr


def test_rank_costs_by_hand():
    """2 ranks x 2 tokens, experts 0-1 on rank 0 and 2-3 on rank 1."""
    import torch
    from megamoe.bench import Shape, count_flops, floor_time, hbm_bytes, nvlink_bytes, rank_costs

    shape = Shape(H=256, I=128, E=4, K=2)
    idx = torch.tensor([[0, 3], [1, -1],    # rank 0's tokens: one pair goes to rank 1
                        [2, 3], [0, 2]])    # rank 1's tokens: one pair goes to rank 0
    costs = rank_costs(idx, 2, shape)
    assert [c.pairs for c in costs] == [3, 4]
    assert [c.flops for c in costs] == [count_flops(3, 256, 128), count_flops(4, 256, 128)]
    assert costs[0].hbm == costs[1].hbm == hbm_bytes(2, 2, 256, 128) == 2 * 3 * 256 * 128 * 4.25 / 8 + 2 * 256 * 4
    # one FP8 row + 2 scales + top-k weight out, one BF16 row back, in each direction
    assert costs[0].nvlink == costs[1].nvlink == nvlink_bytes(1, 1, 256) == (256 + 2 * 4 + 4) + 2 * 256
    peaks = dict(fp8_tflops=1.0, hbm_tbs=1.0, nvlink_gbs=1.0)
    assert floor_time(2e12, 1e12, 1e9, peaks) == (2.0, "fp8")
    assert floor_time(1e12, 1e12, 3e9, peaks) == (3.0, "nvlink")
