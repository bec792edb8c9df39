# Sourced (from the repo root) by the GPU-machine scripts: one environment for all of them.
# MEGAMOE_LIB_DIR defaults to build/lib (built elsewhere and carried); an nvshmem4py wheel in .whl/
# (carried: the GPU machine has no network) is installed once, without its dependencies, into
# /tmp/site so the NVSHMEM backend runs too; NVLink multicast stays off (shared hosts); $OUT
# (default ./out) receives logs and results.
export MEGAMOE_LIB_DIR="${MEGAMOE_LIB_DIR:-$PWD/build/lib}"
SITE=/tmp/site
if ls .whl/nvshmem4py*.whl >/dev/null 2>&1 && [ ! -d "$SITE/nvshmem" ]; then
  python3 -m pip install -q --no-index --no-deps --target "$SITE" .whl/nvshmem4py*.whl 2>&1 | tail -2
fi
export PYTHONPATH="$SITE:$PWD/packages/fp4_gemm/python:$PWD/packages/symm_comm/python:$PWD/packages/megamoe/python:${PYTHONPATH:-}"
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT="${OUT:-$PWD/out}"; mkdir -p "$OUT"
: # ends on a builtin: bash 5.2 here dropped the rest of a ( source this; ... ) subshell after a final external command
