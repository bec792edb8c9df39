#!/usr/bin/env bash
# A/B of build variants (device machine): experiments/probe_gemm.py once per library folder.
#   experiments/gemm_variants.sh "<case ...>" libdir1 libdir2 ...
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
cases="$1"; shift
for d in "$@"; do MEGAMOE_LIB_DIR="$PWD/$d" timeout 120 python3 experiments/probe_gemm.py $cases; done
