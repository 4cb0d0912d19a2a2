"""A PyTorch trainer that refits two rollout processes after every optimizer step, bit-exactly.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/trainer.py [--steps N] [--rollouts R]
        [--kill-at STEP[,STEP...]] [--json] [--dir D] [--lr LR] [--hidden H] [--layers L] ...

The trainer keeps FP32 master weights of a small Llama-shaped model (model.py) and trains it with
AdamW on next-byte prediction of a short text. After each step it exports the weights to BF16 (the
dtype the rollouts serve) and refits the rollout processes (rollout.py) through bitrefit: only the
elements whose BF16 bits changed travel, and each rollout writes them into its own parameters in
place. Then it checks every rollout two ways against its export:
  - bit-identical: the rollout's digest of its parameters (bitrefit.digest: every stored bit, with
    names, dtypes and shapes) equals the digest of the export;
  - same behaviour: the rollout's greedy generations equal those of a fresh model loaded densely
    from the export (load_state_dict), computed here.
With --kill-at K, rollout (K-th kill mod R) is killed in the middle of refit K (SIGKILL as its
request gate closes); the trainer restarts it, the refit retries, and the new process restores the
committed version densely and rejoins. Prints one line (or JSON object) per step and a summary;
exit code 0 iff every refit committed and every check passed.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import torch

import bitrefit
from model import Config, LlamaForCausalLM, decode, encode, generate

TEXT = ("The trainer moves each new policy version to the rollout engines. Only the elements whose "
        "stored bits changed travel, and every engine ends with exactly the bits a full copy would "
        "have given it. ")
PROMPTS = ["The trainer ", "Only the ", "every engine "]
HERE = pathlib.Path(__file__).resolve().parent


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--kill-at", default="", help="comma-separated steps whose refit kills a rollout")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--dir", default="")
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=0, help="default: about 8/3 * hidden")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=48)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--deadline", type=float, default=2.0, help="seconds of silence before a refit attempt fails")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


class Rollouts:
    """The rollout processes; a watcher thread restarts any that dies (a new incarnation)."""

    def __init__(self, root, n):
        self.root, self.n = root, n
        self.procs = [self.spawn(i) for i in range(n)]
        self.kills = 0
        self.stop = threading.Event()
        self.watcher = threading.Thread(target=self.watch, daemon=True)
        self.watcher.start()

    def spawn(self, i):
        return subprocess.Popen([sys.executable, str(HERE / "rollout.py"), "--dir", str(self.root), "--index", str(i)],
                                env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))

    def watch(self):
        while not self.stop.is_set():
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    if p.returncode == -9:
                        self.kills += 1
                    else:
                        print("trainer: rollout %d exited with %d; restarting" % (i, p.returncode), file=sys.stderr)
                    self.procs[i] = self.spawn(i)
            time.sleep(0.02)

    def close(self):
        self.stop.set()
        self.watcher.join()
        (self.root / "stop").write_text("1")
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_for_reports(root, n, version, timeout=120.0):
    """Each rollout's report of `version` (written after it served that version)."""
    until = time.monotonic() + timeout
    reports = [None] * n
    while time.monotonic() < until:
        for i in range(n):
            try:
                r = json.loads((root / "reports" / ("rollout-%d.json" % i)).read_text())
                if r["version"] == version:
                    reports[i] = r
            except (FileNotFoundError, json.JSONDecodeError):
                pass
        if all(reports):
            return reports
        time.sleep(0.02)
    raise TimeoutError("rollouts did not report version %d: %s" % (version, reports))


