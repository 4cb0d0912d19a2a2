#!/usr/bin/env bash
# The relay tree's measurements (bench/relay/README.md): run as root from the repository root,
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBITREFIT_BUILD_BENCH=ON
#   cmake --build build --target relay_bench && bash bench/relay/measure.sh build/bench/relay/relay_bench
# Every process runs in its own network namespace (source = trainer side, root = the rollout
# cluster's gateway, sinks on a bridge behind it); the cross-cluster veth pair is rate-limited
# with tbf where a rate is given. Writes bench/relay/results.json (one object per experiment)
# and prints a summary. Namespaces carry this run's pid and are removed on exit.
#   1. goodput + bytes per link: 4 sinks below the root (fanout 4), 4 MiB frames streamed over
#      a tbf link of 200 Mbit/s and of 1 Gbit/s (and at 1 Gbit/s with a single sink);
#   2. added latency per tree level: a chain root -> s0 -> s1 -> s2 (fanout 1), 64 MiB frames,
#      unlimited veth;
#   3. root peak RSS at fanout 4 while 1 GiB streams (256 x 4 MiB), retained-frame memory
#      budget 64 MiB (default) and 0, link window 4 MiB.
set -euo pipefail
exe=$(realpath "$1")
out=${2:-bench/relay/results.json}
tag="brb$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/bitrefit-relay-bench.XXXXXX")
namespaces=()
cleanup() {
  set +e
  for ns in "${namespaces[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  [ -n "${KEEP_WORK:-}" ] && echo "kept $work" || rm -rf "$work"
}
trap cleanup EXIT
[ "$(id -u)" = 0 ] || { echo "measure.sh needs root (network namespaces)"; exit 1; }

mkns() { ip netns add "$1"; namespaces+=("$1"); ip -n "$1" link set lo up; }
T="${tag}-t"; G="${tag}-g"
mkns "$T"; mkns "$G"
ip link add xt netns "$T" type veth peer name xg netns "$G"
ip -n "$T" addr add 10.201.1.2/24 dev xt; ip -n "$G" addr add 10.201.1.1/24 dev xg
ip -n "$T" link set xt up; ip -n "$G" link set xg up
ip -n "$T" route add default via 10.201.1.1
ip -n "$G" link add lan type bridge; ip -n "$G" addr add 10.201.2.1/24 dev lan; ip -n "$G" link set lan up
ip netns exec "$G" sysctl -qw net.ipv4.ip_forward=1
for i in 0 1 2 3; do
  S="${tag}-s$i"; mkns "$S"
  ip link add eth0 netns "$S" type veth peer name "p$i" netns "$G"
  ip -n "$G" link set "p$i" master lan; ip -n "$G" link set "p$i" up
  ip -n "$S" addr add "10.201.2.$((10 + i))/24" dev eth0; ip -n "$S" link set eth0 up
  ip -n "$S" route add default via 10.201.2.1
done
"$exe" --role pki --pki "$work/pki" --name root,source,s0,s1,s2,s3

