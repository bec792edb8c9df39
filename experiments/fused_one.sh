#!/usr/bin/env bash
# One instantiation of the fused kernel (csrc/fused.cu's switch, block_n $1) compiled alone (~10-60 s), with ptxas's summary and the
# spill instructions by setmaxnreg region (experiments/sass_regions.py). Usage: experiments/fused_one.sh 8 [file.cu]
set -euo pipefail
cd "$(dirname "$0")/.."
bn=$1; src=${2:-packages/megamoe/csrc/fused.cu}
tmp=$(mktemp -d)
grep -v -E "case (8|16|32|64|128): return run<" "$src" > $tmp/f.cu
sed -i "s|    default: return MOE_EINVAL;|    case $bn: return run<$bn>(p, pool_x, l1_q, num_sms, stream);\n    default: return MOE_EINVAL;|" $tmp/f.cu
I="-I packages/megamoe/include -I packages/fp4_gemm/include -I packages/symm_comm/include -I packages/common/include -I packages/megamoe/csrc -I packages/fp4_gemm/csrc"
nvcc $I ${EXTRA:-} -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -std=c++17 --expt-relaxed-constexpr -Xptxas=-v -c $tmp/f.cu -o $tmp/f.o 2>&1 | grep -E "fused_moe|Used|spill" | grep -B1 -A1 "fused_moe" | grep -E "Used|spill" | head -4
PATH=/tmp/bin:$PATH python3 experiments/sass_regions.py $tmp/f.o fused_moe
[ -n "${KEEP:-}" ] && cp $tmp/f.o "$KEEP"
rm -rf $tmp
