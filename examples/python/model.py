"""A small Llama-shaped decoder in plain PyTorch, with Hugging Face Llama tensor names.

RMSNorm, rotary position embeddings, grouped-query attention, SwiGLU MLP, untied lm_head: the
parameter names are those of transformers' LlamaForCausalLM (model.embed_tokens.weight,
model.layers.N.self_attn.q_proj.weight, ..., lm_head.weight), i.e. the canonical names a refit
speaks. Byte-level vocabulary (256) so the example needs no tokenizer. Greedy generation
recomputes the whole sequence each step (no KV cache): small and obviously deterministic.
"""
import dataclasses
import json
import math

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    vocab: int = 256
    hidden: int = 128
    intermediate: int = 344
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    max_seq: int = 128
    rope_theta: float = 10000.0

    def to_json(self):
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text):
        return Config(**json.loads(text))


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotary(x, theta):
    """Rotary embedding over the last dim of x: [batch, heads, seq, head_dim] (computed, not stored:
    the model's state_dict holds only the parameters a checkpoint holds)."""
    _, _, seq, dim = x.shape
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.head_dim = c.hidden // c.heads
        self.q_proj = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.c.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.c.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.c.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotary(q, self.c.rope_theta), rotary(k, self.c.rope_theta)
        group = self.c.heads // self.c.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).float().softmax(-1).to(q.dtype)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.intermediate, bias=False)
        self.down_proj = nn.Linear(c.intermediate, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden)
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab, c.hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = RMSNorm(c.hidden)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.model = Decoder(c)
        self.lm_head = nn.Linear(c.hidden, c.vocab, bias=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids):
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


@torch.no_grad()
def generate(model, prompts, new_tokens):
    """Greedy decoding: for each prompt (a list of token ids), `new_tokens` argmax continuations."""
    out = []
    for p in prompts:
        ids = torch.tensor([p], dtype=torch.long)
        for _ in range(new_tokens):
            logits = model(ids[:, -model.config.max_seq:])[0, -1]
            ids = torch.cat([ids, logits.float().argmax().view(1, 1)], dim=1)
        out.append(ids[0, len(p):].tolist())
    return out


def encode(text):
    return list(text.encode("utf-8"))


def decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")