def main():
    args = parse()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    own_dir = not args.dir
    root = pathlib.Path(args.dir or tempfile.mkdtemp(prefix="bitrefit-example-"))
    for sub in ("reports", "kill"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "stop").unlink(missing_ok=True)
    cfg = Config(hidden=args.hidden, intermediate=args.intermediate or (8 * args.hidden // 3 + 7) // 8 * 8,
                 layers=args.layers, heads=args.heads, kv_heads=args.kv_heads)
    (root / "example.json").write_text(json.dumps({"config": json.loads(cfg.to_json()), "prompts": PROMPTS,
                                                   "new_tokens": args.new_tokens}))
    kill_at = [int(s) for s in args.kill_at.split(",") if s]

    master = LlamaForCausalLM(cfg)  # FP32 master weights
    opt = torch.optim.AdamW(master.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.0)
    data = torch.tensor(encode(TEXT * 4), dtype=torch.long)
    gen = torch.Generator().manual_seed(args.seed)

    def train_step():
        starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s: s + args.seq + 1] for s in starts])
        logits = master(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    def export():
        """The weights as the rollouts serve them: BF16 (round to nearest even), canonical names."""
        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in master.state_dict().items()}

    reference = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()

    def check(version, weights):
        """Every rollout at `version`: its parameter digest and greedy generations vs the export."""
        want = bitrefit.digest(weights)["digest"]
        reference.load_state_dict(weights)  # a dense load of the export
        tokens = generate(reference, [encode(p) for p in PROMPTS], args.new_tokens)
        reports = wait_for_reports(root, args.rollouts, version)
        return (all(r["digest"] == want for r in reports), all(r["tokens"] == tokens for r in reports),
                decode(tokens[0]))

    weights = export()
    sender = bitrefit.Sender(weights, root, receivers=args.rollouts, deadline=args.deadline)
    rollouts = Rollouts(root, args.rollouts)
    ok = True
    totals = {"steps": args.steps, "committed": 0, "bit_exact_all": True, "generations_equal_all": True,
              "payload_bytes_total": 0, "dense_bytes_total": 0, "retries": 0}
    try:
        if not sender.wait_for_receivers(120):
            raise TimeoutError("the rollout processes did not join")
        exact, same, sample = check(sender.version, weights)
        if not args.json:
            print("trainer: %d parameters (BF16 %.2f MiB), %d rollout processes; v0 bit-exact: %s, generations equal: %s"
                  % (sum(p.numel() for p in master.parameters()), sum(w.numel() * 2 for w in weights.values()) / 2**20,
                     args.rollouts, "yes" if exact else "NO", "yes" if same else "NO"))
        ok &= exact and same
        for step in range(1, args.steps + 1):
            loss = train_step()
            weights = export()
            victim = -1
            if step in kill_at:
                victim = kill_at.index(step) % args.rollouts
                (root / "kill" / ("rollout-%d" % victim)).write_text("1")
            t0 = time.monotonic()
            st = sender.refit(weights)
            refit_s = time.monotonic() - t0
            exact, same, sample = check(st["version"], weights)
            ok &= st["committed"] and exact and same
            totals["committed"] += st["committed"]
            totals["bit_exact_all"] &= exact
            totals["generations_equal_all"] &= same
            totals["payload_bytes_total"] += st["payload_bytes"]
            totals["dense_bytes_total"] += st["dense_bytes"]
            totals["retries"] += st["attempts"] - 1
            if args.json:
                print(json.dumps({"step": step, "loss": loss, "refit_s": refit_s, "bit_exact": exact,
                                  "generations_equal": same, "killed_rollout": victim, "sample": sample, **st}))
            else:
                ph = st["phases_s"]
                print("step %2d loss %.3f | v%d changed %.2f%% payload %.1f KiB (dense %.1f KiB, %.1fx) attempts %d "
                      "refit %.3f s (compare %.3f encode %.3f transfer %.3f apply %.3f commit %.3f) | bit-exact: %s, "
                      "generations equal: %s%s | %r"
                      % (step, loss, st["version"], 100 * st["change_rate"], st["payload_bytes"] / 1024,
                         st["dense_bytes"] / 1024, st["dense_bytes"] / max(1, st["payload_bytes"]), st["attempts"],
                         refit_s, ph["compare"], ph["encode"], ph["transfer"], ph["apply"], ph["commit"],
                         "yes" if exact else "NO", "yes" if same else "NO",
                         " [killed rollout %d mid-refit]" % victim if victim >= 0 else "", sample))
            sys.stdout.flush()
    finally:
        rollouts.close()
        sender.close()
    totals["kills"] = rollouts.kills
    if args.json:
        print(json.dumps({"summary": True, **totals}))
    else:
        print("summary: %d/%d refits committed, bit_exact_all=%s, generations_equal_all=%s, kills=%d, retries=%d, "
              "payload %.1f KiB vs dense %.1f KiB"
              % (totals["committed"], args.steps, totals["bit_exact_all"], totals["generations_equal_all"],
                 rollouts.kills, totals["retries"], totals["payload_bytes_total"] / 1024,
                 totals["dense_bytes_total"] / 1024))
    if own_dir:
        import shutil
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok and totals["committed"] == args.steps else 1


if __name__ == "__main__":
    sys.exit(main())
