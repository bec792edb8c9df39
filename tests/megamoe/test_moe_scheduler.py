"""CPU check of the fused kernel's task scheduler and workspace layout: compiles
moe_scheduler_host.cpp against include/megamoe/{scheduler,layout}.cuh (the real headers) with a host
C++ compiler and runs it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_waves_tasks_and_ring(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    exe = tmp_path / "sched"
    inc = [f"-I{ROOT / p / 'include'}" for p in ("packages/megamoe", "packages/symm_comm", "packages/common")]
    r = subprocess.run([cxx, "-std=c++17", "-O1", *inc, str(HERE / "moe_scheduler_host.cpp"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
