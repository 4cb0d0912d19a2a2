#!/usr/bin/env bash
# The main job over the distributed stores: starts an S3 server (moto) and etcd on free loopback
# ports with temporary data directories, runs bitrefit-demo with --transport s3 --commit-log etcd on
# them (frames, control messages and the owners' baselines in the bucket, the commit log on etcd),
# and stops both servers when it ends. Extra arguments go to the demo (see `bitrefit-demo --help`),
# e.g. `bash scripts/demo-dist.sh --refits 5 --params 20M`.
# BITREFIT_DEMO_BIN=path skips the build and runs that binary (the ctest demo_dist does).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${BITREFIT_DEMO_BIN:-}" ]]; then
  bash scripts/configure.sh
  cmake --build build --parallel "$(nproc)" --target bitrefit-demo
  BITREFIT_DEMO_BIN=build/examples/demo/bitrefit-demo
fi

python=""
for py in "${BITREFIT_PYTHON:-}" python3 /usr/bin/python3; do
  if [[ -n "$py" ]] && "$py" -c 'import moto.server' 2>/dev/null; then python=$py; break; fi
done
if [[ -z "$python" ]]; then
  echo "demo-dist: moto is not installed (python3 -m pip install 'moto[server]', as scripts/install-deps.sh does)" >&2
  exit 77
fi
etcd_bin=$(command -v etcd || true)
if [[ -z "$etcd_bin" ]]; then
  echo "demo-dist: etcd is not installed (apt-get install etcd-server, as scripts/install-deps.sh does)" >&2
  exit 77
fi

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
work=$(mktemp -d -t bitrefit-demo-dist.XXXXXX)
s3_port=$(free_port)
etcd_port=$(free_port)
peer_port=$(free_port)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

"$python" -m moto.server -H 127.0.0.1 -p "$s3_port" >"$work/moto.log" 2>&1 &
pids+=($!)
"$etcd_bin" --name demo --data-dir "$work/etcd" --log-level warn \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "demo=http://127.0.0.1:$peer_port" >"$work/etcd.log" 2>&1 &
pids+=($!)

wait_for() {  # url what log
  for _ in $(seq 1 600); do
    if curl -fs -o /dev/null "$1"; then return 0; fi
    sleep 0.1
  done
  echo "demo-dist: $2 did not start; its log:" >&2
  tail -n 20 "$3" >&2
  exit 1
}
wait_for "http://127.0.0.1:$s3_port/moto-api/" "moto (S3)" "$work/moto.log"
wait_for "http://127.0.0.1:$etcd_port/health" "etcd" "$work/etcd.log"

# moto accepts any credentials; the demo signs every request with them (AWS SigV4).
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
bucket=bitrefit-demo
curl -fs -o /dev/null -X PUT "http://127.0.0.1:$s3_port/$bucket"
echo "demo-dist: S3 (moto) at http://127.0.0.1:$s3_port bucket $bucket, etcd at http://127.0.0.1:$etcd_port"
status=0
"$BITREFIT_DEMO_BIN" --transport s3 --s3-endpoint "http://127.0.0.1:$s3_port" --s3-bucket "$bucket" \
  --commit-log etcd --etcd-endpoints "http://127.0.0.1:$etcd_port" --etcd-prefix /bitrefit-demo "$@" || status=$?
exit $status
