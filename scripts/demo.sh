#!/usr/bin/env bash
# README demo command: installs what is missing, builds and runs bitrefit's main job with its
# defaults. Extra arguments are passed to the demo.
#
# TEMPORARY fallback (remove once examples/demo is merged): run target bitrefit-demo when the build
# has it, else bitrefit-quickstart, else build and run the core and io tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh
targets=$(ninja -C build -t targets all)  # captured first: `| grep -q` could SIGPIPE ninja under pipefail
for target in bitrefit-demo bitrefit-quickstart; do
  if grep -q "^${target}: phony$" <<<"$targets"; then
    cmake --build build --parallel "$(nproc)" --target "$target"
    exe=$(find build -path build/CMakeFiles -prune -o -type f -name "$target" -perm -u+x -print -quit)
    echo "demo: running $exe $*"
    exec "$exe" "$@"
  fi
done
echo "demo: neither bitrefit-demo nor bitrefit-quickstart exists yet; running the core and io tests"
cmake --build build --parallel "$(nproc)" --target test_core test_io
exec ctest --test-dir build -R '^test_(core|io)$' --output-on-failure
