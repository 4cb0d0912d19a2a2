#!/usr/bin/env bash
# Encode time of the working tree against a baseline commit in one process (main.cpp says why).
#   bash bench/codec/paired/paired-encode.sh BASE_REV [CHANGE ...]     (default: 0.01 0.03 0.05 adamw)
# Builds the baseline's headers from a temporary git worktree and the working tree's headers into
# one binary (g++ -O3, as the Release bench), runs it once per change set, prints one JSON line each.
# MODE=apply times the receiver (each side applies its own frames to a copy of the base) instead.
# BASE_REV "." builds the working tree as both sides: an A/A control, whose median and quartiles
# show how far the machine alone moves the ratio (run it beside each A/B: on the shared VMs the
# A/A median has ranged 0.96-1.04).
set -euo pipefail
root=$(cd "$(dirname "$0")/../../.." && pwd)
base=${1:?usage: paired-encode.sh BASE_REV [CHANGE ...]}
shift
changes=("$@")
[ ${#changes[@]} -gt 0 ] || changes=(0.01 0.03 0.05 adamw)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
if [ "$base" = "." ]; then
  base_include=$root/include
else
  git -C "$root" worktree add --detach "$work/base" "$base" >/dev/null 2>&1 || { echo "paired-encode: cannot check out $base" >&2; exit 2; }
  base_include=$work/base/include
fi
cxx=(g++ -O3 -DNDEBUG -std=gnu++20 -Wall -Wextra)
src=$root/bench/codec/paired
"${cxx[@]}" -c "$src/side.cpp" -I"$base_include" -Dbitrefit=bitrefit_base -DPAIRED_SIDE=base_side -o "$work/base.o"
"${cxx[@]}" -c "$src/side.cpp" -I"$root/include" -DPAIRED_SIDE=work_side -o "$work/work.o"
"${cxx[@]}" "$src/main.cpp" "$work/base.o" "$work/work.o" -lzstd -o "$work/paired"
for c in "${changes[@]}"; do "$work/paired" "$c" "${REPS:-21}" "${MODE:-encode}"; done
