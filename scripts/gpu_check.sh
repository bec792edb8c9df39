#!/usr/bin/env bash
# The GPU test script: run on a GPU machine from the repo root, over a build folder made anywhere
# (nvcc >= 12.8, x86-64 Linux): runs every GPU test, the benchmarks and compute-sanitizer, and
# writes results under bench/results/ (GPU name, commit, date); with $OUT set, logs and results are
# copied there too (logs + results.tgz).
#   scripts/gpu_check.sh [tests] [bench] [sanitize | sanitize-gemm | sanitize-symm | sanitize-fused]
#   (default: tests bench)
#   env: MEGAMOE_LIB_DIR (default build/lib), MEGAMOE_COMMIT (default: git), PYTEST_ARGS,
#        STEP_TIMEOUT (seconds per step, default 540)
# Environment (library folder, nvshmem4py wheel, multicast off, $OUT): scripts/gpu_env.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
T="${STEP_TIMEOUT:-540}"
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests bench)
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for s in "${steps[@]}"; do
  case "$s" in
    tests)
      timeout "$T" python3 -m pytest -q -m "gpu or multigpu" tests ${PYTEST_ARGS:-} > "$OUT/tests.log" 2>&1
      r=$?; rc=$((rc | r)); tail -15 "$OUT/tests.log"; echo "tests rc=$r" ;;
    bench)
      timeout "$T" python3 bench/gemm.py > "$OUT/bench.log" 2>&1; r1=$?
      timeout "$T" python3 bench/comm.py --backend torch >> "$OUT/bench.log" 2>&1; r2=$?
      rc=$((rc | r1 | r2)); grep -E "^\|" "$OUT/bench.log"; echo "bench rc=$r1/$r2"
      cp bench/results/*"${MEGAMOE_COMMIT:-none}"* "$OUT/" 2>/dev/null ;;
    sanitize|sanitize-gemm|sanitize-symm)
      for tool in memcheck racecheck; do
        # (masked 8 tokens, K 2048: the ring's stages reused, bulk-copied weights; profile_splitk.py: the
        # 8- / 16-token split-K paths)
        [ "$s" = sanitize-symm ] || for case in "contiguous 3 100 256 256" "l1 3 100 256 256" "masked 3 8 256 256" \
                                                "masked 3 8 256 2048" "splitk"; do
          if [ "$case" = splitk ]; then cmd=(python3 bench/profile_splitk.py); else cmd=(python3 bench/profile_gemm.py $case); fi
          timeout "$T" compute-sanitizer --tool $tool --error-exitcode 9 "${cmd[@]}" >> "$OUT/sanitize_$tool.log" 2>&1
          r=$?; rc=$((rc | r)); tail -1 "$OUT/sanitize_$tool.log"; echo "sanitize $tool ($case) rc=$r"
        done
        # symm_comm on every GPU (one rank each): 37 x top-4 = 148 ids the plain pull, 512 the small-T
        # dedup pull, 2400 the dedup pull.
        # API errors are not reported: NCCL init and torch's allocator probe unsupported calls on
        # purpose (36 lines, d8dda90). The ranks are spawned child processes: --target-processes all.
        if [ "$s" != sanitize-gemm ]; then
          timeout "$T" compute-sanitizer --tool $tool --target-processes all --report-api-errors no --error-exitcode 9 \
            python3 bench/profile_comm.py 1 37 128 600 >> "$OUT/sanitize_$tool.log" 2>&1
          r=$?; rc=$((rc | r)); grep -E "SUMMARY|Error|wrong" "$OUT/sanitize_$tool.log" | tail -2
          echo "sanitize $tool (symm_comm) rc=$r"
        fi
      done ;;
    sanitize-fused)
      # The fused layer at 1 rank: T 33 (8- / 16-token tiles, 2 CTAs per SM) and 512 (128-token tiles).
      for tool in memcheck racecheck synccheck; do
        for T_ in 33 512; do
          timeout "$T" compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
            python3 bench/profile_layer.py 16 512 256 4 $T_ fused >> "$OUT/sanitize_fused_$tool.log" 2>&1
          r=$?; rc=$((rc | r)); grep -E "SUMMARY|profile_layer" "$OUT/sanitize_fused_$tool.log" | tail -2
          echo "sanitize $tool (fused, T $T_) rc=$r"
        done
      done ;;
    *) echo "unknown step $s"; rc=2 ;;
  esac
done
tar czf "$OUT/results.tgz" bench/results 2>/dev/null
exit $rc
