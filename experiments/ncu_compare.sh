#!/usr/bin/env bash
# ncu source-level comparison of the fused kernel and the staged pipeline's two GEMM kernels, one call
# each (flash preset, T tokens): per-kernel WarpStateStats / SchedulerStats and the source page (CUDA
# lines and SASS) into $OUT, gzipped. Usage: experiments/ncu_compare.sh [T]
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
T=${1:-128}
bench="-m megamoe.bench --preset flash --tokens $T --ranks 1 --reps 1 --warmup 0 --no-graph --peaks fp8_tflops=1350,hbm_tbs=4.2,nvlink_gbs=380"
for spec in "fused:regex:fused_moe:1" "staged:regex:grouped_gemm:2"; do
  IFS=: read -r b k1 k2 n <<< "$spec"
  timeout 200 ncu --section SourceCounters --section WarpStateStats --section SchedulerStats --section LaunchStats \
    --kernel-name "$k1:$k2" --launch-count "$n" -f -o /tmp/ncu_$b python3 $bench --backend $b > /tmp/ncu_$b.log 2>&1
  echo "$b ncu rc=$? $(grep -c '==PROF==' /tmp/ncu_$b.log) prof lines"; grep -E "==ERROR|==WARNING" /tmp/ncu_$b.log | head -3
  ncu --import /tmp/ncu_$b.ncu-rep --page details --csv > "$OUT/ncu_${b}_details.csv" 2>&1
  ncu --import /tmp/ncu_$b.ncu-rep --page source --csv --print-source cuda 2>&1 | gzip > "$OUT/ncu_${b}_cuda.csv.gz"
  ncu --import /tmp/ncu_$b.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > "$OUT/ncu_${b}_sass.csv.gz"
  ls -la "$OUT" | tail -3
done
