#!/usr/bin/env bash
# bench/gpu-check.sh — the one prepared GPU check of bitrefit's Thrust backend (issues 6 and 18).
#
#   bench/gpu-check.sh              # build and run on a GPU machine that has nvcc and the packages
#   bench/gpu-check.sh --pack DIR   # build here (nvcc, no GPU needed) into DIR, to carry elsewhere
#   DIR/gpu-check.sh --run DIR      # run a packed DIR on a GPU machine: no packages, no build
#
# Why two phases: a lent GPU machine may have no package registry (so scripts/install-deps.sh
# cannot run there) and its minutes are scarce, while any machine with the CUDA Toolkit can build
# for sm_90 without a GPU. --pack builds the two CUDA binaries, copies them with the shared
# libraries they need beyond glibc/libstdc++ (libzstd, libgomp) and this script into DIR; --run
# uses only DIR, nvidia-smi and (if present) compute-sanitizer.
#
# The check, on a machine with an NVIDIA GPU (written for one H200, sm_90):
#   1. fails loudly (exit 1) unless nvidia-smi lists a GPU (and, when building, nvcc exists);
#   2. (not with --run) configures with -DBITREFIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 and
#      builds only the two CUDA translation units: test_thrust_cuda and bitrefit-bench-thrust;
#   3. runs test_thrust_cuda, the Thrust backend's tests on the device (collect/apply/hash vs the
#      host backend for every dtype and change pattern, XXH3 lane by lane vs libxxhash, class ranks
#      of base-conditioned coding vs the host for every float format, whole frames byte-identical
#      under every mode policy including frame format 2's base-conditioned items (prepared on the
#      device: positions stay there), verified apply, attestation digest equal), and insists it
#      really ran: a skip (exit 77, no device visible to the CUDA runtime) is a failure; then the
#      same binary under compute-sanitizer memcheck when the tool is there;
#   4. runs bitrefit-bench-thrust on a 4 GiB BF16 model (64 MiB tensors, 3% of elements changed)
#      with the host backend (one thread) beside thrust-cuda in one process, printing GB/s of model
#      bytes for detection, detection+preparation, apply (scatter, and whole verified frames) and
#      attestation, and checking frames byte-identical, apply bit-exact, attestation digests equal;
#      then a 1 GiB AdamW delta on thrust-cuda, which must produce base-conditioned items.
# Budget on one H200: --run about 2 minutes (tests 1 s, memcheck 10 s, benches ~90 s); building
# there adds 2-3 minutes with 16 cores (--pack here: ~4 minutes on 2 cores).
# Environment knobs: BUILD_DIR (default build-gpu), JOBS, SIZE_MIB, CHANGE, REPEAT.
# First run: 2026-12-04 on one H200 (driver 580.159.04), binaries packed on the CPU machine with
# nvcc 13.0; results in bench/thrust/README.md.
set -euo pipefail
die() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}
step() { echo "== gpu-check: $* ($(date -u +%H:%M:%S))"; }
t_start=$(date +%s)

mode=all dir=
case "${1:-}" in
  --pack | --run)
    mode=${1#--}
    dir=${2:-}
    [ -n "$dir" ] || die "$1 needs a directory"
    ;;
  "") ;;
  *) die "unknown argument '$1' (usage: gpu-check.sh [--pack DIR | --run DIR])" ;;
esac

SIZE_MIB=${SIZE_MIB:-4096}
CHANGE=${CHANGE:-0.03}
REPEAT=${REPEAT:-2}

check_gpu() {
  step "checking for a GPU"
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver, so no GPU to check"
  nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "nvidia-smi lists no GPU"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
}

# Builds test_thrust_cuda and bitrefit-bench-thrust into $BUILD; sets test_bin and bench_bin.
build() {
  cd "$(dirname "$0")/.."
  BUILD=${BUILD_DIR:-build-gpu}
  NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  [ -x "$NVCC" ] || die "nvcc not found (PATH, CUDACXX, /usr/local/cuda/bin)"
  "$NVCC" --version | tail -n 2
  step "dependencies"
  if [ -x scripts/install-deps.sh ]; then
    scripts/install-deps.sh || die "scripts/install-deps.sh failed (offline machine without the packages? use --pack elsewhere, then --run)"
  fi
  step "configure + build (sm_90, BITREFIT_CUDA=ON)"
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
    -DBITREFIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBITREFIT_BUILD_BENCH=ON \
    -DBITREFIT_BUILD_EXAMPLES=OFF -DBITREFIT_BUILD_PROOFS=OFF >"$BUILD/gpu-check-configure.log" 2>&1 ||
    { tail -n 30 "$BUILD/gpu-check-configure.log"; die "cmake configure failed"; }
  cmake --build "$BUILD" --target test_thrust_cuda bitrefit-bench-thrust -j "${JOBS:-$(nproc)}" ||
    die "CUDA build failed"
  test_bin=$PWD/$BUILD/tests/thrust/test_thrust_cuda
  bench_bin=$PWD/$BUILD/bench/thrust/bitrefit-bench-thrust
  logs=$PWD/$BUILD
}

