"""A tensor-parallel llama forward pass in numpy, over the shard writer's GGUFs and the
exchange's mesh: the oracle the engine's lockstep path will be checked against.

`Weights(path)` dequantizes a llama GGUF (a whole model or a shard: each declares its own head
counts and FFN length); `forward(weights, tokens, exchange)` runs the prompt through every
layer, causal, with llama's RMS norms, RoPE (llama.cpp's normal mode: adjacent pairs, which the
GGUF's permuted q/k rows expect), grouped-query attention and SwiGLU, and returns the last
token's logits. `exchange(partial)` is applied to each layer's attention output and FFN output
before its residual add: the identity for a whole model, an all-reduce over the mesh for a
shard (2 x layers exchanges a token; the vocabulary projection is whole on every node).
"""
from __future__ import annotations

import gguf
import numpy as np
from gguf.quants import dequantize

from stackd.cluster import shard


class Weights:
    def __init__(self, path: str):
        reader = gguf.GGUFReader(path, "r")
        self.hp = shard.hparams_of(reader)
        arch = self.hp.arch
        self.eps = float(reader.get_field(f"{arch}.attention.layer_norm_rms_epsilon").contents())
        self.rope_base = float(reader.get_field(f"{arch}.rope.freq_base").contents())
        self.t = {}
        for tensor in reader.tensors:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            shape = [int(d) for d in tensor.shape][::-1]
            self.t[tensor.name] = values.reshape(shape)
        self.output = self.t.get("output.weight", self.t["token_embd.weight"])


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: np.ndarray, base: float) -> np.ndarray:
    """x: (tokens, heads, head_dim) at positions 0..tokens-1; pairs (2i, 2i+1) rotated."""
    n_tok, _, d = x.shape
    theta = np.arange(n_tok, dtype=np.float64)[:, None] * base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    cos, sin = np.cos(theta)[:, None, :].astype(np.float32), np.sin(theta)[:, None, :].astype(np.float32)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def forward(w: Weights, tokens: list[int], exchange=lambda partial: partial) -> np.ndarray:
    hp, t = w.hp, w.t
    d = hp.head_dim
    x = t["token_embd.weight"][tokens].copy()
    n_tok = len(tokens)
    mask = np.triu(np.full((n_tok, n_tok), -np.inf, dtype=np.float32), 1)
    for layer in range(hp.n_layer):
        p = f"blk.{layer}."
        h = rms_norm(x, t[p + "attn_norm.weight"], w.eps)
        q = rope((h @ t[p + "attn_q.weight"].T).reshape(n_tok, hp.n_head, d), w.rope_base)
        k = rope((h @ t[p + "attn_k.weight"].T).reshape(n_tok, hp.n_head_kv, d), w.rope_base)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n_tok, hp.n_head_kv, d)
        heads = np.empty((n_tok, hp.n_head, d), dtype=np.float32)
        for head in range(hp.n_head):
            g = head // hp.gqa
            scores = (q[:, head] @ k[:, g].T) / np.float32(np.sqrt(d)) + mask
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
            heads[:, head] = (e / e.sum(axis=1, keepdims=True)) @ v[:, g]
        x = x + exchange(heads.reshape(n_tok, -1) @ t[p + "attn_output.weight"].T)
        h = rms_norm(x, t[p + "ffn_norm.weight"], w.eps)
        gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        x = x + exchange((gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T)
    return rms_norm(x[-1], t["output_norm.weight"], w.eps) @ w.output.T


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max()
    return z - np.log(np.exp(z).sum())
