"""The Python binding's overhead against the C++ demo, on the same model and the same change set.

    PYTHONPATH=build/python /usr/bin/python3 bench/python/bench_binding.py [--params 25M] [--refits 6]
        [--receivers 2] [--threads 2] [--build build] [--json]

1. `bitrefit-make-chain` writes versions v0..vN of the Llama-shaped BF16 model that `bitrefit-demo
   --params P` trains (same dims, seed 42, lr 1e-6: the AdamW simulation is deterministic, so the
   chain's v_k is the demo's version k bit for bit — checked below through the per-refit changed
   element counts and payload bytes, which must be equal).
2. `bitrefit-demo --json` (C++ trainer process + R rollout processes, no kills, no restarts).
3. The same deployment through the binding: a bitrefit.Sender over the chain's tensors (numpy
   uint16 arrays declared BF16) and R rollout processes, each a bitrefit.Receiver over its own numpy
   arrays, stepped in the background; one refit per chain version.
Both run the same engine (directory object store, filesystem commit log and baselines, 1 owner,
T encoder threads, 8 MiB frames, 5 s deadline), --repeat times each, alternating. Per phase it
prints the median over all refits of each side and their ratio, plus what only the binding adds: refit() wall time minus the
transition's own total (resolving tensors, releasing the GIL, converting the statistics).
Timings are medians of runs side by side; the machine is noisy.
"""
import argparse
import json
import mmap
import os
import pathlib
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

PHASES = ["compare", "encode", "transfer", "apply", "sync", "commit", "persist"]


