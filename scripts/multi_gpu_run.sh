#!/usr/bin/env bash
# Issues 25 / 26 on a machine with R GPUs (nvidia-h200-x2 / -x4 / -x8): one device call (< 10 min) per step:
#   scripts/multi_gpu_run.sh ranks   the layer's and the fused kernel's rank tests at 2 / 4 / 8 ranks, torch symmetric
#                                    memory and NVSHMEM where each rank has its GPU (tests/megamoe/test_*_ranks_gpu.py)
#   scripts/multi_gpu_run.sh tests   symm_comm's GPU tests (1 and all ranks, both backends), then the other GPU tests
#   scripts/multi_gpu_run.sh bench   megamoe-bench at R ranks (torch-fp8 over NCCL, staged, fused; FP8 peak, HBM copy
#                                    and peer copy measured in the run), then bench/comm.py on every GPU (1, 128,
#                                    4096 tokens; push and pull combine); results under bench/results/ and $OUT
# env: MEGAMOE_COMMIT (names result files; the device copy has no .git), RANKS (megamoe-bench's; default every GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh  # sets OUT (default ./out), the library folder, the nvshmem4py wheel
R="${RANKS:-$(nvidia-smi -L | wc -l)}"
T0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
[ $# -eq 0 ] && { echo "usage: scripts/multi_gpu_run.sh ranks | tests | bench (one device call each)"; exit 2; }
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -12
python3 -c "import nvshmem.core" 2>/dev/null && echo "nvshmem4py: yes" || echo "nvshmem4py: NO (NVSHMEM cases skip)"
for step in "$@"; do
  case "$step" in
    ranks)
      stamp "rank tests (layer, fused; torch and NVSHMEM)"
      timeout 540 python3 -m pytest -q -rs --timeout 250 tests/megamoe/test_layer_ranks_gpu.py \
        tests/megamoe/test_fused_ranks_gpu.py > "$OUT/rank_tests.log" 2>&1; echo "rc=$?"
      grep -E "passed|failed|SKIPPED|^FAILED" "$OUT/rank_tests.log" | tail -16 ;;
    tests)
      stamp "symm_comm GPU tests (1 and all ranks, both backends)"
      timeout 270 python3 -m pytest -q -rs --timeout 250 -m "gpu or multigpu" tests/symm_comm > "$OUT/symm_tests.log" 2>&1
      echo "rc=$?"; grep -E "passed|failed|SKIPPED|^FAILED" "$OUT/symm_tests.log" | tail -10
      stamp "the other GPU tests"
      timeout 270 python3 -m pytest -q -rs --timeout 200 -m "gpu or multigpu" tests --ignore tests/symm_comm \
        --ignore tests/megamoe/test_layer_ranks_gpu.py --ignore tests/megamoe/test_fused_ranks_gpu.py \
        --deselect tests/megamoe/test_reference.py > "$OUT/other_tests.log" 2>&1
      echo "rc=$?"; grep -E "passed|failed|^FAILED" "$OUT/other_tests.log" | tail -10 ;;
    bench)
      stamp "megamoe-bench at $R ranks"
      RANKS="$R" BACKENDS="${BACKENDS:-torch-fp8,staged,fused}" BENCH_TIMEOUT=300 bash scripts/bench_moe.sh 2>&1 | tail -45
      for cmb in push pull; do  # push: rows written into the sources (peer write bw); pull: the layers' combine
        stamp "bench/comm.py on every GPU, $cmb combine"
        timeout 120 python3 bench/comm.py --combine $cmb > "$OUT/comm_$cmb.log" 2>&1; echo "rc=$?"
        grep -E "^\||peer" "$OUT/comm_$cmb.log" | head -8 | cut -c1-400
      done
      cp bench/results/comm-*"${MEGAMOE_COMMIT:-none}"* "$OUT/" 2>/dev/null ;;
    *) echo "unknown step $step (ranks | tests | bench)" ;;
  esac
done
stamp done
