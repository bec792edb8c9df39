#!/usr/bin/env bash
# CMAKE_CUDA_COMPILER_LAUNCHER: runs one nvcc command, keeps its stderr (ptxas -v resource report)
# in <logdir>/<object>.log and still shows it. The exit status is nvcc's, so a ptxas
# warning-as-error (spill / local memory) fails the build.
logdir="$1"; shift
mkdir -p "$logdir"
out=compile
prev=""
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out=$(echo "$a" | tr '/' '_'); fi  # full object path: unique per target
  prev="$a"
done
log="$logdir/$out.log"
"$@" 2> >(tee "$log" >&2)
rc=$?
wait
exit $rc
