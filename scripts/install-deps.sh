#!/usr/bin/env bash
# Installs every Debian package bitrefit's build, tests, proofs and demo need. Idempotent:
# packages already present are not touched, and apt-get update runs only when something is missing.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git python3
  libzstd-dev zstd libxxhash-dev nlohmann-json3-dev librange-v3-dev libboost-dev
  libgtest-dev libgmock-dev librapidcheck-dev
  libcurl4-openssl-dev spin iproute2
  python3-matplotlib python3-numpy
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
