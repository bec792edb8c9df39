#!/usr/bin/env bash
# fp4_gemm only (device machine): its GPU tests, then bench/gemm.py. Logs to $OUT.
#   scripts/gemm_check.sh [pytest -k expression]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
rc=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${STEP_TIMEOUT:-300}" python3 -m pytest -q -x -m gpu tests/fp4_gemm ${1:+-k "$1"} > "$OUT/gemm_tests.log" 2>&1; r=$?
  rc=$((rc | r)); tail -5 "$OUT/gemm_tests.log"; echo "gemm tests rc=$r"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${STEP_TIMEOUT:-300}" python3 bench/gemm.py ${BENCH_ARGS:-} > "$OUT/gemm_bench.log" 2>&1; r=$?
  rc=$((rc | r)); grep -E "^\||Error|error" "$OUT/gemm_bench.log" | head -30; echo "gemm bench rc=$r"
  cp bench/results/gemm-* "$OUT/" 2>/dev/null
fi
exit $rc
