#!/usr/bin/env bash
# One device call of a session: the GPU tests (the fused kernel's first, in their own process: a broken
# kernel cannot take the others' CUDA context with it), then optionally the benchmarks.
#   scripts/device_run.sh tests|bench|all
# env: MEGAMOE_COMMIT (names result files), BEFORE_DIR (a "before" checkout with its lib/ for the
# before/after gemm / comm columns, default build-before).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
what="${1:-all}"
T0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
if [ "$what" = tests ] || [ "$what" = all ]; then
  stamp "fused tests"
  timeout 300 python3 -m pytest -q -x --timeout 120 tests/megamoe/test_fused_gpu.py 2>&1 | tail -25 | tee "$OUT/fused_tests.log"
  stamp "fused rank tests"
  timeout 240 python3 -m pytest -q --timeout 220 tests/megamoe/test_fused_ranks_gpu.py 2>&1 | tail -25 | tee "$OUT/fused_ranks.log"
  stamp "other GPU tests"
  timeout 330 python3 -m pytest -q --timeout 150 -m "gpu or multigpu" tests --deselect tests/megamoe/test_reference.py \
    --ignore tests/megamoe/test_fused_gpu.py --ignore tests/megamoe/test_fused_ranks_gpu.py 2>&1 | tail -30 | tee "$OUT/gpu_tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  B="${BEFORE_DIR:-build-before}"
  stamp "gemm before"
  (cd "$B/src" && MEGAMOE_LIB_DIR="$PWD/../lib" PYTHONPATH="$PWD/packages/fp4_gemm/python:$PWD/packages/symm_comm/python:$PWD/packages/megamoe/python" \
     timeout 150 python3 bench/gemm.py --quick > "$OUT/gemm_before.log" 2>&1); tail -25 "$OUT/gemm_before.log"
  stamp "gemm after"
  timeout 150 python3 bench/gemm.py --quick > "$OUT/gemm_after.log" 2>&1; tail -25 "$OUT/gemm_after.log"
  stamp "comm before"
  (cd "$B/src" && MEGAMOE_LIB_DIR="$PWD/../lib" PYTHONPATH="$PWD/packages/fp4_gemm/python:$PWD/packages/symm_comm/python:$PWD/packages/megamoe/python" \
     timeout 120 python3 bench/comm.py > "$OUT/comm_before.log" 2>&1); tail -15 "$OUT/comm_before.log"
  stamp "comm after"
  timeout 120 python3 bench/comm.py > "$OUT/comm_after.log" 2>&1; tail -15 "$OUT/comm_after.log"
  if [ -z "${SKIP_MOE:-}" ]; then stamp "moe bench"
  BACKENDS="${BACKENDS:-torch-fp8,staged,fused}" BENCH_TIMEOUT=200 bash scripts/bench_moe.sh 2>&1 | tail -60
  cp bench/results/*.json bench/results/*.md "$OUT/" 2>/dev/null; fi
fi
stamp done
