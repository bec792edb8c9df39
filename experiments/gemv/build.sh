#!/usr/bin/env bash
# Builds the GEMV experiment into build-gemv/libgemv.so (here: nvcc 13 matches the GPU machine's driver); carry
# build-gemv and run `python experiments/gemv/run_gemv.py build-gemv/libgemv.so` there (or device_call.sh gemv).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-gemv
nvcc -I packages/fp4_gemm/include -I packages/common/include -O3 -gencode=arch=compute_90a,code=sm_90a -std=c++17 \
  --expt-relaxed-constexpr -Xptxas=-v -shared -Xcompiler -fPIC experiments/gemv/gemv.cu -o build-gemv/libgemv.so 2>&1 |
  grep -E "error|registers|spill"