set_rate() {  # $1: rate or "none"
  tc -n "$T" qdisc del dev xt root 2>/dev/null || true
  tc -n "$G" qdisc del dev xg root 2>/dev/null || true
  if [ "$1" != none ]; then
    tc -n "$T" qdisc add dev xt root tbf rate "$1" burst 512kb latency 100ms
    tc -n "$G" qdisc add dev xg root tbf rate "$1" burst 512kb latency 100ms
  fi
}
veth_tx() { ip -n "$T" -s -j link show dev xt | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'; }

# run NAME ROOT_FANOUT SINK_FANOUT NSINKS FRAMES FRAME_KIB GAP_MS RETAIN_MIB [sink options...]
run() {
  local name=$1 rfan=$2 sfan=$3 nsinks=$4 frames=$5 kib=$6 gap=$7 retain=$8
  shift 8
  local d="$work/$name"
  mkdir -p "$d"
  ip netns exec "$G" "$exe" --role root --name root --pki "$work/pki" --listen 0.0.0.0 --fanout "$rfan" --retain-mib "$retain" \
    --port-file "$d/port" --stop-file "$d/stop" --out "$d/root.json" 2> "$d/root.err" &
  local rootpid=$!
  while [ ! -s "$d/port" ]; do sleep 0.05; done
  local port; port=$(cat "$d/port")
  local sinks=()
  for ((i = 0; i < nsinks; i++)); do
    ip netns exec "${tag}-s$i" "$exe" --role sink --name "s$i" --pki "$work/pki" --root "10.201.2.1:$port" --listen "10.201.2.$((10 + i))" \
      --fanout "$sfan" --frames "$frames" --stop-file "$d/stop" --out "$d/s$i.jsonl" "$@" 2> "$d/s$i.err" &
    sinks+=($!)
    while [ ! -s "$d/s$i.jsonl.ready" ]; do sleep 0.05; done  # in order: the chain forms as s0, s1, s2
  done
  local tx0; tx0=$(veth_tx)
  ip netns exec "$T" "$exe" --role source --name source --pki "$work/pki" --root "10.201.1.1:$port" --frames "$frames" \
    --frame-kib "$kib" --gap-ms "$gap" --out "$d/source.json" 2> "$d/source.err"
  for p in "${sinks[@]}"; do wait "$p"; done
  local tx1; tx1=$(veth_tx)
  touch "$d/stop"
  wait "$rootpid"
  echo "$((tx1 - tx0))" > "$d/veth_tx"
}

echo "relay bench: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); work dir $work"
experiments=${EXPERIMENTS:-goodput_200mbit goodput_1gbit goodput_1gbit_1sink latency_chain rss_fanout4_retain64 rss_fanout4_retain0}
for e in $experiments; do
  echo "running $e"
  case $e in
    goodput_200mbit) set_rate 200mbit; run goodput_200mbit 4 4 4 24 4096 0 64 ;;
    goodput_1gbit) set_rate 1gbit; run goodput_1gbit 4 4 4 96 4096 0 64 ;;
    goodput_1gbit_1sink) set_rate 1gbit; run goodput_1gbit_1sink 4 4 1 96 4096 0 64 ;;
    latency_chain) set_rate none; run latency_chain 1 1 3 5 65536 1500 64 --keep ;;
    rss_fanout4_retain64) set_rate none; run rss_fanout4_retain64 4 4 4 256 4096 0 64 ;;
    rss_fanout4_retain0) set_rate none; run rss_fanout4_retain0 4 4 4 256 4096 0 0 ;;
  esac
done

python3 - "$work" "$out" <<'PY'
import json, sys, os, statistics
work, out = sys.argv[1], sys.argv[2]
def jl(p): return [json.loads(l) for l in open(p)]
def j(p): return json.load(open(p))
res = {}
for name, rate in (("goodput_200mbit", 200e6), ("goodput_1gbit", 1e9), ("goodput_1gbit_1sink", 1e9)):
    d = os.path.join(work, name)
    if not os.path.isdir(d): continue
    src, root = j(d + "/source.json"), j(d + "/root.json")
    fb = src["frame_bytes"]
    s0 = jl(d + "/s0.jsonl")
    t = [r["t_ns"] for r in s0]
    goodput = (len(t) - 1) * fb * 8 / ((t[-1] - t[0]) / 1e9)  # steady state: frames 2..N over their span
    owner = [l for l in root["links"] if l["kind"] == "owner"][0]
    payload = src["frames"] * fb
    kids = [l for l in root["links"] if l["kind"] == "child"]
    res[name] = {
        "tbf_rate_bit_s": rate, "frames": src["frames"], "frame_bytes": fb, "payload_bytes": payload,
        "goodput_bit_s": goodput, "goodput_vs_tbf": goodput / rate,
        "owner_root_frame_bytes": owner["frame_bytes_in"], "owner_root_framing_bytes": owner["bytes_in"],
        "owner_root_framing_overhead": owner["bytes_in"] / payload - 1,
        "owner_root_tcp_payload_bytes": owner["wire_bytes_in"], "owner_root_tls_overhead": owner["wire_bytes_in"] / owner["bytes_in"] - 1,
        "veth_tx_bytes": int(open(d + "/veth_tx").read()), "veth_overhead": int(open(d + "/veth_tx").read()) / payload - 1,
        "root_child_links_frame_bytes": [k["frame_bytes_out"] for k in kids],
        "cpu_s_per_gib": {"source": src["cpu_s"] / (payload / 2**30), "root": root["cpu_s"] / (payload / 2**30),
                          "sink0": j(d + "/s0.jsonl.links")["cpu_s"] / (payload / 2**30)},
        "loadavg_1min_after": float(open("/proc/loadavg").read().split()[0]),
    }
