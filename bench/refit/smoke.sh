#!/usr/bin/env bash
# bench-smoke (ctest label): the end-to-end bench on a tiny model, one refit per method, then its
# plots. Checks what the outputs promise — every run a well-formed JSON object with the documented
# keys, committed and bit-exact; results.csv with one row per run; PNG files that are PNGs; the
# table — and asserts no timing. Uses network namespaces when it can (root), loopback otherwise
# (the bench says which). Then the same refit on the two networked transports, bitrefit only: the
# relay tree (root relay on the rollout side, mutual TLS) and S3 on moto (skipped, and said so, where
# moto is not installed).
#   bash bench/refit/smoke.sh BUILD/bench/refit/bitrefit-bench-refit OUTDIR
set -euo pipefail
bin=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3  # Debian's python3 with python3-matplotlib (scripts/install-deps.sh)
rm -rf "$out"
"$bin" --model-mib 1 --receivers 2 --link 1gbit --changes 0.01 --methods dense,overwrite,bitrefit \
       --out "$out" --session-timeout-s 90
"$bin" --model-mib 1 --receivers 2 --link 1gbit --changes 0.01 --methods bitrefit --transport relay,s3 \
       --out "$out" --session-timeout-s 90 --append
"$py" - "$out" <<'EOF'
import csv, json, sys
d = sys.argv[1]
every = [json.loads(l) for l in open(d + "/runs.jsonl") if l.strip()]
by_t = {}
for r in every:
    by_t.setdefault(r["inputs"]["transport"], []).append(r)
assert set(by_t) <= {"dir", "relay", "s3"} and "dir" in by_t and "relay" in by_t, sorted(by_t)
for t in ("relay", "s3"):
    if t in by_t:
        assert [r["inputs"]["method"] for r in by_t[t]] == ["bitrefit"], (t, by_t[t])
        r = by_t[t][0]
        assert r["bit_exact"] is True and r["committed"] is True, f"{t}: not bit-exact/committed"
        assert r["payload_bytes"] == next(x for x in by_t["dir"] if x["inputs"]["method"] == "bitrefit")["payload_bytes"], \
            f"{t}: another payload than dir's for the same change set"
runs = by_t["dir"]
assert len(runs) == 3, f"expected 3 dir runs (one per method), got {len(runs)}"
assert sorted(r["inputs"]["method"] for r in runs) == ["bitrefit", "dense", "overwrite"], runs
for r in runs:
    for k in ("schema", "inputs", "change", "version", "payload_bytes", "dense_bytes", "phases_s", "total_s",
              "gate_closed_s", "bytes_per_link", "wire_s", "bit_exact", "committed", "change_rate"):
        assert k in r, f"{r['inputs']['method']}: missing key {k}"
    assert r["schema"] == "bitrefit-bench-refit/1"
    for k in ("compare", "encode", "transfer", "apply", "sync", "commit"):
        assert isinstance(r["phases_s"][k], (int, float)) and r["phases_s"][k] >= 0, (k, r["phases_s"])
    for k in ("method", "transport", "net", "link", "link_bits_per_s", "receivers", "model"):
        assert k in r["inputs"], f"inputs lack {k}"
    assert r["bit_exact"] is True and r["committed"] is True, f"{r['inputs']['method']} not bit-exact/committed"
    assert r["total_s"] > 0 and r["payload_bytes"] > 0
    assert r["bytes_per_link"]["trainer_to_rollout"] is None or r["bytes_per_link"]["trainer_to_rollout"] >= r["payload_bytes"]
    assert len(r["attestations"]) == 2 and len(set(r["attestations"].values())) == 1
m = {r["inputs"]["method"]: r for r in runs}
assert m["dense"]["payload_bytes"] == m["dense"]["dense_bytes"]
assert m["bitrefit"]["payload_bytes"] < m["overwrite"]["payload_bytes"] < m["dense"]["payload_bytes"], \
    {k: v["payload_bytes"] for k, v in m.items()}
rows = list(csv.DictReader(open(d + "/results.csv")))
assert len(rows) == len(every) and {"method", "total_s", "payload_bytes", "wire_s", "compare_s"} <= set(rows[0]), rows[:1]
print("bench-smoke: runs.jsonl and results.csv well-formed; net =", runs[0]["inputs"]["net"], "; transports:", sorted(by_t))
EOF
"$py" "$here/plot.py" "$out" > "$out/plot.log"
for png in transports dir/time_vs_change dir/phases dir/bytes relay/time_vs_change; do
  f="$out/$png.png"
  [ -s "$f" ] || { echo "bench-smoke: $f missing"; exit 1; }
  [ "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || { echo "bench-smoke: $f is not a PNG"; exit 1; }
done
grep -q "relay" "$out/transports.md" || { echo "bench-smoke: transports.md lacks the relay column"; exit 1; }
grep -q "bitrefit s" "$out/dir/table.md" || { echo "bench-smoke: table.md lacks the table"; exit 1; }
echo "bench-smoke: PNG plots and table written to $out"
