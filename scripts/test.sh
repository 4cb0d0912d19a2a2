#!/usr/bin/env bash
# README test command: installs what is missing, builds everything in build/ with all cores and runs
# every test (all ctest labels). With BITREFIT_SANITIZE=1 (.ci/run sets it) it then runs
# scripts/sanitize.sh: clang ASan+UBSan and TSan builds of the labels they cover and the fuzz label;
# a sanitizer report or a fuzz crash fails the run. The sanitizer trees build in the background at
# nice 19 while the main build and ctest run (many tests leave a core idle, and so does the end of
# the main build; the niced build yields the cores whenever they are wanted); their tests run
# after. Exits with ctest's status (non-zero too when the sanitizer runs fail) and ends with
# ctest's summary line.
# CTEST_PARALLEL_LEVEL=N in the environment runs N tests at a time (default: one at a time).
# On 2 cores the CI run is CPU-bound from start to end (its wall time is about its total CPU / 2),
# so cutting its time means cutting CPU. Ninja's logs show wall time per file, which the niced
# background build distorts (one translation unit "took" 1 159 s for 26 s of CPU): measure CPU with
# -DCMAKE_CXX_COMPILER_LAUNCHER=<a script running /usr/bin/time -a -o LOG -f '%U %S %e' "$@">.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh
sanitize_build=
if [ "${BITREFIT_SANITIZE:-0}" = 1 ]; then
  # own session (setsid): an interrupted run stops the whole build, compilers included. With the
  # kernel's autogroup scheduling (sched_autogroup_enabled) a new session is a new group that gets
  # an equal share whatever its nice: the group itself is niced too, else the build halves the
  # cores of tests that use both (measured: packaging_headers 172 s -> 281 s). The group is niced
  # from inside the new session (/proc/self after setsid): written from here through $!, it can
  # race the child's setsid and nice this script's own group instead.
  setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 bash scripts/sanitize.sh --build-only' \
    >build/sanitize-build.log 2>&1 &
  sanitize_build=$!
  trap 'kill -- "-$sanitize_build" 2>/dev/null' EXIT
fi
# Started before the main build, the niced build also fills the cores the main build leaves idle
# (its last long compile runs alone).
cmake --build build --parallel "$(nproc)"
set +e
ctest --test-dir build --output-on-failure 2>&1 | tee build/ctest.log
status=${PIPESTATUS[0]}
if [ -n "$sanitize_build" ]; then
  echo "== waiting for the sanitizer builds (log: build/sanitize-build.log)"
  if wait "$sanitize_build"; then
    grep '^== ' build/sanitize-build.log
    bash scripts/sanitize.sh --test-only || status=1
  else
    cat build/sanitize-build.log
    echo "== sanitizer builds FAILED"
    status=1
  fi
  trap - EXIT
fi
set -e
echo "== $(grep -E 'tests passed|No tests were found' build/ctest.log | tail -n 1)"
exit "$status"
