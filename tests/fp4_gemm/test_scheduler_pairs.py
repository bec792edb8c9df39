"""CPU check of the 2-CTA cluster (token multicast) tile-pair scheduler: compiles
scheduler_pairs_host.cpp against include/fp4_gemm/scheduler.cuh with a host C++ compiler."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HEADER = HERE.parents[1] / "packages/fp4_gemm/include/fp4_gemm/scheduler.cuh"


def test_cluster_pairs_lock_step(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    text = HEADER.read_text()
    assert '#include "fp4_gemm/ptx.cuh"' in text
    (tmp_path / "scheduler_stripped.h").write_text(text.replace('#include "fp4_gemm/ptx.cuh"', ""))
    exe = tmp_path / "sched"
    inc = [f"-I{tmp_path}", f"-I{HERE.parents[1] / 'packages/fp4_gemm/include'}",
           f"-I{HERE.parents[1] / 'packages/common/include'}"]  # layout.cuh, moe_common/constants.cuh
    subprocess.run([cxx, "-std=c++17", "-O1", *inc, str(HERE / "scheduler_pairs_host.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr
