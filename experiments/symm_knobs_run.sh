#!/usr/bin/env bash
# One GPU call for env-knob variants of symm_comm (run from the repo root on the GPU machine):
#   experiments/symm_knobs_run.sh TREE BASE_TREE "TEST_KNOBS" "VARIANT" ...
# TREE / BASE_TREE: ignored dirs holding a git-archive tree with build/lib, .whl/ and COMMIT (carried).
# 1. every symm_comm GPU test in TREE with TEST_KNOBS set (e.g. "SYMM_SMALL_DEDUP=1 SYMM_PAD_LATE=1");
# 2. bench/comm.py (1, 128, 4096 tokens) in TREE once per VARIANT ("X=0" = defaults), then once in
#    BASE_TREE (the same-run baseline); 3. experiments/comm_stamps.py 1 128 in TREE with TEST_KNOBS, if the
#    tree has per-CTA stamps. Key lines go to stdout; results (md) to $OUT (few files come back).
set -uo pipefail
tree=$1; base=$2; tknobs=$3; shift 3
root=$PWD; out=${OUT:-$root/out}; mkdir -p "$out"
run_in() {  # dir, then a command line
  (cd "$root/$1/tree" && export MEGAMOE_COMMIT=$(cat COMMIT) OUT="$out" && source scripts/gpu_env.sh >/dev/null 2>&1; eval "$2")
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run_in "$tree" "env $tknobs timeout 280 python3 -m pytest -q -x -m 'gpu or multigpu' tests/symm_comm 2>&1 | tail -4"
for v in "$@"; do
  echo "== $tree: $v"
  run_in "$tree" "env $v timeout 80 python3 bench/comm.py --backend torch --tokens 1 128 4096 2>&1 | grep -E '^\| [0-9]|peer copy|Error|needs|Traceback' | cut -c1-140"
done
echo "== $base (baseline)"
run_in "$base" "timeout 80 python3 bench/comm.py --backend torch --tokens 1 128 4096 2>&1 | grep -E '^\| [0-9]|peer copy|Error|needs|Traceback' | cut -c1-140"
run_in "$tree" "test -f experiments/comm_stamps.py && env $tknobs timeout 60 python3 experiments/comm_stamps.py 1 128 2>&1 | grep -E 'T=|    d\.|    c\.' | cut -c1-200"
run_in "$tree" "cp bench/results/comm-torch-ep2-*-\$(cat COMMIT).md $out/ 2>/dev/null; true"
