#!/usr/bin/env bash
# The relay tree across network namespaces (ctest label `net`; see relay_net_node.cpp for what the
# trainer checks). Usage: run_net_test.sh RELAY_NET_NODE [extra trainer options]
#
# Topology (root, as in CI): the trainer in namespace T; the root relay in G, the rollout
# cluster's gateway; six receivers in R0..R5 on a bridge in G. The cross-cluster link T<->G is a
# veth pair rate-limited both ways with `tc qdisc tbf` (RATE, default 200mbit). Every name carries
# this run's pid, so parallel runs do not collide; everything is removed on exit, also on failure,
# and namespaces left by a run that was killed outright are removed by the next run.
# Without root or network namespaces (or with BITREFIT_NET_LOOPBACK=1) the same test runs on
# loopback and says so.
set -euo pipefail
exe=$1
shift
rate=${RATE:-200mbit}
receivers=6
work=$(mktemp -d "${TMPDIR:-/tmp}/bitrefit-net.XXXXXX")
tag="brn$$"
namespaces=()

cleanup() {
  local status=$?
  set +e
  [ -n "${trainer_pid:-}" ] && kill -9 "$trainer_pid" 2>/dev/null && wait "$trainer_pid" 2>/dev/null
  for ns in "${namespaces[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  rm -rf "$work"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# namespaces of earlier runs that died without cleaning up (their pid is gone)
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^brn[0-9]+-' || true); do
  pid=${ns#brn}
  pid=${pid%%-*}
  if ! kill -0 "$pid" 2>/dev/null; then
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  fi
done

mkns() {
  ip netns add "$1"
  namespaces+=("$1")
  ip -n "$1" link set lo up
}

use_netns=1
if [ -n "${BITREFIT_NET_LOOPBACK:-}" ]; then
  why="BITREFIT_NET_LOOPBACK is set"
  use_netns=0
elif [ "$(id -u)" != 0 ]; then
  why="not root"
  use_netns=0
elif ! ip netns add "${tag}-probe" 2>/dev/null; then
  why="network namespaces unavailable"
  use_netns=0
else
  ip netns del "${tag}-probe"
fi

if [ "$use_netns" = 1 ]; then
  T="${tag}-t"
  G="${tag}-g"
  mkns "$T"
  mkns "$G"
  # the cross-cluster link, rate-limited both ways
  ip link add xt netns "$T" type veth peer name xg netns "$G"
  ip -n "$T" addr add 10.200.1.2/24 dev xt
  ip -n "$G" addr add 10.200.1.1/24 dev xg
  ip -n "$T" link set xt up
  ip -n "$G" link set xg up
  ip -n "$T" route add default via 10.200.1.1
  tc -n "$T" qdisc add dev xt root tbf rate "$rate" burst 256kb latency 100ms
  tc -n "$G" qdisc add dev xg root tbf rate "$rate" burst 256kb latency 100ms
  # the rollout cluster's LAN: a bridge in the gateway namespace
  ip -n "$G" link add lan type bridge
  ip -n "$G" addr add 10.200.2.1/24 dev lan
  ip -n "$G" link set lan up
  ip netns exec "$G" sysctl -qw net.ipv4.ip_forward=1
  hosts=()
  for ((i = 0; i < receivers; i++)); do
    R="${tag}-r$i"
    mkns "$R"
    ip link add eth0 netns "$R" type veth peer name "p$i" netns "$G"
    ip -n "$G" link set "p$i" master lan
    ip -n "$G" link set "p$i" up
    ip -n "$R" addr add "10.200.2.$((10 + i))/24" dev eth0
    ip -n "$R" link set eth0 up
    ip -n "$R" route add default via 10.200.2.1
    hosts+=("10.200.2.$((10 + i))")
  done
  echo "net: network namespaces: trainer ($T) -- tbf $rate veth -- root relay ($G) -- bridge -- $receivers receivers (${tag}-r0..r$((receivers - 1)))"
  ip netns exec "$T" "$exe" --role trainer --dir "$work" --receivers "$receivers" \
    --root-host 10.200.1.1 --receiver-root-host 10.200.2.1 \
    --root-prefix "ip netns exec $G" --receiver-prefix "ip netns exec ${tag}-r%d" \
    --receiver-hosts "$(IFS=,; echo "${hosts[*]}")" \
    --flap-cmd "ip -n ${tag}-r%d link set dev eth0 %s" "$@" > "$work/out.json" &
else
  echo "net: $why: running the same test on loopback (no rate limit; a link flap is played by SIGSTOP/SIGCONT of the relay)"
  "$exe" --role trainer --dir "$work" --receivers "$receivers" --loopback "$@" > "$work/out.json" &
fi
trainer_pid=$!
set +e
wait "$trainer_pid"
status=$?
trainer_pid=
set -e
python3 - "$work/out.json" <<'PY' || true
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if j.get("summary"):
        print("net summary: %(refits_committed)s/%(refits)s refits committed, all checks passed: %(all_checks_passed)s, kills %(kills)s, retries %(retries)s, network %(network)s" % j)
        continue
    print("refit %d %-12s attempts %d bit-exact %s members-held %s payload %7d B owner->root %7d B framing %.2f%% tls %.2f%% transfer %.3f s total %.3f s" % (
        j["refit"], j["event"], j["attempts"], j["bit_exact"], j["members_held_at_commit"], j["payload_bytes"], j["owner_link_frame_bytes"],
        100 * j["owner_link_framing_overhead"], 100 * j["owner_link_tls_tcp_overhead"], j["phases_s"]["transfer"], j["total_s"]))
PY
exit $status
