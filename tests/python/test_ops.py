"""bitrefit.stat/diff/apply/verify/digest from Python (label python).

Checkpoints are written and read back by tests/io/safetensors_ref.py, the independent struct+json
implementation, so a result is checked against code that shares nothing with the library. Every
dtype a checkpoint carries is covered, with -0.0, NaN payloads, infinities and subnormals first.
"""
import json
import os
import pathlib
import struct
import sys
import tempfile
import unittest

import numpy as np

import bitrefit

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "io"))
import safetensors_ref as ref  # noqa: E402

SHAPES = {"BOOL": [3, 5], "U8": [257], "I8": [2, 3, 4], "I16": [7], "U16": [1, 1, 9], "I32": [4, 4], "U32": [10],
          "I64": [3], "U64": [2, 2], "F16": [16], "BF16": [4, 8], "F32": [3, 7], "F64": [9], "F8_E4M3": [33],
          "F8_E5M2": [17]}
NUMPY = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16, "I32": np.int32,
         "U32": np.uint32, "I64": np.int64, "U64": np.uint64, "F16": np.float16, "F32": np.float32,
         "F64": np.float64}
# numpy has no bfloat16 or float8: their bits travel in same-size unsigned arrays, declared.
RAW = {"BF16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}


def version0():
    return [("t." + d.lower(), d, s, ref.tensor_bytes(d, s, i + 1)) for i, (d, s) in enumerate(SHAPES.items())]


def changed(tensors, every=3):
    """Every `every`-th element of each tensor gets new bits (BOOL: flipped)."""
    out, flips = [], 0
    for name, d, shape, raw in tensors:
        size = ref.SIZES[d]
        b = bytearray(raw)
        for i in range(0, len(b) // size, every):
            if d == "BOOL":
                b[i] ^= 1
            else:
                b[i * size] ^= 0x5A
            flips += 1
        out.append((name, d, shape, bytes(b)))
    return out, flips


def as_arrays(tensors):
    """The same bits as numpy arrays (bf16/float8 through bitrefit.with_dtype)."""
    m = {}
    for name, d, shape, raw in tensors:
        if d in RAW:
            m[name] = bitrefit.with_dtype(np.frombuffer(raw, dtype=RAW[d]).reshape(shape), d)
        else:
            m[name] = np.frombuffer(raw, dtype=NUMPY[d]).reshape(shape)
    return m


class Ops(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="bitrefit-py-ops-")
        self.dir = pathlib.Path(self.tmp.name)
        self.v0 = version0()
        self.v1, self.flips = changed(self.v0)
        self.p0, self.p1 = self.dir / "v0.safetensors", self.dir / "v1.safetensors"
        ref.write_file(self.p0, self.v0, {"format": "pt"})
        ref.write_file(self.p1, self.v1, {"format": "pt"})

    def tearDown(self):
        self.tmp.cleanup()

    def test_round_trip_every_dtype(self):
        st = bitrefit.stat(self.p0, self.p1)
        self.assertFalse(st["equal"])
        self.assertEqual(st["total"]["changed"], self.flips)
        self.assertEqual(sorted(t["dtype"] for t in st["tensors"]), sorted(SHAPES))
        for t in st["tensors"]:
            self.assertEqual(t["changed"], -(-t["elements"] // 3), t["name"])
        delta = self.dir / "d.brd"
        d = bitrefit.diff(str(self.p0), str(self.p1), delta)
        self.assertEqual(d["changed"], self.flips)
        self.assertEqual(d["delta"], str(delta))
        out = self.dir / "out.safetensors"
        a = bitrefit.apply(self.p0, delta, out)
        self.assertEqual(a["changed"], self.flips)
        self.assertEqual(a["target_digest"], d["target_digest"])
        # The independent reader sees exactly v1's bits.
        got = ref.read_file(out)["tensors"]
        for name, dt, shape, raw in self.v1:
            self.assertEqual(got[name], {"dtype": dt, "shape": shape, "hex": raw.hex()}, name)
        self.assertTrue(bitrefit.verify(out, self.p1)["equal"])
        self.assertEqual(bitrefit.digest(out)["digest"], d["target_digest"])
        # An in-memory mapping with the same bits digests the same (numpy, every dtype).
        self.assertEqual(bitrefit.digest(as_arrays(self.v1))["digest"], d["target_digest"])
        self.assertEqual(bitrefit.digest(as_arrays(self.v0))["digest"], d["base_digest"])

    def test_overwrite_mode_and_directory_bundle_and_in_place(self):
        delta = str(self.dir / "bundle") + "/"
        d = bitrefit.diff(self.p0, self.p1, delta, mode="overwrite")
        self.assertTrue(os.path.isfile(os.path.join(d["delta"], "manifest.json")))
        a = bitrefit.apply(self.p0, d["delta"], in_place=True)
        self.assertEqual(a["frames"], d["frames"])
        self.assertTrue(bitrefit.verify(self.p0, self.p1)["equal"])

    def test_verify_names_the_differences(self):
        v = bitrefit.verify(self.p0, self.p1, limit=2)
        self.assertFalse(v["equal"])
        self.assertEqual(v["differing_tensors"], len(SHAPES))
        self.assertEqual(len(v["differences"]), 2)
        first = v["differences"][0]
        self.assertEqual(first["reason"], "bits")
        self.assertEqual(first["first_indices"], [0, 3])

    def test_errors_carry_errc_file_tensor_field(self):
        # A safetensors rule broken: two tensors share bytes.
        bad = self.dir / "overlap.safetensors"
        header = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
        text = json.dumps(header).encode()
        bad.write_bytes(struct.pack("<Q", len(text)) + text + bytes(12))
        with self.assertRaises(bitrefit.FormatError) as cm:
            bitrefit.digest(bad)
        e = cm.exception
        self.assertIsInstance(e, bitrefit.Error)
        self.assertIsInstance(e, ValueError)
        self.assertEqual((e.errc, e.problem, e.file), ("format", "offsets_overlap", str(bad)))
        self.assertIn(e.tensor, ("a", "b"))
        self.assertIn("offsets_overlap", str(e))

        missing = self.dir / "nope.safetensors"
        with self.assertRaises(bitrefit.IoError) as cm:
            bitrefit.stat(missing, self.p1)
        self.assertIsInstance(cm.exception, OSError)
        self.assertEqual((cm.exception.errc, cm.exception.file), ("io", str(missing)))

        with self.assertRaises(bitrefit.InvalidArgumentError) as cm:
            bitrefit.diff(self.p0, self.p1, self.dir / "x.brd", mode="bogus")
        self.assertEqual(cm.exception.field, "mode")
        with self.assertRaises(bitrefit.InvalidArgumentError):
            bitrefit.apply(self.p0, self.dir / "x.brd")  # neither out nor in_place

    def test_apply_refuses_other_base_and_damaged_delta_writing_nothing(self):
        delta = self.dir / "d.brd"
        bitrefit.diff(self.p0, self.p1, delta)
        out = self.dir / "out.safetensors"
        with self.assertRaises(bitrefit.MismatchError) as cm:
            bitrefit.apply(self.p1, delta, out)  # v1 is not the delta's base
        self.assertEqual(cm.exception.errc, "mismatch")
        self.assertFalse(out.exists())
        raw = bytearray(delta.read_bytes())
        raw[-20] ^= 0xFF  # inside the last frame
        delta.write_bytes(bytes(raw))
        with self.assertRaises(bitrefit.IntegrityError) as cm:
            bitrefit.apply(self.p0, delta, out)
        self.assertEqual(cm.exception.errc, "integrity")
        self.assertFalse(out.exists())
        self.assertEqual([p.name for p in self.dir.iterdir() if p.name.startswith(".")], [])  # no temp litter

    def test_progress_reports_phases_and_a_raising_callback_aborts(self):
        seen = []
        bitrefit.diff(self.p0, self.p1, self.dir / "d.brd", progress=lambda *a: seen.append(a))
        phases = [p for p, _, _ in seen]
        self.assertIn("read", phases)
        self.assertIn("encode", phases)
        for p, done, total in seen:
            self.assertLessEqual(done, total, p)
        self.assertEqual(seen[-1][1], seen[-1][2])

        class Stop(Exception):
            pass

        def stop(phase, done, total):
            if phase == "copy":  # apply streams: copy BASE to a staged output, patch it, rename
                raise Stop()

        out = self.dir / "out.safetensors"
        with self.assertRaises(Stop):
            bitrefit.apply(self.p0, self.dir / "d.brd", out, progress=stop)
        self.assertFalse(out.exists())
        self.assertEqual([p.name for p in self.dir.iterdir() if p.name.startswith(".")], [])  # the staged copy is gone

    def test_sharded_and_single_file_digest_alike(self):
        sharded = self.dir / "sharded"
        sharded.mkdir()
        names = []
        for i, group in enumerate([self.v1[:5], self.v1[5:]]):
            name = "model-%05d-of-00002.safetensors" % (i + 1)
            ref.write_file(sharded / name, group, {"format": "pt"})
            names += [(t[0], name) for t in group]
        (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": dict(names)}))
        self.assertEqual(bitrefit.digest(sharded)["digest"], bitrefit.digest(self.p1)["digest"])
        self.assertEqual(bitrefit.digest(sharded)["tensors"], len(SHAPES))


if __name__ == "__main__":
    unittest.main()
