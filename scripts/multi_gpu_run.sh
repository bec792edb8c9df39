#!/usr/bin/env bash
# Issues 25 / 26 on a machine with R GPUs (nvidia-h200-x2 / -x4 / -x8), in two device calls of < 10 min:
#   scripts/multi_gpu_run.sh tests   every GPU test: symm_comm at 1 and all ranks (torch and NVSHMEM), the layer's and
#                                    the fused kernel's rank tests at 2 / 4 / 8 ranks with both backends where each
#                                    rank has its GPU (tests/megamoe/test_*_ranks_gpu.py), the rest of the GPU tests
#   scripts/multi_gpu_run.sh bench   megamoe-bench at R ranks (torch-fp8 over NCCL, staged, fused; FP8 peak, HBM copy
#                                    and peer copy measured in the run) and bench/comm.py at R ranks (1, 128, 4096
#                                    tokens), results under bench/results/ and $OUT
# env: MEGAMOE_COMMIT (names result files; the device copy has no .git), RANKS (default: every GPU),
#      STEP_TIMEOUT (seconds per step, default 280).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
T="${STEP_TIMEOUT:-280}"
R="${RANKS:-$(nvidia-smi -L | wc -l)}"
T0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -12
python3 -c "import nvshmem.core" 2>/dev/null && echo "nvshmem4py: yes" || echo "nvshmem4py: NO (NVSHMEM cases skip)"
for step in "$@"; do
  case "$step" in
    tests)
      stamp "rank tests (layer, fused; torch and NVSHMEM)"
      timeout "$T" python3 -m pytest -q -rs --timeout 250 tests/megamoe/test_layer_ranks_gpu.py \
        tests/megamoe/test_fused_ranks_gpu.py > "$OUT/rank_tests.log" 2>&1; echo "rc=$?"
      grep -E "passed|failed|SKIPPED|^FAILED" "$OUT/rank_tests.log" | tail -16
      stamp "symm_comm GPU tests (1 and all ranks, both backends)"
      timeout "$T" python3 -m pytest -q -rs --timeout 250 -m "gpu or multigpu" tests/symm_comm > "$OUT/symm_tests.log" 2>&1
      echo "rc=$?"; grep -E "passed|failed|SKIPPED|^FAILED" "$OUT/symm_tests.log" | tail -10
      stamp "the other GPU tests"
      timeout "$T" python3 -m pytest -q -rs --timeout 200 -m "gpu or multigpu" tests --ignore tests/symm_comm \
        --ignore tests/megamoe/test_layer_ranks_gpu.py --ignore tests/megamoe/test_fused_ranks_gpu.py \
        --deselect tests/megamoe/test_reference.py > "$OUT/other_tests.log" 2>&1
      echo "rc=$?"; grep -E "passed|failed|^FAILED" "$OUT/other_tests.log" | tail -10 ;;
    bench)
      stamp "megamoe-bench at $R ranks"
      RANKS="$R" BACKENDS="${BACKENDS:-torch-fp8,staged,fused}" BENCH_TIMEOUT="$T" bash scripts/bench_moe.sh 2>&1 | tail -45
      for cmb in push pull; do  # push: rows written into the sources (peer write bw); pull: the layers' combine
        stamp "bench/comm.py at $R ranks, $cmb combine"
        timeout 200 python3 bench/comm.py --combine $cmb > "$OUT/comm_$cmb.log" 2>&1; echo "rc=$?"
        grep -E "^\||peer" "$OUT/comm_$cmb.log" | head -8 | cut -c1-400
      done
      cp bench/results/comm-*"${MEGAMOE_COMMIT:-none}"* "$OUT/" 2>/dev/null ;;
    *) echo "unknown step $step (tests | bench)" ;;
  esac
done
stamp done
