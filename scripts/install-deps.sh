#!/usr/bin/env bash
# Installs every Debian package bitrefit's build, tests, proofs and demo need. Idempotent:
# packages already present are not touched, and apt-get update runs only when something is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git python3
  libzstd-dev zstd libxxhash-dev nlohmann-json3-dev librange-v3-dev libboost-dev libssl-dev
  libgtest-dev libgmock-dev librapidcheck-dev
  libcurl4-openssl-dev libpugixml-dev etcd-server spin iproute2
  libmimalloc-dev  # the model checker's allocator (proofs/)
  clang-14 libclang-rt-14-dev llvm-14  # sanitizer + libFuzzer builds (scripts/sanitize.sh); llvm-symbolizer
  python3-dev pybind11-dev libdlpack-dev python3-numpy python3-torch python3-matplotlib
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# moto (the S3 server the `dist` tests and scripts/demo-dist.sh run on loopback) is not a Debian
# package: it comes from PyPI, for the first Python on PATH. Already there on the CI image; when it
# is missing and cannot be installed, the dist tests skip with a message saying so.
if ! python3 -c 'import moto.server' 2>/dev/null && ! /usr/bin/python3 -c 'import moto.server' 2>/dev/null; then
  echo "install-deps: installing moto[server] with pip"
  python3 -m pip install --quiet 'moto[server]' 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages 'moto[server]' ||
    echo "install-deps: WARNING: could not install moto; the dist tests will be skipped" >&2
fi
