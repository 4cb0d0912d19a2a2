"""bitrefit.Sender / bitrefit.Receiver with torch tensors, in one process (label python).

One trainer-side Sender and rollout-side Receivers over a temporary deployment directory. Bits are
compared as integers (torch.equal on same-size integer views), never as values: -0.0, NaN payloads,
infinities and subnormals are in every floating tensor. The killed-process case is
test_example.py.
"""
import contextlib
import pathlib
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import torch

import bitrefit

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "io"))
import safetensors_ref as ref  # noqa: E402

torch.set_num_threads(1)

INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
F8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def bits(t):
    """A tensor's stored bits as an integer tensor (bool and float8 as uint8)."""
    if isinstance(t, bitrefit.TypedTensor):
        t = t.tensor
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t.view({1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}[t.itemsize]))
    return t.view(INT_VIEW[t.element_size()]) if t.dtype != torch.bool else t.view(torch.uint8)


def same_bits(a, b):
    return all(torch.equal(bits(a[k]), bits(b[k])) for k in a) and a.keys() == b.keys()


def special_tensor(dtype, shape, seed, name):
    """A tensor of `dtype` whose first elements are the special bit patterns of safetensors_ref."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_floating_point:
        t = (torch.randn(shape, generator=g) * 0.05).to(dtype)
    else:
        info = torch.iinfo(dtype)
        t = torch.randint(max(info.min, -(2**31)), min(info.max, 2**31 - 1), shape, generator=g, dtype=torch.int64).to(dtype)
    special = ref.SPECIAL.get(name, [])
    flat = bits(t).reshape(-1)
    for i, p in enumerate(special[: flat.numel()]):
        w = 8 * t.element_size()
        flat[i] = p - (1 << w) if p >= 1 << (w - 1) else p  # two's complement into the signed view
    return t


def model_state(seed=1):
    """One tensor per dtype a checkpoint carries, as torch (or, for uint16/32/64 and float8 on an old
    torch, as same-size integer tensors declared with with_dtype)."""
    spec = [("bool", torch.bool, "BOOL"), ("u8", torch.uint8, "U8"), ("i8", torch.int8, "I8"), ("i16", torch.int16, "I16"),
            ("i32", torch.int32, "I32"), ("i64", torch.int64, "I64"), ("f16", torch.float16, "F16"),
            ("bf16", torch.bfloat16, "BF16"), ("f32", torch.float32, "F32"), ("f64", torch.float64, "F64")]
    sd = {}
    for i, (n, dt, st) in enumerate(spec):
        sd["t." + n] = special_tensor(dt, (33, 7), seed * 100 + i, st)
    for i, (n, st, dt) in enumerate([("u16", "U16", torch.int16), ("u32", "U32", torch.int32), ("u64", "U64", torch.int64),
                                     ("f8e4m3", "F8_E4M3", torch.uint8), ("f8e5m2", "F8_E5M2", torch.uint8)]):
        sd["t." + n] = bitrefit.with_dtype(special_tensor(dt, (65,), seed * 100 + 50 + i, st), st)
    for dt in F8:  # a torch with native float8 goes through its own dtype too
        sd["t.native_" + str(dt).split(".")[1]] = special_tensor(torch.uint8, (40,), seed + 7, "F8_E4M3").view(dt)
    return sd


def zeros_like_state(sd):
    out = {}
    for k, v in sd.items():
        if isinstance(v, bitrefit.TypedTensor):
            out[k] = bitrefit.with_dtype(torch.zeros_like(v.tensor), v.dtype)
        else:
            out[k] = torch.zeros_like(v)
    return out


def perturb(sd, rate, seed):
    """Changes about `rate` of each tensor's elements in place, and the sign bit of element 0: for
    the floating tensors that is -0.0 -> +0.0, a change that compares equal as a value."""
    g = torch.Generator().manual_seed(seed)
    for v in sd.values():
        b = bits(v).reshape(-1)
        is_bool = isinstance(v, torch.Tensor) and v.dtype == torch.bool
        mask = torch.rand(b.shape, generator=g) < rate
        b[mask] ^= 1 if is_bool else 0x21
        w = 8 * b.element_size()
        b[0] ^= 1 if is_bool else (0x80 if b.dtype == torch.uint8 else -(1 << (w - 1)))


class Deployment:
    """A Sender and n background Receivers over a temporary directory."""

    def __init__(self, state, n=2, **kw):
        self.tmp = tempfile.TemporaryDirectory(prefix="bitrefit-py-refit-")
        self.dir = self.tmp.name
        self.state = state
        self.sender = bitrefit.Sender(state, self.dir, receivers=n, deadline=kw.pop("deadline", 5.0), **kw)
        self.models = [zeros_like_state(state) for _ in range(n)]
        self.receivers = [bitrefit.Receiver(m, self.dir, index=i) for i, m in enumerate(self.models)]
        for r in self.receivers:
            r.start(background=True)
        assert self.sender.wait_for_receivers(30)
        for r in self.receivers:
            assert r.wait(self.sender.version, timeout=30)

    def close(self):
        for r in self.receivers:
            r.close()
        self.sender.close()
        self.tmp.cleanup()

    def exact(self):
        return all(same_bits(m, self.state) for m in self.models)

    def settle(self, version):
        for r in self.receivers:
            assert r.wait(version, timeout=30), r.stats()


@contextlib.contextmanager
def one_bf16_slot(rows, cols):
    """A trainer's one BF16 tensor, its Sender with one rollout slot, and that slot's zeroed model."""
    state = {"w": torch.randn(rows, cols).to(torch.bfloat16)}
    with tempfile.TemporaryDirectory() as dir_:
        with bitrefit.Sender(state, dir_, receivers=1) as s:
            yield state, dir_, s, {"w": torch.zeros(rows, cols, dtype=torch.bfloat16)}


class Refit(unittest.TestCase):
    def test_every_dtype_round_trips_bit_exactly(self):
        d = Deployment(model_state())
        try:
            self.assertTrue(d.exact())  # version 0 restored densely
            for step in (1, 2, 3):
                perturb(d.state, 0.05, step)
                st = d.sender.refit()
                self.assertTrue(st["committed"])
                self.assertEqual((st["version"], st["attempts"]), (step, 1))
                self.assertGreater(st["changed"], 0)
                d.settle(step)
                self.assertTrue(d.exact(), "receivers differ from the trainer after refit %d" % step)
                want = bitrefit.digest(d.state)["digest"]
                for r in d.receivers:
                    self.assertEqual(r.attest(), want)
                    self.assertEqual(r.stats()["attestation"], want)
        finally:
            d.close()

    def test_writes_in_place_into_the_models_parameters(self):
        torch.manual_seed(0)
        trainer = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8)).to(torch.bfloat16)
        export = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
        with tempfile.TemporaryDirectory() as dir_:
            with bitrefit.Sender(export, dir_, receivers=1) as s:
                rollout = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8)).to(torch.bfloat16)
                before = {k: p.data_ptr() for k, p in rollout.named_parameters()}
                with bitrefit.Receiver(rollout.state_dict(), dir_, index=0) as r:
                    r.start(background=True)
                    self.assertTrue(r.wait(0, timeout=30))
                    with torch.no_grad():
                        for p in trainer.parameters():
                            p.add_(torch.randn_like(p) * 0.01)
                    export = {k: v.detach().clone() for k, v in trainer.state_dict().items()}
                    st = s.refit(export)
                    self.assertTrue(r.wait(st["version"], timeout=30))
                    with r.serving():
                        after = dict(rollout.named_parameters())
                        for k, p in after.items():
                            self.assertEqual(p.data_ptr(), before[k], k)  # the same storage: no copy of the model
                            self.assertTrue(torch.equal(bits(p.detach()), bits(export[k])), k)
                        x = torch.randn(4, 64).to(torch.bfloat16)
                        self.assertTrue(torch.equal(rollout(x), trainer(x)))

    def test_bad_arguments_raise_clearly_and_change_nothing(self):
        state = {"w": torch.randn(16, 8).to(torch.bfloat16), "b": torch.randn(8)}
        d = Deployment(state, n=1)
        try:
            before = {k: v.clone() for k, v in d.models[0].items()}
            good = {k: v.clone() for k, v in state.items()}
            cases = [
                ({"w": good["w"].float(), "b": good["b"]}, bitrefit.MismatchError, "w", "dtype"),
                ({"w": good["w"].reshape(8, 16), "b": good["b"]}, bitrefit.MismatchError, "w", "shape"),
                ({"w": good["w"]}, bitrefit.MismatchError, "b", "name"),
                ({"w": good["w"], "b": good["b"], "extra": good["b"]}, bitrefit.MismatchError, "extra", "name"),
                ({"w": good["w"].t(), "b": good["b"]}, bitrefit.InvalidArgumentError, "w", "contiguous"),
                ({"w": good["w"][:, ::2], "b": good["b"]}, bitrefit.InvalidArgumentError, "w", "contiguous"),
                ({"w": torch.empty(16, 8, dtype=torch.bfloat16, device="meta"), "b": good["b"]}, bitrefit.UnsupportedError, "w", "device"),
                ({"w": [1.0, 2.0], "b": good["b"]}, bitrefit.InvalidArgumentError, "w", "type"),
                ({"w": good["w"], "b": torch.zeros(8, dtype=torch.complex64)}, bitrefit.UnsupportedError, "b", "dtype"),
                ({"w": good["w"], "b": np.zeros(8, dtype=">f4")}, bitrefit.UnsupportedError, "b", "dtype"),
                ({"w": bitrefit.with_dtype(good["w"], "F32"), "b": good["b"]}, bitrefit.InvalidArgumentError, "w", "dtype"),
                ({"w": good["w"], 3: good["b"]}, bitrefit.InvalidArgumentError, None, "name"),
            ]
            for sd, kind, tensor, field in cases:
                with self.subTest(field=field, tensor=tensor):
                    with self.assertRaises(kind) as cm:
                        d.sender.refit(sd)
                    e = cm.exception
                    self.assertEqual((e.tensor, e.field), (tensor, field), str(e))
                    self.assertIsInstance(e, ValueError)
                    self.assertEqual(d.sender.version, 0)
            with self.assertRaises(bitrefit.InvalidArgumentError):
                d.sender.refit("not a mapping")
            self.assertTrue(same_bits(d.models[0], before))
            self.assertEqual(d.receivers[0].stats()["applied"], 0)
            # Receivers: read-only memory, tied weights, a slot the Sender does not have, another model.
            ro = np.zeros((16, 8), dtype=np.uint16)
            ro.flags.writeable = False
            with self.assertRaises(bitrefit.InvalidArgumentError) as cm:
                bitrefit.Receiver({"w": bitrefit.with_dtype(ro, "BF16"), "b": torch.zeros(8)}, d.dir, index=0)
            self.assertEqual((cm.exception.tensor, cm.exception.field), ("w", "writable"))
            shared = torch.zeros(16, 8, dtype=torch.bfloat16)
            with self.assertRaises(bitrefit.InvalidArgumentError) as cm:
                bitrefit.Receiver({"w": shared, "b": shared.view(-1)[:16].view(torch.float32)}, d.dir, index=0)
            self.assertIn("share memory", str(cm.exception))
            with self.assertRaises(bitrefit.InvalidArgumentError) as cm:
                bitrefit.Receiver(zeros_like_state(state), d.dir, index=1)
            self.assertEqual(cm.exception.field, "index")
            with self.assertRaises(bitrefit.MismatchError) as cm:
                bitrefit.Receiver({"w": torch.zeros(16, 8), "b": torch.zeros(8)}, d.dir, index=0)
            self.assertEqual((cm.exception.tensor, cm.exception.field), ("w", "dtype"))
            with self.assertRaises(bitrefit.MismatchError):
                bitrefit.Receiver(zeros_like_state(state), d.dir, index=0, gate="async")
            # ...and the deployment still works.
            perturb(d.state, 0.2, 9)
            st = d.sender.refit()
            self.assertEqual(st["version"], 1)
            d.settle(1)
            self.assertTrue(d.exact())
        finally:
            d.close()

    def test_serving_gate_holds_refits_back_and_callbacks_come_in_order(self):
        with one_bf16_slot(64, 64) as (state, dir_, s, model):
            events = []
            r = bitrefit.Receiver(model, dir_, index=0, on_gate=lambda open_: events.append(("gate", open_)),
                                  on_commit=lambda v: events.append(("commit", v)))
            r.start(background=True)
            self.assertTrue(r.wait(0, timeout=30))
            events.clear()
            inside = threading.Event()
            seen = []
            leaving = []

            def request():
                with r.serving():
                    inside.set()
                    seen.append(model["w"].clone())
                    time.sleep(0.4)
                    seen.append(model["w"].clone())
                    leaving.append(time.monotonic())

            t = threading.Thread(target=request)
            t.start()
            inside.wait(10)
            state["w"].add_(1)
            st = s.refit()
            returned = time.monotonic()
            t.join()
            self.assertTrue(r.wait(1, timeout=30))
            self.assertTrue(torch.equal(bits(seen[0]), bits(seen[1])))  # no apply during the request
            self.assertGreater(returned, leaving[0])  # the refit waited for the request to leave
            self.assertTrue(torch.equal(bits(model["w"]), bits(state["w"])))
            self.assertEqual(events, [("gate", False), ("gate", True), ("commit", 1)])
            self.assertEqual(st["version"], 1)
            r.close()

    def test_wait_and_requests_see_a_version_only_after_its_commit_callback_returned(self):
        # A slow on_commit widens the window between the engine's two open-gate callbacks
        # (on_gate(True), then on_commit(v)): neither wait(v) nor a request may see v inside it.
        with one_bf16_slot(32, 32) as (state, dir_, s, model):
            events = []

            def on_commit(v):
                time.sleep(0.3)
                events.append(("commit", v))

            r = bitrefit.Receiver(model, dir_, index=0, on_gate=lambda open_: events.append(("gate", open_)),
                                  on_commit=on_commit)
            r.start(background=True)
            self.assertTrue(r.wait(0, timeout=30))
            self.assertEqual(events[-2:], [("gate", True), ("commit", 0)])
            state["w"].add_(1)
            s.refit()
            with r.serving(timeout=30):
                self.assertEqual(events[-3:], [("gate", False), ("gate", True), ("commit", 1)])
                self.assertTrue(torch.equal(bits(model["w"]), bits(state["w"])))
            self.assertTrue(r.wait(1, timeout=30))
            self.assertEqual(events[-1], ("commit", 1))
            r.close()

    def test_async_gate_drains_and_a_restarted_receiver_restores_and_rejoins(self):
        state = {"a": torch.randn(128, 32).to(torch.bfloat16), "b": torch.randn(7).to(torch.float16)}
        with tempfile.TemporaryDirectory() as dir_:
            with bitrefit.Sender(state, dir_, receivers=2, gate="async") as s:
                drained = []
                models = [zeros_like_state(state) for _ in range(2)]
                rs = [bitrefit.Receiver(models[0], dir_, index=0, drain=lambda: drained.append(1))]
                rs.append(bitrefit.Receiver(models[1], dir_, index=1))
                for r in rs:
                    r.start(background=True)
                self.assertTrue(s.wait_for_receivers(30))
                state["a"].mul_(1.5)
                st = s.refit()
                self.assertEqual((st["mode"], st["version"]), ("async", 1))
                for r in rs:
                    self.assertTrue(r.wait(1, timeout=30))
                self.assertTrue(all(same_bits(m, state) for m in models))
                self.assertEqual(drained, [1])
                # Receiver 1's process "restarts": a new Receiver over fresh (zeroed) tensors.
                rs[1].close()
                models[1] = zeros_like_state(state)
                rs[1] = bitrefit.Receiver(models[1], dir_, index=1)
                rs[1].start()  # foreground: wait() steps it
                self.assertTrue(rs[1].wait(1, timeout=30))
                self.assertTrue(same_bits(models[1], state))
                stats = rs[1].stats()
                self.assertEqual((stats["incarnation"], stats["restores"]), (2, 1))
                done = threading.Event()
                stepper = threading.Thread(target=lambda: (rs[1].wait(2, timeout=30), done.set()))
                stepper.start()
                state["b"].neg_()
                self.assertTrue(s.refit()["committed"])
                stepper.join()
                self.assertTrue(done.is_set())
                self.assertTrue(all(same_bits(m, state) for m in models))
                for r in rs:
                    r.close()

    def test_the_gil_is_released_while_cpp_works(self):
        """Another Python thread runs during refit() and digest(). The switch interval is made so
        long that the interpreter never takes the GIL from a thread by force within the test, and
        the counting thread gives it up after each count (sleep(0)): so it counts only while the
        caller has released the GIL, and a call that held it throughout sees no count at all."""
        state = {"w%d" % i: torch.randn(512, 1024).to(torch.bfloat16) for i in range(8)}  # 8 MiB
        d = Deployment(state, n=1)
        big = {"big": torch.ones(128 << 20, dtype=torch.uint8)}
        count, stop = [0], threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1
                time.sleep(0)

        interval = sys.getswitchinterval()
        sys.setswitchinterval(100.0)
        t = threading.Thread(target=spin)
        t.start()
        try:
            for name, call in [("digest", lambda: bitrefit.digest(big)), ("refit", d.sender.refit)]:
                for v in state.values():
                    v.add_(1)
                before = count[0]
                call()
                self.assertGreater(count[0] - before, 0, name + " held the GIL")
        finally:
            stop.set()
            sys.setswitchinterval(interval)
            t.join()
        try:
            d.settle(1)
            self.assertTrue(d.exact())
        finally:
            d.close()

    def test_a_restarted_sender_recovers_the_committed_version(self):
        state = {"w": torch.randn(32, 32).to(torch.bfloat16)}
        with tempfile.TemporaryDirectory() as dir_:
            s = bitrefit.Sender(state, dir_, receivers=1)
            model = zeros_like_state(state)
            r = bitrefit.Receiver(model, dir_, index=0)
            r.start(background=True)
            self.assertTrue(s.wait_for_receivers(30))
            state["w"].add_(0.5)
            s.refit()
            s.close()
            # A new trainer process: its state_dict is whatever it loaded; the committed version and
            # the baselines come from the deployment's durable files.
            s = bitrefit.Sender(zeros_like_state(state), dir_, receivers=1)
            self.assertEqual(s.version, 1)
            state["w"].add_(0.25)
            st = s.refit(state)
            self.assertEqual(st["version"], 2)
            self.assertTrue(r.wait(2, timeout=30))
            self.assertTrue(same_bits(model, state))
            with self.assertRaises(bitrefit.MismatchError):
                bitrefit.Sender({"w": torch.zeros(3)}, dir_, receivers=1)  # another model in this deployment
            r.close()
            s.close()


if __name__ == "__main__":
    unittest.main()
