#!/usr/bin/env bash
# One GPU call for an A/B of two symm_comm builds (run from the repo root on the GPU machine; the Python
# code is the working tree's, only the libraries differ):
#   experiments/symm_ab_run.sh LIB_A LIB_B      (LIB_*: folders holding libsymm_comm.so, carried)
# 1. every symm_comm GPU test with LIB_A (1 and 2 ranks, both backends when .whl/ holds the wheel);
# 2. compute-sanitizer memcheck of bench/profile_comm.py 1 37 128 600 with LIB_A;
# 3. bench/comm.py A, B at 1 / 128 / 4096 tokens, then A, B again at 128 tokens (alternating, one lease).
# Key lines to stdout (few files come back from $OUT).
set -uo pipefail
a=$1; b=$2
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
MEGAMOE_LIB_DIR=$PWD/$a timeout 280 python3 -m pytest -q -x -m "gpu or multigpu" tests/symm_comm 2>&1 | tail -3
MEGAMOE_LIB_DIR=$PWD/$a timeout 120 compute-sanitizer --tool memcheck --target-processes all \
  --report-api-errors no --error-exitcode 9 python3 bench/profile_comm.py 1 37 128 600 > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|wrong" "$OUT/memcheck.log" | sort | uniq -c
run() {  # lib, tokens...
  local lib=$1; shift
  echo "== $lib: tokens $*"
  MEGAMOE_LIB_DIR=$PWD/$lib timeout 90 python3 bench/comm.py --backend torch --tokens "$@" 2>&1 |
    grep -E '^\| [0-9]|peer copy|Error|Traceback' | cut -c1-220
}
run "$a" 1 128 4096; run "$b" 1 128 4096; run "$a" 128; run "$b" 128
