#!/usr/bin/env bash
# symm_comm only, on a GPU machine, from the repo root over a build made elsewhere: every symm_comm GPU
# test (1 rank and all ranks, both backends) then bench/comm.py (torch backend); logs and the bench
# results (bench/results/comm-*) are copied to $OUT. Environment: scripts/gpu_env.sh.
#   env: MEGAMOE_LIB_DIR (default build/lib), MEGAMOE_COMMIT, TEST_TIMEOUT (200), BENCH_TIMEOUT (200),
#        BENCH_ARGS (extra bench/comm.py arguments), SKIP_TESTS=1
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -m "gpu or multigpu" tests/symm_comm -x > "$OUT/tests.log" 2>&1
  r=$?; rc=$((rc | r)); tail -25 "$OUT/tests.log"; echo "tests rc=$r"
fi
timeout "${BENCH_TIMEOUT:-200}" python3 bench/comm.py --backend torch ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
r=$?; rc=$((rc | r)); grep -E "^\||peer copy" "$OUT/bench.log"; tail -5 "$OUT/bench.log"; echo "bench rc=$r"
mkdir -p "$OUT/results"; cp bench/results/comm-* "$OUT/results/" 2>/dev/null
exit $rc