def dims_for(p):
    """examples/demo/main.cpp dims_for(): width by size class, then as many layers as fit."""
    if p < 2_000_000:
        d = dict(hidden=64, intermediate=172, vocab=256, heads=4, kv_heads=2)
    elif p < 30_000_000:
        d = dict(hidden=256, intermediate=688, vocab=4096, heads=8, kv_heads=4)
    else:
        d = dict(hidden=768, intermediate=2048, vocab=32000, heads=12, kv_heads=4)
    head = d["hidden"] // d["heads"]
    kv = d["kv_heads"] * head
    embed = 2 * d["vocab"] * d["hidden"] + d["hidden"]
    layer = 2 * d["hidden"] ** 2 + 2 * kv * d["hidden"] + 3 * d["hidden"] * d["intermediate"] + 2 * d["hidden"]
    d["layers"] = max(1, (p - embed + layer // 2) // layer) if p > embed else 1
    return d


def count(s):
    mult = {"K": 1000, "M": 10**6, "G": 10**9}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def read_bf16(path):
    """A safetensors file's tensors as numpy uint16 arrays (copied into memory, so the timed
    refits never wait for the disk)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, e in header.items():
        assert e["dtype"] == "BF16", name
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(mm, dtype=np.uint16, count=(end - b) // 2, offset=8 + n + b).reshape(e["shape"]).copy()
    mm.close()
    return out


def receiver_role(args):
    import bitrefit
    spec = json.loads(pathlib.Path(args.spec).read_text())
    model = {t["name"]: bitrefit.with_dtype(np.zeros(t["shape"], dtype=np.uint16), "BF16") for t in spec}
    r = bitrefit.Receiver(model, args.dir, index=args.index)
    r.start(background=True)
    stop = pathlib.Path(args.dir) / "stop"
    while not stop.exists():
        time.sleep(0.05)
    r.close()


def run_python(args, chain, n_versions):
    import bitrefit
    versions = [read_bf16(chain / ("v%d.safetensors" % v)) for v in range(n_versions)]
    typed = [{k: bitrefit.with_dtype(a, "BF16") for k, a in v.items()} for v in versions]
    work = pathlib.Path(tempfile.mkdtemp(prefix="bitrefit-bench-py-"))
    spec = work / "spec.json"
    spec.write_text(json.dumps([{"name": k, "shape": list(a.shape)} for k, a in versions[0].items()]))
    dep = work / "deployment"
    s = bitrefit.Sender(typed[0], dep, receivers=args.receivers, threads=args.threads, deadline=5.0)
    procs = [subprocess.Popen([sys.executable, __file__, "--role", "receiver", "--dir", str(dep), "--index", str(i),
                               "--spec", str(spec)]) for i in range(args.receivers)]
    try:
        assert s.wait_for_receivers(300), "receivers did not join"
        rows = []
        for v in range(1, n_versions):
            t0 = time.perf_counter()
            st = s.refit(typed[v])
            st["wall_s"] = time.perf_counter() - t0
            rows.append(st)
        return rows
    finally:
        (dep / "stop").write_text("1")
        for p in procs:
            p.wait(timeout=60)
        s.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="25M")
    ap.add_argument("--refits", type=int, default=6)
    ap.add_argument("--receivers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each side, alternating (medians over all refits)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--role", default="bench")
    ap.add_argument("--dir")
    ap.add_argument("--index", type=int)
    ap.add_argument("--spec")
    args = ap.parse_args()
    if args.role == "receiver":
        return receiver_role(args)

    build = pathlib.Path(args.build)
    p = count(args.params)
    d = dims_for(p)
    chain = pathlib.Path(tempfile.mkdtemp(prefix="bitrefit-bench-chain-"))
    subprocess.run([str(build / "examples/cli/bitrefit-make-chain"), str(chain), "--versions", str(args.refits + 1),
                    "--layers", str(d["layers"]), "--hidden", str(d["hidden"]), "--intermediate", str(d["intermediate"]),
                    "--vocab", str(d["vocab"]), "--heads", str(d["heads"]), "--kv-heads", str(d["kv_heads"]),
                    "--seed", "42", "--lr", "1e-6", "--threads", str(args.threads)], check=True)
    cpp, py = [], []
    for _ in range(args.repeat):  # alternating, so that a noisy minute hurts both sides alike
        demo = subprocess.run([str(build / "examples/demo/bitrefit-demo"), "--params", str(p), "--refits", str(args.refits),
                               "--receivers", str(args.receivers), "--kill-every", "0", "--restart-trainer-every", "0",
                               "--threads", str(args.threads), "--json"], check=True, capture_output=True, text=True)
        cpp += [json.loads(x) for x in demo.stdout.splitlines() if x.startswith("{") and "summary" not in x]
        py += run_python(args, chain, args.refits + 1)

    same = [(c["changed"], c["payload_bytes"]) == (q["changed"], q["payload_bytes"]) for c, q in zip(cpp, py)]
    if not all(same):
        sys.exit("the chain and the demo differ: changed/payload %s vs %s" %
                 ([(c["changed"], c["payload_bytes"]) for c in cpp], [(q["changed"], q["payload_bytes"]) for q in py]))
    med = lambda rows, f: statistics.median(f(r) for r in rows)  # noqa: E731
    result = {"params": cpp[0]["elements"], "dense_bytes": cpp[0]["dense_bytes"], "refits": args.refits, "repeat": args.repeat,
              "receivers": args.receivers, "threads": args.threads, "same_change_set": True,
              "changed": [c["changed"] for c in cpp[:args.refits]],
              "payload_bytes": [c["payload_bytes"] for c in cpp[:args.refits]], "phases_s": {}}
    for ph in PHASES + ["total"]:
        get = (lambda r: r["total_s"]) if ph == "total" else (lambda r, ph=ph: r["phases_s"][ph])
        c, q = med(cpp, get), med(py, get)
        result["phases_s"][ph] = {"cpp": c, "python": q, "ratio": q / c if c > 0 else None}
    result["python_refit_wall_s"] = med(py, lambda r: r["wall_s"])
    result["binding_only_s"] = med(py, lambda r: r["wall_s"] - r["total_s"])
    if args.json:
        print(json.dumps(result))
    else:
        print("model: %d BF16 parameters (%.1f MiB), %d refits x %d runs per side, %d receiver processes, %d threads; "
              "same change set: yes" % (result["params"], result["dense_bytes"] / 2**20, args.refits, args.repeat,
                                        args.receivers, args.threads))
        print("changed per refit: %s; payload bytes: %s" % (result["changed"], result["payload_bytes"]))
        print("%-9s %12s %12s %8s" % ("phase", "C++ demo s", "Python s", "ratio"))
        for ph, v in result["phases_s"].items():
            print("%-9s %12.4f %12.4f %8s" % (ph, v["cpp"], v["python"], "%.2f" % v["ratio"] if v["ratio"] else "-"))
        print("Python refit() wall %.4f s; binding only (wall - total) %.5f s"
              % (result["python_refit_wall_s"], result["binding_only_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
