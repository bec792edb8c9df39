#!/usr/bin/env bash
# A branch as a self-contained tree for the device machine: build-<name>/ (gitignored) = the branch's files
# (git archive) + its libraries in build-<name>/build-<name>/lib, built here through a worktree ../wt-<name>.
# Carry build-<name> and run the branch's own scripts inside it, e.g.
#   cd build-qm && MEGAMOE_LIB_DIR=$PWD/build-qm/lib OUT=$OUT/qm bash experiments/device_call.sh symm-tests ...
# (its Python, tests and libraries together: a branch that changes an ABI cannot run under main's Python).
# Usage: experiments/prepare_branch.sh BRANCH [NAME]   (NAME defaults to BRANCH)
set -euo pipefail
cd "$(dirname "$0")/.."
br=$1; name=${2:-$1}; wt=../wt-$name
[ -d "$wt" ] || git worktree add -q "$wt" "$br"
git -C "$wt" checkout -q --detach "$br"
cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$wt/build" | grep -E "spilled|error" || true
rm -rf "build-$name"; mkdir -p "build-$name/build-$name"
git archive "$br" | tar -x -C "build-$name"
cp -r "$wt/build/lib" "build-$name/build-$name/lib"
echo "build-$name: $(git rev-parse --short "$br") ($(du -sh "build-$name" | cut -f1))"
