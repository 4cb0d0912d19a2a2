#!/usr/bin/env python3
"""Independent safetensors writer and reader for bitrefit's io tests: only `struct` and `json`.

  safetensors_ref.py write OUTDIR   writes all_dtypes.safetensors, a 3-shard checkpoint in
                                    sharded/, and expected.json (every tensor's dtype, shape and
                                    bytes in hex, and the metadata), for the C++ reader to match.
  safetensors_ref.py dump PATH      reads a .safetensors file or a sharded directory written by the
                                    C++ writer and prints the same JSON shape on stdout.

Deliberately unlike the C++ writer: header keys are not sorted, the data section is laid out in
reverse name order, and __metadata__ comes last, so a reader that assumes any order fails.
"""
import json
import os
import struct
import sys

SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8,
         "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
PACK = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}

# Bit patterns that a value-based copy would mangle: -0.0, infinities, NaNs with payloads
# (quiet and signalling), subnormals, extremes.
SPECIAL = {
    "F16": [0x8000, 0x7C00, 0xFC00, 0x7E01, 0xFD55, 0x7C01, 0x0001, 0x03FF, 0x7BFF],
    "BF16": [0x8000, 0x7F80, 0xFF80, 0x7FC1, 0xFF81, 0x7F81, 0x0001, 0x007F, 0x7F7F],
    "F32": [0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x00000001, 0x007FFFFF],
    "F64": [0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000001,
            0x7FF0000000000001, 0x0000000000000001, 0x000FFFFFFFFFFFFF],
    "F8_E4M3": [0x80, 0x7F, 0xFF, 0x01, 0x07, 0x7E, 0xFE],
    "F8_E5M2": [0x80, 0x7C, 0xFC, 0x7D, 0x7F, 0xFE, 0x01, 0x03],
    "I64": [0x8000000000000000, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF],
    "U64": [0xFFFFFFFFFFFFFFFF, 0],
}


class Lcg:
    def __init__(self, seed):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self, bits):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return self.state >> (64 - bits)


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_bytes(dtype, shape, seed):
    size = SIZES[dtype]
    n = count(shape)
    rng = Lcg(seed)
    values = []
    for i in range(n):
        special = SPECIAL.get(dtype, [])
        if i < len(special):
            values.append(special[i])
        elif dtype == "BOOL":
            values.append(rng.next(1))
        else:
            values.append(rng.next(8 * size))
    return b"".join(struct.pack(PACK[size], v) for v in values)


def write_file(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, bytes)."""
    header = {}
    data = b""
    for name, dtype, shape, raw in sorted(tensors, key=lambda t: t[0], reverse=True):
        header[name] = {"shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)], "dtype": dtype}
        data += raw
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        assert end - b == count(e["shape"]) * SIZES[e["dtype"]], name
        tensors[name] = {"dtype": e["dtype"], "shape": e["shape"], "hex": data[b:end].hex()}
    return {"metadata": metadata, "tensors": tensors}


def describe(tensors, metadata):
    return {"metadata": metadata,
            "tensors": {n: {"dtype": d, "shape": list(s), "hex": r.hex()} for n, d, s, r in tensors}}


def cmd_write(out):
    os.makedirs(out, exist_ok=True)
    shapes = {"BOOL": [3, 5], "U8": [257], "I8": [2, 3, 4], "I16": [7], "U16": [1, 1, 9], "I32": [4, 4],
              "U32": [10], "I64": [3], "U64": [2, 2], "F16": [16], "BF16": [4, 8], "F32": [3, 7], "F64": [9],
              "F8_E4M3": [33], "F8_E5M2": [17]}
    tensors = []
    for seed, (dtype, shape) in enumerate(shapes.items()):
        tensors.append(("t." + dtype.lower(), dtype, shape, tensor_bytes(dtype, shape, seed + 1)))
    # 0-d tensors hold one element; empty tensors hold none and share their offset with a neighbour.
    tensors.append(("scalar.f32", "F32", [], tensor_bytes("F32", [], 100)))
    tensors.append(("scalar.bf16", "BF16", [], tensor_bytes("BF16", [], 101)))
    tensors.append(("empty.bf16", "BF16", [0], b""))
    tensors.append(("empty.f32", "F32", [4, 0, 2], b""))
    tensors.append(("empty.u8", "U8", [0], b""))
    meta = {"format": "pt", "written_by": "safetensors_ref.py"}
    write_file(os.path.join(out, "all_dtypes.safetensors"), tensors, meta)

    # A Hugging Face style sharded checkpoint: three shards and model.safetensors.index.json.
    layers = [
        ("model.embed_tokens.weight", "BF16", [32, 8]),
        ("model.layers.0.mlp.down_proj.weight", "BF16", [8, 16]),
        ("model.layers.0.mlp.up_proj.weight", "BF16", [16, 8]),
        ("model.layers.0.input_layernorm.weight", "F32", [8]),
        ("model.layers.1.mlp.down_proj.weight", "F8_E4M3", [8, 16]),
        ("model.layers.1.mlp.down_proj.weight_scale_inv", "F32", [1, 1]),
        ("model.layers.1.step", "I64", []),
        ("model.layers.1.unused", "F16", [0, 3]),
        ("lm_head.weight", "BF16", [32, 8]),
    ]
    sharded = [(n, d, s, tensor_bytes(d, s, 200 + i)) for i, (n, d, s) in enumerate(layers)]
    groups = [sharded[0:3], sharded[3:7], sharded[7:]]
    sdir = os.path.join(out, "sharded")
    os.makedirs(sdir, exist_ok=True)
    shard_meta = {"format": "pt"}
    weight_map = {}
    for i, group in enumerate(groups):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(groups))
        write_file(os.path.join(sdir, name), group, shard_meta)
        for t in group:
            weight_map[t[0]] = name
    total = sum(len(t[3]) for t in sharded)
    with open(os.path.join(sdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)

    expected = {"all_dtypes.safetensors": describe(tensors, meta), "sharded": describe(sharded, shard_meta)}
    expected["sharded"]["total_size"] = total
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def cmd_dump(path):
    if os.path.isdir(path):
        with open(os.path.join(path, "model.safetensors.index.json")) as f:
            index = json.load(f)
        result = {"metadata": None, "tensors": {}}
        for shard in sorted(set(index["weight_map"].values())):
            part = read_file(os.path.join(path, shard))
            if result["metadata"] is None:
                result["metadata"] = part["metadata"]
            for name, t in part["tensors"].items():
                assert index["weight_map"][name] == shard, name
                assert name not in result["tensors"], name
                result["tensors"][name] = t
        result["total_size"] = index["metadata"]["total_size"]
    else:
        result = read_file(path)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        cmd_write(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "dump":
        cmd_dump(sys.argv[2])
    else:
        sys.exit(__doc__)
