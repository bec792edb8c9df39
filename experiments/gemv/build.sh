#!/usr/bin/env bash
# Builds the few-token GEMM experiment into build-gemv/ (here: nvcc 13 matches the GPU machine's driver):
# libgemv.so (128-row units, 8 stages, 2 CTAs per SM), libgemv_s6c3.so (6 stages, 3 CTAs per SM), libgemv_pair.so
# (256-row units: the L1 epilogue's 128 channels; 4 stages of 2 chunks) and libgemv_half.so (64-row units, 4
# consumer warps, 4 CTAs per SM). Carry build-gemv and run `python experiments/gemv/run_gemv.py build-gemv/<lib>`
# there (device_call.sh gemv runs all four).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-gemv
for v in "libgemv.so:8:2:1:0" "libgemv_s6c3.so:6:3:1:0" "libgemv_pair.so:4:2:2:0" "libgemv_half.so:8:4:1:1"; do
  IFS=: read -r name stages ctas pair half <<< "$v"
  nvcc -I packages/fp4_gemm/include -I packages/common/include -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 \
    --expt-relaxed-constexpr -Xptxas=-v -shared -Xcompiler -fPIC -DGEMV_STAGES="$stages" -DGEMV_CTAS="$ctas" -DGEMV_PAIR="$pair" -DGEMV_HALF="$half" \
    experiments/gemv/gemv.cu -o "build-gemv/$name" 2>&1 | grep -E "error|registers|spill" | sed "s/^/$name: /"
done
