"""A tiny GGUF that passes every check a model must pass to enter the store (structure,
vocabulary rules, a vocab-only load by llama.cpp), without being a usable network."""
from __future__ import annotations

import gguf
import numpy as np

WORDS = ["▁hello", "▁world", "▁the", "▁a", "ing", "ed", "▁stack", "▁model"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]   # SPM's fallback for any other byte


def vocabulary(words=WORDS) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", *BYTE_TOKENS, *words]
    types = [2, 3, 3, *[6] * len(BYTE_TOKENS), *[1] * len(words)]   # unknown, control, byte, normal
    scores = [0.0] * (3 + len(BYTE_TOKENS)) + [-float(i) for i in range(len(words))]
    return tokens, scores, types


def write_tiny(path, *, rows: int = 16, tokens: list[str] | None = None, arch: str = "llama",
               context_length: int = 256) -> str:
    """A llama-architecture GGUF with an SPM vocabulary; `tokens` overrides the vocabulary."""
    default_tokens, scores, types = vocabulary()
    tokens = default_tokens if tokens is None else tokens
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context_length)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores[:len(tokens)] + [0.0] * (len(tokens) - len(scores)))
    writer.add_token_types(types[:len(tokens)] + [1] * (len(tokens) - len(types)))
    writer.add_tensor("token_embd.weight", np.ones((rows, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
