#!/usr/bin/env bash
# After scripts/symm_gpu_check.sh (same environment): the per-stage stamps (experiments/comm_stamps.py) and
# bench/comm.py once per combine schedule variant "LAG:SPIN_NS" (env SYMM_COMBINE_LAG / SYMM_SPIN_NS);
# each variant's results go to $OUT/variants/<LAG>_<SPIN>/.   VARIANTS="2:64 8:1000 -1:1000"
# ENV_VARIANTS="SYMM_META_ONEPASS=0 SYMM_COOP_LAUNCH=0": bench/comm.py once per NAME=VALUE (other knobs at
# their defaults), results in $OUT/variants/<NAME>_<VALUE>/.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
timeout 60 python3 experiments/comm_stamps.py 1 128 4096 2>&1 | grep -E "^rank|Error" | tee "$OUT/stamps.log"
for v in ${VARIANTS:-}; do
  lag=${v%%:*}; spin=${v##*:}; d="$OUT/variants/${lag}_${spin}"; mkdir -p "$d"
  rm -f bench/results/comm-torch-ep2-*-"${MEGAMOE_COMMIT:-x}".*
  SYMM_COMBINE_LAG=$lag SYMM_SPIN_NS=$spin timeout 90 python3 bench/comm.py --backend torch ${BENCH_ARGS:-} > "$d/bench.log" 2>&1
  echo "variant lag=$lag spin=$spin rc=$?"; grep -E "^\| [0-9]" "$d/bench.log" | cut -d'|' -f2-4,12-13
  cp bench/results/comm-torch-ep2-*-"${MEGAMOE_COMMIT:-x}".* "$d/" 2>/dev/null
done
for v in ${ENV_VARIANTS:-}; do
  d="$OUT/variants/${v%%=*}_${v##*=}"; mkdir -p "$d"
  rm -f bench/results/comm-torch-ep2-*-"${MEGAMOE_COMMIT:-x}".*
  env "$v" timeout 90 python3 bench/comm.py --backend torch ${BENCH_ARGS:-} > "$d/bench.log" 2>&1
  echo "variant $v rc=$?"; grep -E "^\| [0-9]" "$d/bench.log" | cut -d'|' -f2-4,12-13
  cp bench/results/comm-torch-ep2-*-"${MEGAMOE_COMMIT:-x}".* "$d/" 2>/dev/null
done