d = os.path.join(work, "latency_chain")
src = j(d + "/source.json") if os.path.isdir(d) else None
if src:
  lv = [jl(d + "/s%d.jsonl" % i) for i in range(3)]
  per = []
  for f in range(src["frames"]):
    t0 = src["starts_ns"][f]
    per.append([(lv[i][f]["t_ns"] - t0) / 1e6 for i in range(3)])
  res["latency_chain"] = {
    "frame_bytes": src["frame_bytes"], "frames": src["frames"],
    "complete_ms_by_depth": per,
    "depth1_ms_median": statistics.median(p[0] for p in per),
    "added_ms_per_level_median": statistics.median([(p[2] - p[0]) / 2 for p in per]),
    "added_ms_level2_median": statistics.median(p[1] - p[0] for p in per),
    "added_ms_level3_median": statistics.median(p[2] - p[1] for p in per),
    "depths": [lv[i][0]["depth"] for i in range(3)],
}
for name in ("rss_fanout4_retain64", "rss_fanout4_retain0"):
    d = os.path.join(work, name)
    if not os.path.isdir(d): continue
    root, src = j(d + "/root.json"), j(d + "/source.json")
    s0 = jl(d + "/s0.jsonl")
    res[name] = {"payload_bytes": src["frames"] * src["frame_bytes"], "idle_rss_kib": root["idle_rss_kib"], "peak_rss_kib": root["peak_rss_kib"],
                 "retain_memory_bytes": root["retain_memory_bytes"], "link_window_bytes": root["link_window_bytes"], "fanout": root["fanout"],
                 "block_bytes": root["block_bytes"], "stream_s": (s0[-1]["t_ns"] - src["t0_ns"]) / 1e9,
                 "max_store_memory_bytes": max(s["memory_bytes"] for s in root["samples"]),
                 "max_spilled_bytes": max(s["spilled_bytes"] for s in root["samples"]), "root_cpu_s": root["cpu_s"]}
json.dump(res, open(out, "w"), indent=1)
for k in ("goodput_200mbit", "goodput_1gbit", "goodput_1gbit_1sink"):
    if k not in res: continue
    r = res[k]
    print("%s: goodput %.1f Mbit/s = %.1f%% of tbf; owner->root frames %d B = payload %d B; framing +%.4f%%, TLS +%.3f%%, on the veth (IP/TCP incl.) +%.2f%%; CPU s/GiB source %.2f root %.2f sink %.2f"
          % (k, r["goodput_bit_s"] / 1e6, 100 * r["goodput_vs_tbf"], r["owner_root_frame_bytes"], r["payload_bytes"], 100 * r["owner_root_framing_overhead"],
             100 * r["owner_root_tls_overhead"], 100 * r["veth_overhead"], r["cpu_s_per_gib"]["source"], r["cpu_s_per_gib"]["root"], r["cpu_s_per_gib"]["sink0"]))
r = res.get("latency_chain")
if r: print("latency: 64 MiB frame complete at depth 1 after %.1f ms (median); each further level adds %.2f ms (depth 2: +%.2f, depth 3: +%.2f)"
      % (r["depth1_ms_median"], r["added_ms_per_level_median"], r["added_ms_level2_median"], r["added_ms_level3_median"]))
for k in ("rss_fanout4_retain64", "rss_fanout4_retain0"):
    if k not in res: continue
    r = res[k]
    print("%s: root RSS idle %.1f MiB, peak %.1f MiB while %.2f GiB streamed in %.1f s (store in memory max %.1f MiB, spilled %.1f MiB)"
          % (k, r["idle_rss_kib"] / 1024, r["peak_rss_kib"] / 1024, r["payload_bytes"] / 2**30, r["stream_s"], r["max_store_memory_bytes"] / 2**20, r["max_spilled_bytes"] / 2**20))
print("results:", out)
PY
