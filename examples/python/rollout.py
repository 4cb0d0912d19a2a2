"""A rollout process: serves greedy generations with its own BF16 copy of the policy, refit in place.

    rollout.py --dir DIR --index I

Started (and restarted) by trainer.py. The few lines a rollout engine adds to its weight loading
are marked "bitrefit:" below: a Receiver over the model's own tensors, started in the background,
and a `with receiver.serving():` around each batch of requests. After every version it serves it
writes DIR/reports/rollout-I.json: the version, the digest of its parameters (every bit) and its
greedy generations, which the trainer checks against its own export.
A file DIR/kill/rollout-I makes this process SIGKILL itself the next time its request gate closes
(a refit has begun, nothing applied yet): a rollout engine dying mid-refit.
"""
import argparse
import json
import os
import pathlib
import signal
import sys

import torch

import bitrefit
from model import Config, LlamaForCausalLM, encode, generate


def write_json_atomically(path, obj):
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--index", type=int, required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = pathlib.Path(args.dir)
    setup = json.loads((root / "example.json").read_text())
    cfg = Config(**setup["config"])
    prompts = [encode(p) for p in setup["prompts"]]
    kill_order = root / "kill" / ("rollout-%d" % args.index)
    report = root / "reports" / ("rollout-%d.json" % args.index)
    parent = os.getppid()

    # The serving engine's model, in the dtype it serves. Its initial weights do not matter: the
    # receiver restores the committed version into them before the gate first opens.
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()

    def on_gate(open_):
        if not open_ and kill_order.exists():
            kill_order.unlink()
            os.kill(os.getpid(), signal.SIGKILL)

    # bitrefit: refits land in model.state_dict()'s tensors, i.e. in the parameters themselves.
    receiver = bitrefit.Receiver(model.state_dict(), root, index=args.index, on_gate=on_gate)
    receiver.start(background=True)

    served = -1
    while not (root / "stop").exists() and os.getppid() == parent:
        if not receiver.wait(served + 1, timeout=0.1):
            continue
        # bitrefit: a batch of requests runs with the gate held open: no refit applies meanwhile.
        with receiver.serving():
            version = receiver.version
            tokens = generate(model, prompts, setup["new_tokens"])
            digest = bitrefit.digest(model.state_dict())["digest"]
        write_json_atomically(report, {"version": version, "digest": digest, "tokens": tokens,
                                       "incarnation": receiver.stats()["incarnation"], "pid": os.getpid()})
        served = version
    receiver.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
