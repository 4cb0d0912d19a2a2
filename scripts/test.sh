#!/usr/bin/env bash
# README test command: installs what is missing, builds everything in build/ with all cores and runs
# every test (all ctest labels). With BITREFIT_SANITIZE=1 (.ci/run sets it) it then runs
# scripts/sanitize.sh: clang ASan+UBSan and TSan builds of the labels they cover and the fuzz label;
# a sanitizer report or a fuzz crash fails the run. Exits with ctest's status (non-zero too when
# the sanitizer runs fail) and ends with ctest's summary line.
# CTEST_PARALLEL_LEVEL=N in the environment runs N tests at a time (default: one at a time).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh
cmake --build build --parallel "$(nproc)"
set +e
ctest --test-dir build --output-on-failure 2>&1 | tee build/ctest.log
status=${PIPESTATUS[0]}
if [ "${BITREFIT_SANITIZE:-0}" = 1 ]; then
  bash scripts/sanitize.sh || status=1
fi
set -e
echo "== $(grep -E 'tests passed|No tests were found' build/ctest.log | tail -n 1)"
exit "$status"
