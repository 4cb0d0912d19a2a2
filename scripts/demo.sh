#!/usr/bin/env bash
# README demo command: installs what is missing, builds and runs bitrefit's main job — the
# end-to-end refit demo (bitrefit-demo: one AdamW trainer process, rollout processes that are
# killed and restarted mid-refit, every commit checked bit-exact) on its embedded defaults.
# Extra arguments are passed to the demo (see `bitrefit-demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/configure.sh
cmake --build build --parallel "$(nproc)" --target bitrefit-demo
echo "demo: running build/examples/demo/bitrefit-demo $*"
exec build/examples/demo/bitrefit-demo "$@"
