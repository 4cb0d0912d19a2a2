#!/usr/bin/env bash
# Shared first step of scripts/test.sh and scripts/demo.sh: install missing Debian packages, then
# configure build/ (Ninja, Release). Idempotent: a build/ made by another generator is recreated.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
if [ -f build/CMakeCache.txt ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' build/CMakeCache.txt; then
  echo "configure: build/ was made by another generator; recreating it"
  rm -rf build
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
