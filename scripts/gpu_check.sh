#!/usr/bin/env bash
# The GPU test script: run on a GPU machine from the repo root, over a build folder made anywhere
# (nvcc >= 12.8, same x86-64 Linux): runs the GPU tests, then the benchmarks, and writes results
# under bench/results/ (GPU name, commit, date) and, when $OUT is set, copies logs/results there.
#   scripts/gpu_check.sh [tests|bench|sanitize|all]...   (default: tests bench)
#   env: MEGAMOE_LIB_DIR (default build/lib), MEGAMOE_COMMIT (default: git), PYTEST_ARGS
set -uo pipefail
cd "$(dirname "$0")/.."
export MEGAMOE_LIB_DIR="${MEGAMOE_LIB_DIR:-$PWD/build/lib}"
export PYTHONPATH="$PWD/packages/fp4_gemm/python:$PWD/packages/symm_comm/python:$PWD/packages/megamoe/python:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
# NVLink multicast stays off everywhere (shared hosts).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests bench)
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      timeout 900 python3 -m pytest -q -m "gpu or multigpu" tests ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log"
      rc=$((rc | ${PIPESTATUS[0]})) ;;
    bench)
      timeout 600 python3 bench/gemm.py 2>&1 | tee "$OUT/bench_gemm.log"; rc=$((rc | ${PIPESTATUS[0]})) ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout 600 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x \
          "tests/fp4_gemm/test_gemm_gpu.py::test_contiguous[None-3-256-256-sizes1]" 2>&1 | tail -20 | tee "$OUT/sanitize_$tool.log"
        rc=$((rc | ${PIPESTATUS[0]}))
      done ;;
    *) echo "unknown step $s"; rc=2 ;;
  esac
done
cp bench/results/*.md bench/results/*.json "$OUT/" 2>/dev/null
exit $rc
