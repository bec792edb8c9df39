#!/usr/bin/env bash
# The pending device work of the 2026-12-08 session in ONE call (~9 min; no device was lent that session).
# Prepare here (~15 min on 2 cores): cmake --build build (main); experiments/prepare_branch.sh mma8 (or keep
# build-mma8/lib); experiments/prepare_branch.sh qm. Carry: ["build/lib", "build-mma8/lib", "build-qm"].
#   1. main's Python, libraries main vs mma8: the 8-token tile on wgmma vs mma.sync, staged and fused calls at
#      1 / 16 / 128 tokens (CUDA-graph us, the GEMMs alone beside them);
#   2. branch qm (= qdispatch: the dispatch quantises BF16 x, + mma8) in its own tree (its ABI differs from
#      main's): the same A/B row, then every GPU test of the three packages (symm_comm's bf16_x scenario,
#      the layer vs the float64 reference, fused == staged bitwise, the GEMMs' own tests).
# Results: $OUT/main/all.tgz, $OUT/qm/all.tgz (tile_ab.log, *_tests.log).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-$PWD/out}
mkdir -p "$O/main" "$O/qm"
OUT=$O/main TAB_LIBS="build build-mma8" TAB_T=1,16,128 TAB_BN=8 TAB_B=staged,fused \
  timeout 200 bash experiments/device_call.sh tile-ab 2>&1 | tail -30
cd build-qm && MEGAMOE_LIB_DIR=$PWD/build-qm/lib OUT=$O/qm TAB_LIBS=build-qm TAB_T=1,16,128 TAB_BN=8 \
  TAB_B=staged,fused timeout 380 bash experiments/device_call.sh tile-ab symm-tests layer-tests fused-tests \
  gemm-tests 2>&1 | tail -60
