#!/usr/bin/env bash
# megamoe-bench on the device machine (one H200): the staged layer against the torch-fp8 and
# torch-bf16 baselines, flash and pro, 1 rank, tokens per rank 1..8192, with the FP8 peak and the
# HBM copy bandwidth measured in the same run. Results (JSON, markdown, PNG) go to bench/results/
# and are copied to $OUT with the log. Under 5 minutes on one H200; a hard stop at BENCH_TIMEOUT
# seconds (default 290) still leaves the partial results written after every (backend, preset).
#   scripts/bench_moe.sh [extra megamoe-bench arguments, e.g. --reps 20]
#   env: MEGAMOE_LIB_DIR (default build/lib), MEGAMOE_COMMIT (default: git, else "unknown"; names the
#        result files), BACKENDS, PRESETS, TOKENS, RANKS (1), REPS (10), WARMUP (3), BENCH_TIMEOUT (290)
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
export MEGAMOE_COMMIT="${MEGAMOE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# baselines first: a sticky CUDA error in the layer under test cannot cost their numbers
BACKENDS="${BACKENDS:-torch-fp8,torch-bf16,staged}"
PRESETS="${PRESETS:-flash,pro}"
TOKENS="${TOKENS:-1,16,128,512,2048,8192}"
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-290}" python3 -m megamoe.bench --backend "$BACKENDS" --preset "$PRESETS" \
  --tokens "$TOKENS" --ranks "${RANKS:-1}" --reps "${REPS:-10}" --warmup "${WARMUP:-3}" \
  --results bench/results --commit "$MEGAMOE_COMMIT" "$@" > "$OUT/bench_moe.log" 2> "$OUT/bench_moe.err"; rc=$?
echo "megamoe-bench rc=$rc in $(( $(date +%s) - start )) s"
grep -E "^\||^peaks|^time|^floor|^target|^wrote|^megamoe-bench" "$OUT/bench_moe.log" | head -80
grep -E "^\[megamoe-bench\]|Error|Traceback" "$OUT/bench_moe.err" | tail -60
cp bench/results/moe-*"$MEGAMOE_COMMIT"* "$OUT/" 2>/dev/null  # this run's files only (the copy-back limits the file count)
exit $rc
