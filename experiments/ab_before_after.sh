#!/usr/bin/env bash
# Before / after A/B of the standalone packages in ONE device call (issue 23's done-when): bench/gemm.py
# --quick and bench/comm.py (1 rank; push and pull combine) of a BEFORE tree (its own sources, Python
# and libraries, carried: BEFORE/src + BEFORE/lib) and of the working tree with build/lib, alternating,
# ROUNDS rounds (default 1). Run from the repo root on the GPU machine:  experiments/ab_before_after.sh build-cb33
# Tables to stdout and $OUT/ab_*.log.
set -uo pipefail
before=$1
source scripts/gpu_env.sh >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
old() {  # command in the BEFORE tree with its Python and libraries
  (cd "$before/src" && MEGAMOE_LIB_DIR="$PWD/../lib" \
     PYTHONPATH="$PWD/packages/fp4_gemm/python:$PWD/packages/symm_comm/python:$PWD/packages/megamoe/python" "$@")
}
for round in $(seq 1 "${ROUNDS:-1}"); do
  old timeout 150 python3 bench/gemm.py --quick > "$OUT/ab_gemm_before_$round.log" 2>&1
  timeout 150 python3 bench/gemm.py --quick > "$OUT/ab_gemm_after_$round.log" 2>&1
  echo "== gemm round $round (before # after)"
  paste -d'#' <(grep -E "^\| [a-z]" "$OUT/ab_gemm_before_$round.log" | cut -d'|' -f2-4) \
              <(grep -E "^\| [a-z]" "$OUT/ab_gemm_after_$round.log" | cut -d'|' -f4)
  for cmb in push pull; do
    old timeout 120 python3 bench/comm.py --backend torch --combine $cmb > "$OUT/ab_comm_${cmb}_before_$round.log" 2>&1
    timeout 120 python3 bench/comm.py --backend torch --combine $cmb > "$OUT/ab_comm_${cmb}_after_$round.log" 2>&1
    echo "== comm $cmb round $round (tokens | dispatch | combine | ... before # after)"
    paste -d'#' <(grep -E "^\| [0-9]" "$OUT/ab_comm_${cmb}_before_$round.log" | cut -d'|' -f2-4,12-13) \
                <(grep -E "^\| [0-9]" "$OUT/ab_comm_${cmb}_after_$round.log" | cut -d'|' -f2-4,12-13)
    grep -h -E "Error|Traceback" "$OUT"/ab_comm_${cmb}_*_$round.log | head -3
  done
done
python3 experiments/ab_table.py "$OUT" | tee "$OUT/ab-table.md" | tail -3
