#!/usr/bin/env bash
# symm_comm on the GPU machine (run from the repo root, over build/lib/libsymm_comm.so built anywhere):
#   installs the nvshmem4py wheel from .whl/ (no deps, no network) into /tmp/site, runs the symm_comm
#   GPU tests (1 rank and all GPUs, torch + nvshmem backends), then bench/comm.py (torch backend, and
#   nvshmem when importable), copying logs + results to $OUT (at most 8 files).
#   scripts/gpu_comm.sh [tests] [bench] [bench_nvshmem]     (default: tests bench; each step < 580 s)
#   env: MEGAMOE_LIB_DIR (default build/lib), PYTEST_ARGS (e.g. "-k torch"), SYMM_BENCH_ARGS,
#        SYMM_TEST_CALLS (consecutive-call count, default 200)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export MEGAMOE_LIB_DIR="${MEGAMOE_LIB_DIR:-$PWD/build/lib}"
SITE=/tmp/site
if ls .whl/nvshmem4py*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/nvshmem4py*.whl 2>&1 | tail -3
fi
export PYTHONPATH="$SITE:$PWD/packages/symm_comm/python:$PWD/packages/fp4_gemm/python:$PWD/packages/megamoe/python:${PYTHONPATH:-}"
LOG="$OUT/symm_comm.log"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -12
  python3 -c "import torch; print('torch', torch.__version__, 'gpus', torch.cuda.device_count())"
  python3 -c "import nvshmem.core as n; print('nvshmem4py ok', n.__file__)" 2>&1 | tail -1
  ls -la "$MEGAMOE_LIB_DIR/libsymm_comm.so"
} > "$LOG" 2>&1
rc=0
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(tests bench)
for st in "${steps[@]}"; do
  case "$st" in
    tests)
      timeout 570 python3 -m pytest -q -rA tests/symm_comm ${PYTEST_ARGS:-} > "$OUT/symm_tests.log" 2>&1
      trc=$?; rc=$((rc | trc)); echo "tests rc=$trc" >> "$LOG"
      tail -40 "$OUT/symm_tests.log" ;;
    bench)
      timeout 570 python3 bench/comm.py --backend torch ${SYMM_BENCH_ARGS:-} > "$OUT/bench_comm_torch.log" 2>&1
      brc=$?; rc=$((rc | brc)); echo "bench torch rc=$brc" >> "$LOG"
      tail -30 "$OUT/bench_comm_torch.log" ;;
    bench_nvshmem)
      timeout 570 python3 bench/comm.py --backend nvshmem ${SYMM_BENCH_ARGS:-} > "$OUT/bench_comm_nvshmem.log" 2>&1
      brc=$?; rc=$((rc | brc)); echo "bench nvshmem rc=$brc" >> "$LOG"
      tail -20 "$OUT/bench_comm_nvshmem.log" ;;
    *) echo "unknown step $st"; rc=2 ;;
  esac
done
# newest comm results (json + md) for each backend: at most 4 files
for b in torch nvshmem; do
  for ext in md json; do
    f=$(ls -t bench/results/comm-$b-*.$ext 2>/dev/null | head -1)
    [ -n "$f" ] && cp "$f" "$OUT/"
  done
done
cat "$LOG"
exit $rc