run_checks() {
  step "gpu tests (test_thrust_cuda)"
  local rc=0
  "$test_bin" 2>&1 | tee "$logs/gpu-tests.log" || rc=$?
  [ "$rc" -ne 77 ] || die "test_thrust_cuda skipped: no CUDA device visible to the runtime"
  [ "$rc" -eq 0 ] || die "test_thrust_cuda failed (exit $rc)"
  local cs
  cs=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] && echo /usr/local/cuda/bin/compute-sanitizer; } || true)
  if [ -n "$cs" ]; then
    step "gpu tests under compute-sanitizer memcheck"
    rc=0
    "$cs" --tool memcheck --leak-check full --error-exitcode 9 "$test_bin" --gtest_brief=1 >"$logs/gpu-memcheck.log" 2>&1 || rc=$?
    tail -n 4 "$logs/gpu-memcheck.log"
    [ "$rc" -eq 0 ] || die "compute-sanitizer memcheck: exit $rc (see $logs/gpu-memcheck.log)"
  else
    echo "compute-sanitizer not found: memcheck skipped"
  fi

  step "bench: ${SIZE_MIB} MiB BF16, change ${CHANGE}, host beside thrust-cuda"
  OMP_WAIT_POLICY=PASSIVE "$bench_bin" --backend host,thrust-cuda \
    --size-mib "$SIZE_MIB" --change "$CHANGE" --repeat "$REPEAT" | tee "$logs/gpu-bench.txt" ||
    die "bench failed (frames differ, apply not bit-exact or attestation digests differ)"
  "$bench_bin" --backend thrust-cuda --size-mib 1024 --change adamw --json \
    >"$logs/gpu-bench-adamw.json" || die "adamw bench failed"
  grep -E '"(detect|detect_prep|apply_scatter|apply_frames|attest)_GBps"|"conditioned_items"' "$logs/gpu-bench-adamw.json" |
    sed 's/^ */  thrust-cuda 1 GiB adamw: /'
  grep -Eq '"conditioned_items": [1-9]' "$logs/gpu-bench-adamw.json" ||
    die "the adamw run produced no base-conditioned items (frame format 2 not exercised on the device)"
  step "done in $(($(date +%s) - t_start)) s; goal on an H200: detection+preparation, apply and attestation >= 1000 GB/s"
}

case $mode in
  all)
    check_gpu
    build
    run_checks
    ;;
  pack)
    build
    mkdir -p "$dir/lib"
    cp "$test_bin" "$bench_bin" "$dir/"
    cp "$(realpath "$0")" "$dir/gpu-check.sh"
    # The shared libraries beyond the C/C++ runtime, which any Linux with a newer glibc has.
    ldd "$test_bin" "$bench_bin" | awk '$3 ~ /^\// {print $3}' | sort -u |
      grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*|libpthread|libdl|librt)\.so' |
      while read -r lib; do cp -L "$lib" "$dir/lib/"; done
    step "packed into $dir: $(cd "$dir" && ls | tr '\n' ' ')(lib: $(ls "$dir/lib" | tr '\n' ' '))"
    echo "on the GPU machine: bash $dir/gpu-check.sh --run $dir"
    ;;
  run)
    dir=$(realpath "$dir")
    if [ ! -x "$dir/test_thrust_cuda" ] || [ ! -x "$dir/bitrefit-bench-thrust" ]; then
      die "$dir holds no packed binaries (gpu-check.sh --pack $dir)"
    fi
    export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    test_bin=$dir/test_thrust_cuda bench_bin=$dir/bitrefit-bench-thrust
    logs=${OUT:-$dir}
    check_gpu
    run_checks
    ;;
esac
