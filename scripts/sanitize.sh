#!/usr/bin/env bash
# Sanitizer and fuzz runs with clang 14 (scripts/test.sh runs this when BITREFIT_SANITIZE=1; .ci/run
# sets it). Two build trees, each building only what its ctest labels need (target labelled_tests):
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, every report fatal
#                (-fno-sanitize-recover=all), plus the libFuzzer targets of tests/fuzz.
#                Labels: $ASAN_LABELS (unit suites, codec, io, cli, durability/transport, e2e) and
#                fuzz (each target BITREFIT_FUZZ_SECONDS, default 30, plus its regression corpus).
#   build-tsan/  ThreadSanitizer over the threaded code: $TSAN_LABELS (the refit engine's sender
#                thread pool and receivers, the transports).
# Both trees compile at -O0 (the fuzz targets at -O1, tests/fuzz/CMakeLists.txt): these builds are
# CPU-bound in clang's optimiser, and -O0 halves their compile time (test_refit.cpp: 117 s -> 55 s)
# for tests that run about twice as long; ASan misses nothing at -O0 (no check is optimised away).
# A sanitizer report makes its test fail, so it fails this script. Exit status: 0 only when every
# selected test passed in both trees. Prints one summary line per tree ("== asan: ...").
# Usage: bash scripts/sanitize.sh [--build-only|--test-only] [asan|tsan]...   (default: both trees)
#   --build-only  configure and build the trees, run nothing (scripts/test.sh runs this niced in the
#                 background while the main ctest runs, whose tests leave one core idle most of the time)
#   --test-only   run the tests of trees built before (builds what is out of date first)
set -euo pipefail
cd "$(dirname "$0")/.."
ASAN_LABELS=${ASAN_LABELS:-"layout protocol codec io cli transport e2e fuzz"}
TSAN_LABELS=${TSAN_LABELS:-"e2e transport"}
FUZZ_SECONDS=${BITREFIT_FUZZ_SECONDS:-30}
CXX_CLANG=${CXX_CLANG:-clang++-14}
jobs=$(nproc)

# Every report fatal and symbolized; LeakSanitizer on (ASan's default on Linux).
export ASAN_OPTIONS=${ASAN_OPTIONS:-"abort_on_error=1:halt_on_error=1:detect_leaks=1:strict_string_checks=1"}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-"halt_on_error=1:print_stacktrace=1"}
export TSAN_OPTIONS=${TSAN_OPTIONS:-"halt_on_error=1:second_deadlock_stack=1"}
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)}
export TSAN_SYMBOLIZER_PATH=${TSAN_SYMBOLIZER_PATH:-$ASAN_SYMBOLIZER_PATH}

# run_tree NAME SANITIZERS "LABELS" [extra cmake args...]
run_tree() {
  local name=$1 sanitizers=$2 labels=$3
  shift 3
  local dir=build-$name regex
  regex="^($(echo "$labels" | tr ' ' '|'))\$"
  local start=$SECONDS
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_CLANG" -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG="-O0" -DBITREFIT_CUDA=OFF -DBITREFIT_BUILD_PROOFS=OFF \
    -DBITREFIT_SANITIZE="$sanitizers" -DBITREFIT_LABELS_TARGET="$(echo "$labels" | tr ' ' ';')" "$@" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; return 1; }
  # (set -e does not apply inside a function called from `||`: every failure returns explicitly)
  cmake --build "$dir" --target labelled_tests --parallel "$jobs" || { echo "== $name: build FAILED"; return 1; }
  local built=$SECONDS
  if [ "$phase" = build ]; then
    echo "== $name ($sanitizers): built in $((built - start)) s"
    return 0
  fi
  # ThreadSanitizer of clang 14 cannot map its shadow under high-entropy ASLR (vm.mmap_rnd_bits=32,
  # "unexpected memory mapping"): run its tests with ASLR off where the kernel lets us.
  local prefix=()
  if [ "$sanitizers" = thread ] && setarch "$(uname -m)" -R true 2>/dev/null; then prefix=(setarch "$(uname -m)" -R); fi
  set +e
  "${prefix[@]}" ctest --test-dir "$dir" -L "$regex" --output-on-failure --parallel "$jobs" 2>&1 | tee "$dir/ctest.log"
  local status=${PIPESTATUS[0]}
  set -e
  echo "== $name ($sanitizers; labels: $labels): build $((built - start)) s, tests $((SECONDS - built)) s:" \
    "$(grep -E 'tests passed|No tests were found' "$dir/ctest.log" | tail -n 1)"
  return "$status"
}

phase=all
case ${1:-} in
  --build-only) phase=build; shift ;;
  --test-only) phase=test; shift ;;
esac
trees=("$@")
((${#trees[@]})) || trees=(asan tsan)
status=0
for t in "${trees[@]}"; do
  case $t in
    asan) run_tree asan address,undefined "$ASAN_LABELS" -DBITREFIT_BUILD_FUZZERS=ON -DBITREFIT_FUZZ_SECONDS="$FUZZ_SECONDS" || status=1 ;;
    tsan) run_tree tsan thread "$TSAN_LABELS" || status=1 ;;
    *) echo "sanitize.sh: unknown tree '$t' (asan|tsan)" >&2; exit 2 ;;
  esac
done
exit "$status"
