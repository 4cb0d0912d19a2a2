#!/usr/bin/python3
"""Writes a chain of BF16 checkpoints from a real PyTorch AdamW run, for `bitrefit stat`.

    /usr/bin/python3 bench/codec/torch_adamw_pair.py OUTDIR [--steps 4] [--lr 1e-5] [--seed 0]

A small Llama-shaped decoder (token embedding, 4 blocks of attention + gated MLP with RMSNorm,
LM head; about 6 M parameters) is trained with torch.optim.AdamW on FP32 master weights with
random token batches (next-token loss), and after every step the weights are exported as BF16
(round to nearest even, PyTorch's cast) to OUTDIR/v<k>.safetensors (v0 = initialisation). The
safetensors files are written here by hand (header JSON + little-endian bytes), so only Debian's
python3-torch and python3-numpy are needed (optional packages: benches only, not the build).
Deterministic for a given seed on one machine (PyTorch CPU kernels), not across machines.
"""
import argparse
import json
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    def __init__(self, d, heads, inter):
        super().__init__()
        self.heads = heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        # causal attention, written out (torch 1.13 has no scaled_dot_product_attention)
        w = (q @ k.transpose(-1, -2)) / (d // self.heads) ** 0.5
        w = w.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        a = (w @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Model(nn.Module):
    def __init__(self, vocab=4096, d=256, layers=4, heads=8, inter=688):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(d, heads, inter) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for blk in self.layers:
            x = blk(x)
        return self.lm_head(self.norm(x))


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().to(torch.bfloat16).contiguous()
        data = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    os.makedirs(a.out, exist_ok=True)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), weight_decay=0.0)
    names = dict(model.named_parameters())
    n = sum(p.numel() for p in model.parameters())
    write_safetensors(os.path.join(a.out, "v0.safetensors"), names)
    for step in range(1, a.steps + 1):
        ids = torch.randint(0, 4096, (8, 129))
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        write_safetensors(os.path.join(a.out, f"v{step}.safetensors"), names)
        print(f"step {step}: loss {loss.item():.4f}, {n} parameters")


if __name__ == "__main__":
    main()
