#!/usr/bin/env bash
# bench/gpu-check.sh — the one prepared GPU check of bitrefit's Thrust backend (issue 6).
#
#   bench/gpu-check.sh            # from anywhere; builds into build-gpu/ at the repository root
#
# On a machine with an NVIDIA GPU (written for one H200, sm_90) and the CUDA Toolkit (nvcc), it:
#   1. fails loudly (exit 1) unless nvidia-smi lists a GPU, nvcc exists and the CUDA runtime sees
#      a device;
#   2. configures with -DBITREFIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 and builds only the two
#      CUDA translation units: test_thrust_cuda and bitrefit-bench-thrust;
#   3. runs the ctest label `gpu` (the Thrust backend's tests on the device: collect/apply/hash vs
#      the host backend for every dtype and change pattern, class ranks of base-conditioned coding
#      vs the host for every float format, whole frames byte-identical under every mode policy
#      including frame format 2's base-conditioned items (prepared on the device: positions stay
#      there), verified apply, attestation digest equal) and insists test_thrust_cuda really ran
#      (a skip = failure);
#   4. runs bitrefit-bench-thrust on a 4 GiB BF16 model (64 MiB tensors, 3% of elements changed)
#      with the host backend (one thread) beside thrust-cuda in one process, printing GB/s of model
#      bytes for detection, detection+preparation, apply (scatter, and whole verified frames) and
#      attestation, and checking frames byte-identical, apply bit-exact, attestation digests equal.
# Budget: < 8 minutes on one H200 (build ~2-3 min with 16 cores, tests < 1 min, bench ~2 min).
# Dependencies: scripts/install-deps.sh's packages must be installed (the script runs it; on an
# offline machine they must be there already). Environment knobs: BUILD_DIR, JOBS, SIZE_MIB,
# CHANGE, REPEAT.
# Not run yet: the session that wrote it had no GPU (see the report of branch `thrust`).
set -euo pipefail
cd "$(dirname "$0")/.."
die() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}
step() { echo "== gpu-check: $* ($(date -u +%H:%M:%S))"; }
t_start=$(date +%s)

BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
SIZE_MIB=${SIZE_MIB:-4096}
CHANGE=${CHANGE:-0.03}
REPEAT=${REPEAT:-2}

step "checking for a GPU"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver, so no GPU to check"
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || die "nvidia-smi lists no GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || die "nvcc not found (PATH, CUDACXX, /usr/local/cuda/bin)"
"$NVCC" --version | tail -n 2

step "dependencies"
if [ -x scripts/install-deps.sh ]; then
  scripts/install-deps.sh || die "scripts/install-deps.sh failed (offline machine without the packages?)"
fi

step "configure + build (sm_90, BITREFIT_CUDA=ON)"
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S . -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DBITREFIT_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBITREFIT_BUILD_BENCH=ON \
  -DBITREFIT_BUILD_EXAMPLES=OFF -DBITREFIT_BUILD_PROOFS=OFF >"$BUILD.configure.log" 2>&1 ||
  { tail -n 30 "$BUILD.configure.log"; die "cmake configure failed"; }
cmake --build "$BUILD" --target test_thrust_cuda bitrefit-bench-thrust -j "$JOBS" ||
  die "CUDA build failed"

step "gpu tests (ctest -L gpu)"
ctest --test-dir "$BUILD" -L gpu --output-on-failure --timeout 600 | tee "$BUILD/gpu-tests.log" ||
  die "ctest -L gpu failed"
# A skipped test exits 77 and ctest counts it as not failed: insist the device tests really ran.
grep -Eq 'test_thrust_cuda .*Passed' "$BUILD/gpu-tests.log" ||
  die "test_thrust_cuda did not pass on the device (skipped = no CUDA device visible to the runtime)"

step "bench: ${SIZE_MIB} MiB BF16, change ${CHANGE}, host beside thrust-cuda"
OMP_WAIT_POLICY=PASSIVE "$BUILD/bench/thrust/bitrefit-bench-thrust" --backend host,thrust-cuda \
  --size-mib "$SIZE_MIB" --change "$CHANGE" --repeat "$REPEAT" | tee "$BUILD/gpu-bench.txt" ||
  die "bench failed (frames differ, apply not bit-exact or attestation digests differ)"
"$BUILD/bench/thrust/bitrefit-bench-thrust" --backend thrust-cuda --size-mib 1024 --change adamw --json \
  >"$BUILD/gpu-bench-adamw.json" || die "adamw bench failed"
grep -E '"(detect|detect_prep|apply_scatter|apply_frames|attest)_GBps"|"conditioned_items"' "$BUILD/gpu-bench-adamw.json" |
  sed 's/^ */  thrust-cuda 1 GiB adamw: /'
grep -Eq '"conditioned_items": [1-9]' "$BUILD/gpu-bench-adamw.json" ||
  die "the adamw run produced no base-conditioned items (frame format 2 not exercised on the device)"

step "done in $(($(date +%s) - t_start)) s; goal on an H200: detection+preparation, apply and attestation >= 1000 GB/s"
