#!/usr/bin/env bash
# One device call of this session (steps given as arguments, each with its own time limit).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_env.sh
T0=$(date +%s)
stamp() { echo "== $1 at $(( $(date +%s) - T0 )) s"; }
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader
for s in "$@"; do
  case "$s" in
    fused-tests) stamp "$s"
      timeout 330 python3 -u -m pytest -q --timeout 150 tests/megamoe/test_fused_gpu.py 2>&1 | tee "$OUT/fused_tests_$(basename "$(dirname "$MEGAMOE_LIB_DIR")").log" | tail -15 ;;
    fused-ranks) stamp "$s"
      timeout 200 python3 -m pytest -q --timeout 190 tests/megamoe/test_fused_ranks_gpu.py 2>&1 | tail -15 | tee "$OUT/fused_ranks.log" ;;
    gemm-tests) stamp "$s"
      timeout 150 python3 -m pytest -q --timeout 120 -m gpu -rfE --tb=short tests/fp4_gemm > "$OUT/gemm_tests.log" 2>&1
      grep -E "passed|failed|^FAILED|^E " "$OUT/gemm_tests.log" | tail -12 ;;
    layer-tests) stamp "$s"
      timeout 200 python3 -m pytest -q --timeout 150 -m gpu tests/megamoe --ignore tests/megamoe/test_fused_gpu.py \
        --ignore tests/megamoe/test_fused_ranks_gpu.py --deselect tests/megamoe/test_reference.py -rfE --tb=short \
        > "$OUT/layer_tests.log" 2>&1; grep -E "passed|failed|^FAILED|^E " "$OUT/layer_tests.log" | tail -12 ;;
    probe) stamp "$s"
      timeout 90 python3 experiments/overflow_probe.py 2>&1 | tail -60 | tee "$OUT/probe.log" ;;
    phases) stamp "$s"
      tag=$(basename "$(dirname "$MEGAMOE_LIB_DIR")")  # which build (lib=... steps)
      (cd bench && timeout 240 python3 -u fused_phases.py ${PHASE_ARGS:-} 2>&1 | grep --line-buffered -v "^\[megamoe" | tee "$OUT/phases_$tag.log" | tail -40)
      for f in bench/results/fused-phases-*-"${MEGAMOE_COMMIT:-x}".*; do [ -f "$f" ] && cp "$f" "$OUT/${tag}_$(basename "$f")"; done ;;
    phases-nosplit) stamp "$s"  # the same without a split-K workspace (the fused and staged layers)
      (cd bench && timeout 240 python3 fused_phases.py ${PHASE_ARGS:-} --no-splitk 2>&1 | grep -v "^\[megamoe" | tail -40 | tee "$OUT/phases_nosplit.log") ;;
    sanitize-fused) stamp "$s"
      STEP_TIMEOUT=100 bash scripts/gpu_check.sh sanitize-fused 2>&1 | grep -v "^NVIDIA" | tail -12 ;;
    sanitize-gemm) stamp "$s"
      STEP_TIMEOUT=60 bash scripts/gpu_check.sh sanitize-gemm 2>&1 | tail -8 ;;
    sync-detail) stamp "$s"  # the first synccheck reports of the fused layer (T 33)
      timeout 100 compute-sanitizer --tool synccheck --report-api-errors no --print-limit 6 \
        python3 bench/profile_layer.py 16 512 256 4 33 fused 2>&1 | cut -c1-220 | head -60 ;;
    race-gemm) stamp "$s"  # standalone fp4_gemm: racecheck and synccheck, the L1 case
      for tool in racecheck synccheck; do timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 4 \
        python3 bench/profile_gemm.py l1 3 100 256 256 2>&1 | cut -c1-200 | grep -E "Error|SUMMARY|error" | head -8; done ;;
    ncu) stamp "$s"; bash experiments/ncu_compare.sh ${NCU_T:-128} ;;
    overflow-test) stamp "$s"
      timeout 60 python3 -m pytest -q --timeout 50 tests/megamoe/test_fused_gpu.py -k overflow 2>&1 | tail -4 ;;
    symm-tests) stamp "$s"
      timeout 150 python3 -m pytest -q --timeout 140 -m gpu tests/symm_comm 2>&1 | tail -6 | tee "$OUT/symm_tests.log" ;;
    sanitize-splitk) stamp "$s"
      for tool in memcheck racecheck synccheck; do timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 4 \
        python3 bench/profile_splitk.py 2>&1 | cut -c1-200 | grep -E "Error|SUMMARY|error|split-K|^ok" | head -8; done ;;
    race-kSmem) stamp "$s"  # racecheck: the 8-token ring reused (K 2048) and the split-K paths
      timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/profile_gemm.py masked 3 8 256 2048 2>&1 | tail -1
      timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/profile_splitk.py 2>&1 | tail -2 ;;
    ab) stamp "$s"  # issue 23: gemm + comm, BEFORE (default build-cb33: src + lib carried) vs build/lib (ROUNDS, default 1)
      bash experiments/ab_before_after.sh "${BEFORE:-build-cb33}" 2>&1 | tail -60 ;;
    symm-ab) stamp "$s"  # issue 23: symm_comm GPU tests + memcheck (build/lib) and bench/comm.py after / before
      bash experiments/symm_ab_run.sh build/lib build-before/lib 2>&1 | tail -30 ;;
    l2bars) stamp "$s"  # branch exp-l2bars' libraries (build-exp-l2bars/lib, carried): fused tests + racecheck
      export_lib="MEGAMOE_LIB_DIR=$PWD/build-exp-l2bars/lib"
      env $export_lib timeout 120 python3 -m pytest -q --timeout 110 tests/megamoe/test_fused_gpu.py 2>&1 | tail -2
      for T_ in 33 512; do env $export_lib timeout 100 compute-sanitizer --tool racecheck --report-api-errors no \
        --error-exitcode 9 python3 bench/profile_layer.py 16 512 256 4 $T_ fused 2>&1 | grep -E "SUMMARY|profile_layer" | tail -2; done ;;
    splitk) stamp "$s"
      (cd bench && timeout 200 python3 splitk.py 2>&1 | grep -E "^\||^\[splitk" | tail -24); cp bench/results/splitk-* "$OUT/" ;;
    moe-bench) stamp "$s"
      BACKENDS=${MB_BACKENDS:-staged,fused} BENCH_TIMEOUT=${MB_TIMEOUT:-170} bash scripts/bench_moe.sh 2>&1 | grep -E "^\| (flash|pro)|rc=|peaks" | head -40 ;;
    stamps) stamp "$s"  # where one dispatch / combine's time goes (1 rank; STAMP_T tokens, default 1 128)
      timeout 120 python3 experiments/comm_stamps.py ${STAMP_T:-1 128} 2>&1 | tail -40 | tee "$OUT/stamps.log" ;;
    gemm1tok) stamp "$s"  # issue 22: a 1-token expert GEMM warm / cold / empty / one K block / one expert
      timeout 150 python3 experiments/gemm_1tok_probe.py 2>&1 | tail -8 | tee "$OUT/gemm1tok.log" ;;
    cta-times) stamp "$s"  # per-CTA L1 / L2 production times against the schedule (flash, CTA_T tokens)
      timeout 150 python3 experiments/fused_cta_times.py flash ${CTA_T:-16 128 512} 2>&1 | tail -40 | tee "$OUT/cta_times_$(basename "$(dirname "$MEGAMOE_LIB_DIR")").log" ;;
    gemm-var) stamp "$s"  # probe_gemm.py cases GV_CASES once per library folder in GV_LIBS (in turn, GV_ROUNDS rounds)
      for r in $(seq "${GV_ROUNDS:-1}"); do bash experiments/gemm_variants.sh "$GV_CASES" $GV_LIBS 2>&1 | tee -a "$OUT/gemm_var.log"; done ;;
    grid-probe) stamp "$s"  # the staged layer's dispatch / combine at smaller grids (GRID_T tokens, GRID_N grids)
      timeout 200 python3 experiments/comm_grid_probe.py flash,pro ${GRID_T:-1,16} ${GRID_N:-0,64,32,16,8,4} 2>&1 | grep -v "^\[megamoe" | tail -40 | tee "$OUT/grid_probe.log" ;;
    timeline) stamp "$s"  # the kernels of one CUDA-graph replay (TL_T tokens, TL_B backends)
      timeout 200 python3 experiments/graph_timeline.py flash,pro ${TL_T:-1,16} ${TL_B:-staged,fused} 2>&1 | grep -v "^\[megamoe" | tee "$OUT/timeline_$(basename "$(dirname "$MEGAMOE_LIB_DIR")").log" | tail -60 ;;
    cold-probe) stamp "$s"  # dispatch / combine with code and state warm vs evicted from L2 (1 rank)
      timeout 120 python3 experiments/comm_cold_probe.py ${COLD_T:-1,16} 2>&1 | grep -v "^\[megamoe\|Warn\|warn" | tail -20 | tee "$OUT/cold_probe.log" ;;
    py=*) stamp "$s"  # the later steps import megamoe's Python from this folder (a carried tree's python/)
      export PYTHONPATH="$PWD/${s#py=}:$PYTHONPATH" ;;
    lib=*) stamp "$s"  # the later steps use these libraries (a carried build folder's lib/)
      export MEGAMOE_LIB_DIR="$PWD/${s#lib=}" ;;
    fused-seed) stamp "$s"  # replay one seed of the fused tests (FUSED_SEED, FUSED_K: pytest -k)
      MEGAMOE_TEST_SEED=$FUSED_SEED timeout 100 python3 -m pytest -q --timeout 90 tests/megamoe/test_fused_gpu.py \
        -k "$FUSED_K" 2>&1 | tail -4 ;;
    race-fused) stamp "$s"  # SAN_TOOLS (racecheck) of the fused layer at SAN_T (33 512; 9: two CTAs per SM), first reports' locations
      for T_ in ${SAN_T:-33 512}; do for tool in ${SAN_TOOLS:-racecheck}; do timeout 100 compute-sanitizer --tool $tool \
        --report-api-errors no --print-limit 2 --error-exitcode 9 python3 bench/profile_layer.py 16 512 256 4 $T_ fused \
        > /tmp/san.log 2>&1; echo "T $T_ $tool rc=$?"; grep -E "SUMMARY|profile_layer" /tmp/san.log | tail -2
        head -c 200000 /tmp/san.log > "$OUT/san_$(basename "$(dirname "${MEGAMOE_LIB_DIR:-build/lib}")")_T${T_}_$tool.log"
        grep -E "^=========  ?(Barrier|Error|    at |    and )" /tmp/san.log | head -8 | cut -c1-400; done; done ;;
    tile-ab) stamp "$s"  # the layer (TAB_B: staged) at the tiles a GEMM change touches: TAB_LIBS (build folders) in turn
      for L in ${TAB_LIBS:-build-base build}; do MEGAMOE_LIB_DIR=$PWD/$L/lib timeout 150 python3 experiments/tile_sweep.py \
        ${TAB_PRESETS:-flash,pro} ${TAB_T:-512,2048} ${TAB_BN:-16,32} ${TAB_B:-staged} 2>&1 | grep -v "^\[megamoe" | tee -a "$OUT/tile_ab.log"; done ;;
    tile-sweep) stamp "$s"  # every token tile at each token count (TS_T), staged GEMMs alone and whole calls
      timeout 300 python3 experiments/tile_sweep.py ${TS_PRESETS:-flash,pro} ${TS_T:-128,512,2048,8192} 8,16,32,64,128 \
        ${TS_B:-staged} 2>&1 | grep -v "^\[megamoe" | tee "$OUT/tile_sweep.log" ;;
    gemv) stamp "$s"  # experiments/gemv: the mma.sync few-token GEMM, four builds (build-gemv carried: experiments/gemv/build.sh)
      for L in libgemv.so libgemv_s6c3.so libgemv_pair.so libgemv_half.so; do timeout 150 python3 experiments/gemv/run_gemv.py build-gemv/$L 2>&1 |
        tee -a "$OUT/gemv.log" | tail -21; done ;;
    *) echo "unknown step $s" ;;
  esac
done
rm -f "$OUT/results.tgz"
# The archive is written outside $OUT: tar over the folder it writes into exits 1 ("file changed as we
# read it"), which skipped the delete and let the copy-back's file limit drop logs.
tar czf /tmp/all.tgz -C "$OUT" --exclude all.tgz . && find "$OUT" -type f -delete && mv /tmp/all.tgz "$OUT/"
stamp done
