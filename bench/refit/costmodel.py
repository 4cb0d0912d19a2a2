"""Cost model of one refit, calibrated from bitrefit-bench-refit's measured runs.

Why: our machine moves a ~1 GiB model over 200 Mbit/s - 1 Gbit/s links; the paper moves 30B - 1T
parameters between clusters. The model below separates what scales with the model (compare,
attestation), with the change set (encode, persist, apply), with the payload over the link
(transfer), and what is fixed (protocol rounds, the commit's compare-and-set), calibrates each
constant from measured phase times, and so can (1) predict our own runs on another link, which
validates it, and (2) project the paper's configurations. A projection is not a measurement: the
assumptions are printed with it.

Model of one engine refit (bitrefit or overwrite), sequential phases of the sender:
    T = compare + persist + transfer + commit + protocol
    compare  = c_cmp * model_bytes / P_owner                 (copy v+1 out, bitwise compare)
    persist  = (p0 + p1 * changed) / P_owner                 (durable change set, before encoding)
    transfer = max(wire, encode_wall, apply_wall) + sync + ack   (first publish .. compare-and-set)
      wire        = payload_bytes / (goodput * link_bytes_per_s)
      payload     = elements * bpe(method, change_rate)       (payload bytes per element, measured)
      encode_wall = (e0 * model_bytes + e1 * changed) / (threads * P_owner)   (overlaps wire)
      apply_wall  = a1[method] * changed / P_recv             (a receiver's verify + decode + write;
                                                               overlaps wire, each receiver in parallel)
      sync        = c_att * model_bytes / P_recv              (receivers' attestation, after the last apply)
      ack         = fixed: the last frame's fetch and apply, acks, the arrival round
    commit   = fixed (the commit log's compare-and-set)
    protocol = fixed (prepare round, announcement, gate reopening, reports)
Dense (transport only):   T = model_bytes / min(goodput * link_bytes_per_s, dense_cap) + dense_fixed
    dense_cap: the rate at which this machine's CPU moved dense bytes through the transport when a
    dense run fell clearly below the link's goodput (the `dir` object server fans every byte out
    to each receiver over loopback TCP); unset when every dense run was link-bound. The projection
    to the paper's links leaves it out (their dense transfer is link-bound by construction).
P_owner / P_recv: how many owners (cores) share the compare/encode/persist work and how many
receiver shards share attestation. In our runs both are 1 (the sender compares its owners one
after the other on its driver thread; each receiver attests its whole model).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field, asdict

import numpy as np


def engine(r):
    return r["inputs"]["method"] in ("bitrefit", "overwrite")


def link_Bps(r):
    return r["inputs"]["link_bits_per_s"] / 8.0


@dataclass
class Calibration:
    c_cmp: float = 0.0          # s per model byte (compare)
    p0: float = 0.0             # s (persist, fixed)
    p1: float = 0.0             # s per changed element (persist)
    e0: dict = field(default_factory=dict)  # method -> CPU s per model byte (encode scan)
    e1: dict = field(default_factory=dict)  # method -> CPU s per changed element (encode)
    c_att: float = 0.0          # s per model byte (attestation at a receiver)
    a1: dict = field(default_factory=dict)  # method -> s per changed element (a receiver's apply)
    ack: float = 0.0            # s
    commit: float = 0.0         # s
    protocol: float = 0.0       # s
    goodput: float = 1.0        # payload bytes per link byte-time (TCP/IP headers, pacing)
    dense_fixed: float = 0.0    # s
    dense_cap: float = 0.0      # bytes/s a CPU-bound dense run reached (0: every dense run was link-bound)
    bpe: dict = field(default_factory=dict)  # method -> sorted [(change_rate, payload bytes per element)]
    threads: int = 2
    runs: int = 0

    def to_json(self):
        return asdict(self)


def _median(xs, default=0.0):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return statistics.median(xs) if xs else default


def _fit_linear(x0, x1, y):
    """Least squares y = a*x0 + b*x1 with a, b >= 0 (clipped)."""
    if not y:
        return 0.0, 0.0
    A = np.array([x0, x1], dtype=float).T
    sol, *_ = np.linalg.lstsq(A, np.array(y, dtype=float), rcond=None)
    return max(float(sol[0]), 0.0), max(float(sol[1]), 0.0)


def calibrate(runs) -> Calibration:
    """Constants from measured runs (any links; engine runs and dense runs)."""
    c = Calibration(runs=len(runs))
    eng = [r for r in runs if engine(r) and r.get("committed")]
    dense = [r for r in runs if r["inputs"]["method"] == "dense"]
    if eng:
        c.threads = int(eng[0]["inputs"]["threads"])
    # goodput: from the dense runs over the slowest limited link (raw bytes, link-bound there)
    limited = [r for r in dense if r["wire_s"] > 0 and link_Bps(r) > 0]
    if limited:
        slow = min(link_Bps(r) for r in limited)
        c.goodput = min(_median([r["payload_bytes"] / (r["wire_s"] * slow) for r in limited if link_Bps(r) == slow], 1.0), 1.0)
        # a dense run far below that goodput was bounded by the CPU, not the link
        capped = [r["payload_bytes"] / r["wire_s"] for r in limited if r["payload_bytes"] / (r["wire_s"] * link_Bps(r)) < 0.8 * c.goodput]
        c.dense_cap = _median(capped, 0.0)
        c.dense_fixed = max(_median([r["total_s"] - r["wire_s"] for r in limited]), 0.0)
    if not eng:
        return c
    mb = lambda r: float(r["inputs"]["model"]["bytes"])
    c.c_cmp = _median([r["phases_s"]["compare"] / mb(r) for r in eng])
    c.c_att = _median([r["phases_s"]["sync"] / mb(r) for r in eng])
    c.p0, c.p1 = _fit_linear([1.0] * len(eng), [float(r["changed"]) for r in eng], [r["phases_s"]["persist"] for r in eng])
    for m in ("bitrefit", "overwrite"):
        rs = [r for r in eng if r["inputs"]["method"] == m]
        if rs:
            c.e0[m], c.e1[m] = _fit_linear([mb(r) for r in rs], [float(r["changed"]) for r in rs], [r["phases_s"]["encode"] for r in rs])
            pts = {}
            for r in rs:
                if r["changed"]:
                    pts.setdefault(round(r["change_rate"], 4), []).append(r["payload_bytes"] / r["elements"])
            c.bpe[m] = sorted((p, _median(v)) for p, v in pts.items())
    for m in ("bitrefit", "overwrite"):
        rs = [r for r in eng if r["inputs"]["method"] == m and r["changed"]]
        if rs:  # through the origin: apply time per changed element
            c.a1[m] = sum(r["phases_s"]["apply"] for r in rs) / sum(float(r["changed"]) for r in rs)
    c.commit = _median([r["phases_s"]["commit"] for r in eng])
    acks, protos = [], []
    for r in eng:
        ph = r["phases_s"]
        wire = r["payload_bytes"] / (c.goodput * link_Bps(r)) if link_Bps(r) > 0 else r["wire_s"]
        enc_wall = ph["encode"] / c.threads
        acks.append(ph["transfer"] - max(wire, enc_wall, ph["apply"]) - ph["sync"])
        protos.append(r["total_s"] - ph["compare"] - ph["persist"] - ph["transfer"] - ph["commit"])
    c.ack = max(_median(acks), 0.0)
    c.protocol = max(_median(protos), 0.0)
    return c


def payload_per_element(c: Calibration, method: str, rate: float) -> float:
    """Measured payload bytes per element at `rate`, linear between measured rates (and through
    the nearest measured point's bytes-per-changed-element outside them)."""
    pts = c.bpe.get(method) or []
    if not pts or rate <= 0:
        return 0.0
    if rate <= pts[0][0]:
        return pts[0][1] * rate / pts[0][0]
    if rate >= pts[-1][0]:
        return pts[-1][1] * rate / pts[-1][0]
    for (p0, b0), (p1, b1) in zip(pts, pts[1:]):
        if p0 <= rate <= p1:
            return b0 + (b1 - b0) * (rate - p0) / (p1 - p0)
    return pts[-1][1]


def predict(c: Calibration, method: str, elements: float, rate: float, link_bits_per_s: float,
            owners_parallel: float = 1.0, receivers_parallel: float = 1.0, payload_bytes=None, cpu_cap: bool = True):
    """Predicted refit time and its parts (seconds). payload_bytes: use a known payload instead of
    the measured bytes-per-element curve (validation on our runs uses the curve, not the run's own).
    cpu_cap: bound dense by this machine's measured CPU-bound dense rate (off for projections)."""
    B = link_bits_per_s / 8.0
    mbytes = 2.0 * elements  # BF16
    if method == "dense":
        rate_Bps = c.goodput * B
        if cpu_cap and c.dense_cap > 0:
            rate_Bps = min(rate_Bps, c.dense_cap)
        wire = mbytes / rate_Bps
        total = wire + c.dense_fixed
        return {"total": total, "wire": wire, "compare": 0.0, "persist": 0.0, "encode_wall": 0.0, "sync": 0.0,
                "ack": c.dense_fixed, "commit": 0.0, "protocol": 0.0, "payload": mbytes, "transfer_share": wire / total if total > 0 else None}
    changed = rate * elements
    payload = payload_bytes if payload_bytes is not None else elements * payload_per_element(c, method, rate)
    compare = c.c_cmp * mbytes / owners_parallel
    persist = (c.p0 + c.p1 * changed) / owners_parallel
    enc = (c.e0.get(method, 0.0) * mbytes + c.e1.get(method, 0.0) * changed) / (c.threads * owners_parallel)
    wire = payload / (c.goodput * B)
    apply = c.a1.get(method, 0.0) * changed / receivers_parallel
    sync = c.c_att * mbytes / receivers_parallel
    transfer = max(wire, enc, apply) + sync + c.ack
    total = compare + persist + transfer + c.commit + c.protocol
    return {"total": total, "wire": wire, "compare": compare, "persist": persist, "encode_wall": enc, "apply_wall": apply,
            "sync": sync, "ack": c.ack, "commit": c.commit, "protocol": c.protocol, "payload": payload,
            "transfer_share": wire / total if total > 0 else None}


def best_runs(runs):
    """The fastest run of each (link, step, method) over repeats (what the table shows)."""
    best = {}
    for r in runs:
        k = (r["inputs"]["link"], r["change"]["step"], r["inputs"]["method"])
        if k not in best or r["total_s"] < best[k]["total_s"]:
            best[k] = r
    return list(best.values())


def _calibrated_for(c, m):
    """Whether calibration `c` saw runs of method m (else it cannot predict them)."""
    return c.dense_fixed > 0 or c.goodput < 1.0 if m == "dense" else bool(c.bpe.get(m))


def _row(c, r, held, calibrated_on):
    m = r["inputs"]["method"]
    if not _calibrated_for(c, m):
        return None
    p = predict(c, m, r["elements"], r["change_rate"] or 0.0, r["inputs"]["link_bits_per_s"])
    return {"link": r["inputs"]["link"], "held_out": held, "calibrated_on": calibrated_on, "method": m, "step": r["change"]["step"],
            "measured_s": r["total_s"], "predicted_s": p["total"], "error": (p["total"] - r["total_s"]) / r["total_s"]}


def _mape(rows):
    out = {}
    for m in sorted({x["method"] for x in rows}):
        errs = [abs(x["error"]) for x in rows if x["method"] == m]
        out[m] = sum(errs) / len(errs)
    return out


def validate(runs):
    """Two out-of-sample checks on the best run of each case (zero-change runs are the fixed
    overhead itself and are not predicted):
      cross-link: calibrate on every other link, predict this link's runs (tests the link terms);
      leave-one-out: calibrate on every other case of every link, predict this case.
    Returns (rows, {"cross_link": mape per method, "leave_one_out": mape per method})."""
    runs = best_runs(runs)
    wanted = [r for r in runs if r["inputs"]["method"] == "dense" or r.get("changed")]
    links = sorted({r["inputs"]["link"] for r in runs if link_Bps(r) > 0})
    cross, loo = [], []
    for held in links:
        train = [r for r in runs if r["inputs"]["link"] != held]
        if train:
            c = calibrate(train)
            cross += [_row(c, r, "link", [l for l in links if l != held]) for r in wanted if r["inputs"]["link"] == held]
    for r in wanted:
        case = (r["inputs"]["link"], r["change"]["step"])
        c = calibrate([x for x in runs if (x["inputs"]["link"], x["change"]["step"]) != case])
        loo.append(_row(c, r, "case", "all other cases"))
    cross, loo = [x for x in cross if x], [x for x in loo if x]
    return cross + loo, {"cross_link": _mape(cross), "leave_one_out": _mape(loo)}


# ---- the paper's configurations ---------------------------------------------------------------
# From DESIGN.md / issue 17 (NeMo-DCR, arXiv 2610.08430): refit 12-40x faster than a transport-only
# dense transfer at 3-5 % change rates for 30B - 1T models; 1T at 3 %: 150 s against 87.5 min;
# transfer is 77-94 % of refit latency; XOR 38-40 % fewer payload bytes than overwrite-only.
PAPER = {
    "speedup_range": (12, 40),
    "transfer_share_range": (0.77, 0.94),
    "1T@3%": {"refit_s": 150.0, "dense_s": 87.5 * 60},
}
PAPER_MODELS = [("30B", 30e9), ("120B", 120e9), ("1T", 1e12)]
PAPER_RATES = [0.03, 0.05]


def project(c: Calibration, shard_bytes: float = 4e9):
    """Projected refit times of the paper's configurations (see ASSUMPTIONS)."""
    # The link: the paper's dense 1T transfer (2e12 BF16 bytes in 87.5 min) read as our goodput
    # over a link of the rate that gives it; the same link for every model size.
    link_bits = 2e12 / PAPER["1T@3%"]["dense_s"] / c.goodput * 8
    out = []
    for name, n in PAPER_MODELS:
        par = max(1.0, 2 * n / shard_bytes)
        dense = predict(c, "dense", n, 0.0, link_bits, cpu_cap=False)
        for rate in PAPER_RATES:
            row = {"model": name, "params": n, "rate": rate, "link_gbit": link_bits / 1e9, "parallel_shards": par,
                   "dense_s": dense["total"]}
            for m in ("bitrefit", "overwrite"):
                p = predict(c, m, n, rate, link_bits, owners_parallel=par, receivers_parallel=par)
                row[m + "_s"] = p["total"]
                row[m + "_transfer_share"] = p["transfer_share"]
                row[m + "_payload_bytes"] = p["payload"]
            row["speedup"] = dense["total"] / row["bitrefit_s"]
            row["xor_vs_overwrite_bytes"] = row["bitrefit_payload_bytes"] / row["overwrite_payload_bytes"] if row["overwrite_payload_bytes"] else None
            if name == "1T" and rate == 0.03:
                row["paper_refit_s"] = PAPER["1T@3%"]["refit_s"]
                row["paper_dense_s"] = PAPER["1T@3%"]["dense_s"]
                row["paper_speedup"] = PAPER["1T@3%"]["dense_s"] / PAPER["1T@3%"]["refit_s"]
            out.append(row)
    return out, link_bits


ASSUMPTIONS = [
    "Link: the paper's dense 1T transfer (2e12 bytes of BF16 in 87.5 min) defines the link: the rate at which our "
    "measured TCP goodput over tbf gives that time; 30B and 120B use the same link (the paper's per-size links are not in our notes).",
    "Payload bytes per element at 3 % and 5 % are our measured ones on the synthetic change sets (+-1 ulp moves of "
    "N(0, 0.02) BF16 weights); real models' deltas differ (our AdamW simulator's payloads are in the table).",
    "Compute parallelism: every owner (trainer rank) compares, persists and encodes a 4 GB BF16 shard on one CPU core at our "
    "measured per-core speed, all owners in parallel; every receiver shard attests 4 GB likewise (30B: 15, 120B: 60, 1T: 500 shards). "
    "GPU delta builds would be faster: compute is pessimistic, transfer is what dominates.",
    "Fixed costs (protocol rounds, commit compare-and-set, acks) are ours, measured on one machine with a file commit log; "
    "across regions each control round trip adds the regions' RTT (a few round trips per refit).",
    "Encoding and the receivers' apply overlap transfer (frames are published as they are encoded and applied as they "
    "arrive), as measured here; apply and attestation are the receivers' measured per-element and per-byte costs.",
    "Our per-core costs were measured on a shared 2-core machine under load (load average in every record): they are "
    "pessimistic, and they matter only where compute is not hidden behind the link.",
]
