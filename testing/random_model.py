"""A 1B-class model for speed measurements only: Llama-3.2-1B's shape (16 layers, 2,048 wide,
32 query heads over 8 KV heads of 64, an FFN of 8,192, tied embeddings) with random weights,
quantized to Q4_0, and the default chat model's vocabulary and chat template (so it tokenizes
and renders like SmolLM2; its vocabulary of 49,152 stands in for Llama 3's 128,256, which
keeps the file at about 0.6 GB). Its answers are noise; its steps cost what a 1B model's do.

    python -m testing.random_model          # prints the file's path, making it if needed

The weights come from a fixed seed, so the file is the same bytes every time; it is cached
under build/models/.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from stackd.store import defaults

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the checkout
SHAPE = {"embedding_length": 2048, "block_count": 16, "feed_forward_length": 8192,
         "attention.head_count": 32, "attention.head_count_kv": 8, "attention.key_length": 64,
         "attention.value_length": 64, "rope.dimension_count": 64}
ROPE_BASE = 500000.0
SEED = 1234
SCALE = 0.02                       # weights ~ N(0, SCALE): activations stay finite over 16 layers
NAME = "random-llama-1b-q4_0.gguf"


def path() -> str:
    return os.path.join(ROOT, "build", "models", NAME)


def random_model() -> str:
    """The file's path, written first if it is not there."""
    out = path()
    if not os.path.exists(out):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        write(defaults.smollm2_path(), out)
    return out


def write(source: str, out: str) -> None:
    import gguf
    from gguf.quants import quantize
    reader = gguf.GGUFReader(source, "r")
    arch = reader.get_field("general.architecture").contents()
    n_vocab = len(reader.get_field("tokenizer.ggml.tokens").data)
    temporary = f"{out}.{os.getpid()}.partial"
    writer = gguf.GGUFWriter(temporary, arch=arch)
    changed = {f"{arch}.{key}": value for key, value in SHAPE.items()}
    changed[f"{arch}.rope.freq_base"] = ROPE_BASE
    for field in reader.fields.values():
        if (field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.NAME) or field.name.startswith("GGUF.")
                or field.name in changed):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for name, value in changed.items():
        kind = gguf.GGUFValueType.FLOAT32 if isinstance(value, float) else gguf.GGUFValueType.UINT32
        writer.add_key_value(name, value, kind)
    writer.add_name("random Llama-3.2-1B shape (speed only)")
    rng = np.random.default_rng(SEED)
    n_embd, n_ff = SHAPE["embedding_length"], SHAPE["feed_forward_length"]
    n_head_kv, head = SHAPE["attention.head_count_kv"], SHAPE["attention.key_length"]
    n_q = SHAPE["attention.head_count"] * head
    tensors = [("token_embd.weight", (n_vocab, n_embd)), ("output_norm.weight", (n_embd,))]
    for i in range(SHAPE["block_count"]):
        tensors += [(f"blk.{i}.attn_norm.weight", (n_embd,)), (f"blk.{i}.attn_q.weight", (n_q, n_embd)),
                    (f"blk.{i}.attn_k.weight", (n_head_kv * head, n_embd)),
                    (f"blk.{i}.attn_v.weight", (n_head_kv * head, n_embd)),
                    (f"blk.{i}.attn_output.weight", (n_embd, n_q)), (f"blk.{i}.ffn_norm.weight", (n_embd,)),
                    (f"blk.{i}.ffn_gate.weight", (n_ff, n_embd)), (f"blk.{i}.ffn_up.weight", (n_ff, n_embd)),
                    (f"blk.{i}.ffn_down.weight", (n_embd, n_ff))]
    data = []
    for name, shape in tensors:
        if len(shape) == 1:
            data.append((name, np.ones(shape, dtype=np.float32), gguf.GGMLQuantizationType.F32))
        else:
            weights = rng.standard_normal(shape, dtype=np.float32) * SCALE
            data.append((name, quantize(weights, gguf.GGMLQuantizationType.Q4_0), gguf.GGMLQuantizationType.Q4_0))
    for name, array, kind in data:
        writer.add_tensor(name, array, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(temporary, out)


if __name__ == "__main__":
    print(random_model())
    sys.stdout.flush()
