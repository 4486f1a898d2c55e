"""Tensor-parallel shards of a model: for each node of a tensor split, a GGUF of its slice.

Megatron's cuts, so that each layer needs two exchanges (after the attention's output
projection and after the FFN's down projection) and nothing else:

    attn_q, attn_k, attn_v    by output rows, on whole KV-head groups (a group: one K head, one V
                              head and the n_head / n_head_kv query heads that read them)
    attn_output               by input columns, the same groups' query heads (block-aligned: a
                              head is 64 columns, a quant block 32)
    ffn_gate, ffn_up          by output rows
    ffn_down                  by input columns, the same rows of the FFN, cut on its quant
                              blocks' boundaries
    everything else           whole: the norms, the token embeddings, the output matrix (the
                              vocabulary projection is cut in a later step), rope factors

Each node's attention output and FFN output is then a partial sum: the sum over the nodes, in
node order, is the whole layer's (tests/cluster/test_shard.py checks it on dequantized weights).
A shard alone is a valid, smaller llama model: its head counts, `feed_forward_length` and the
key / value lengths are set to its slice (the key and value lengths explicitly: llama.cpp would
otherwise take embedding_length / head_count, which a slice of the heads changes), so llama.cpp
loads it as it is, unpatched.

Uneven cuts follow compute, each half of a layer on its own: `plan_cuts(weights=...)` gives
each node its share of the attention's KV groups and, separately, its share of the FFN rows.
The two halves are not traded against each other, because each ends in an exchange every node
waits at: a node with more attention and less FFN would first hold the others at the attention's
exchange, then wait for them at the FFN's. KV groups are whole, so they go by the largest
remainder; the FFN rows in blocks of ffn_down's run in our kernels' chunked form (`ffn_block_of`:
256, 512 or 1,024, so that a split sums as one node; else the down projection's quant block):
two equal nodes on SmolLM2 take 768 and 768 of the 1,536 rows. A group or block two nodes want equally goes to the later
node: the leader samples and serves the clients besides (SmolLM2's 3 groups over two equal nodes:
1 to the leader, 2 to the follower).
PLAN_VERSION names this rule in the shard cache, so a shard cut by an earlier rule is never
paired with one cut by this.

Shards are deterministic: the same model and plan give the same bytes (same sha256), so a
follower can cut its own from the file it holds, or check the one the leader sends.

    python -m stackd.cluster.shard MODEL.gguf OUT_DIR [--weights 1,1]
"""
from __future__ import annotations

import argparse
import math
import os
import threading
from dataclasses import dataclass

import numpy as np

from ..engine import accel

ARCHITECTURES = ("llama",)        # the cuts below follow llama's tensor names and GQA layout
# Tensors of a block cut by output rows (what an attention group or FFN row produces) or input
# columns (what they consume), by the suffix of their name.
ROWS_BY_HEAD = {"attn_q.weight": "q", "attn_k.weight": "kv", "attn_v.weight": "kv",
                "attn_q.bias": "q", "attn_k.bias": "kv", "attn_v.bias": "kv"}
COLUMNS_BY_HEAD = {"attn_output.weight"}
ROWS_BY_FFN = {"ffn_gate.weight", "ffn_up.weight"}
COLUMNS_BY_FFN = {"ffn_down.weight"}
PLAN_VERSION = 3                  # plan_cuts' rule (2: attention and FFN balanced each on its own;
                                  # 3: the FFN on ffn_down's runs, ffn_block_of)
SHARD_KEYS = "stackd.shard"       # metadata this module adds: index, count, kv groups, ffn rows, and
                                  # the whole model's attention-output and FFN widths (runs_of)


class ShardError(ValueError):
    """The model cannot be cut so (architecture, shapes, more nodes than KV groups)."""


@dataclass(frozen=True)
class Hparams:
    arch: str
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int
    n_layer: int

    @property
    def gqa(self) -> int:
        return self.n_head // self.n_head_kv


@dataclass(frozen=True)
class Cut:
    """One node's slice: KV groups [g0, g1) and FFN rows [f0, f1)."""
    index: int
    groups: tuple[int, int]
    ffn: tuple[int, int]

    def q_rows(self, hp: Hparams) -> tuple[int, int]:
        step = hp.gqa * hp.head_dim
        return self.groups[0] * step, self.groups[1] * step

    def kv_rows(self, hp: Hparams) -> tuple[int, int]:
        return self.groups[0] * hp.head_dim, self.groups[1] * hp.head_dim

    @property
    def n_groups(self) -> int:
        return self.groups[1] - self.groups[0]

    @property
    def n_ff(self) -> int:
        return self.ffn[1] - self.ffn[0]


def hparams_of(reader) -> Hparams:
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise ShardError(f"a tensor split cuts llama-architecture models; this one is '{arch}'")
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(_field(reader, f"{arch}.attention.key_length", n_embd // n_head))
    if int(_field(reader, f"{arch}.attention.value_length", head_dim)) != head_dim:
        raise ShardError("key and value heads of different lengths are not cut")
    if n_head % n_head_kv:
        raise ShardError(f"{n_head} query heads do not divide into {n_head_kv} KV groups")
    return Hparams(arch, n_embd, n_head, n_head_kv, int(_field(reader, f"{arch}.feed_forward_length")),
                   head_dim, int(_field(reader, f"{arch}.block_count")))


def plan_cuts(hp: Hparams, weights: list[float], ffn_block: int) -> list[Cut]:
    """Each node's groups and FFN rows, in node order, in proportion to `weights` (compute)."""
    n = len(weights)
    if n < 1 or any(not w > 0 for w in weights):
        raise ShardError("every node of a tensor split needs a positive weight")
    if n > hp.n_head_kv:
        raise ShardError(f"the model has {hp.n_head_kv} KV-head groups: at most {hp.n_head_kv} nodes")
    if hp.n_ff % ffn_block or hp.n_ff // ffn_block < n:
        raise ShardError(f"feed_forward_length {hp.n_ff} does not cut into {n} parts of {ffn_block}-row blocks")
    share = [w / sum(weights) for w in weights]
    groups = _largest_remainder([s * hp.n_head_kv for s in share], hp.n_head_kv, 1, ties_to_last=True)
    blocks = _largest_remainder([s * hp.n_ff / ffn_block for s in share], hp.n_ff // ffn_block, 1, ties_to_last=True)
    cuts, g0, f0 = [], 0, 0
    for i, (g, b) in enumerate(zip(groups, blocks)):
        cuts.append(Cut(i, (g0, g0 + g), (f0, f0 + b * ffn_block)))
        g0, f0 = g0 + g, f0 + b * ffn_block
    return cuts


def _largest_remainder(want: list[float], total: int, least: int, ties_to_last: bool = False) -> list[int]:
    """Integers near `want` that add up to `total`, each at least `least`; a unit two nodes want
    equally goes to the earlier one, or with `ties_to_last` the later one."""
    scale = total / sum(want) if sum(want) > 0 else 0.0
    want = [w * scale for w in want] if scale else [total / len(want)] * len(want)
    out = [max(least, int(w)) for w in want]
    order = 1 if ties_to_last else -1
    while sum(out) < total:
        i = max(range(len(out)), key=lambda k: (round(want[k] - out[k], 9), order * k))
        out[i] += 1
    while sum(out) > total:
        i = max((k for k in range(len(out)) if out[k] > least), key=lambda k: (round(out[k] - want[k], 9), -order * k))
        out[i] -= 1
    return out


# ---- cutting tensors ------------------------------------------------------------------------------

def _block_of(tensor) -> tuple[int, int]:
    """(elements, bytes) of one quant block of the tensor's type."""
    import gguf
    return gguf.GGML_QUANT_SIZES[tensor.tensor_type]


def _columns(tensor, c0: int, c1: int) -> np.ndarray:
    block, size = _block_of(tensor)
    if c0 % block or c1 % block:
        raise ShardError(f"{tensor.name}: columns {c0}-{c1} are not on its {block}-element blocks")
    return tensor.data[:, c0 // block * size:c1 // block * size]


def slice_of(tensor, cut: Cut, hp: Hparams) -> np.ndarray:
    """The node's part of one tensor, as the raw (quantized) rows the file stores."""
    name = tensor.name.split(".", 2)[-1] if tensor.name.startswith("blk.") else ""
    data = tensor.data
    if name in ROWS_BY_HEAD:
        r0, r1 = cut.q_rows(hp) if ROWS_BY_HEAD[name] == "q" else cut.kv_rows(hp)
        return data[r0:r1]
    if name in COLUMNS_BY_HEAD:
        return _columns(tensor, *cut.q_rows(hp))
    if name in ROWS_BY_FFN:
        return data[cut.ffn[0]:cut.ffn[1]]
    if name in COLUMNS_BY_FFN:
        return _columns(tensor, *cut.ffn)
    return data


def ffn_block_of(reader) -> int:
    """The step of the FFN's cut: ffn_down's run in our kernels' chunked form where the FFN
    divides into it (accel.ffn_chunk_columns: 256 for SmolLM2, 1,024 for a 1B-class model),
    else the down projections' quant block (their columns are cut), at least 32 (the gate and
    up projections' rows, cut there too, stay in whole kernel tiles). On whole runs, every
    node's share of ffn_down adds exactly what one node adds (kernels/src/kernels.h, GemmOut;
    docs/cluster.md, "Answers")."""
    block = 32
    for tensor in reader.tensors:
        if tensor.name.endswith("ffn_down.weight"):
            block = max(block, _block_of(tensor)[0])
    n_ff = hparams_of(reader).n_ff
    step = math.lcm(block, accel.ffn_chunk_columns(n_ff))
    return step if n_ff % step == 0 else block


# ---- writing ------------------------------------------------------------------------------------

def write_shard(reader, hp: Hparams, cuts: list[Cut], index: int, path: str) -> str:
    """Node `index`'s GGUF at `path` (written to a temporary name, then renamed)."""
    import gguf
    cut = cuts[index]
    arch = hp.arch
    changed = {
        f"{arch}.attention.head_count": (cut.n_groups * hp.gqa, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (cut.n_groups, gguf.GGUFValueType.UINT32),
        f"{arch}.feed_forward_length": (cut.n_ff, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.key_length": (hp.head_dim, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.value_length": (hp.head_dim, gguf.GGUFValueType.UINT32),
    }
    added = {
        f"{SHARD_KEYS}.index": (index, gguf.GGUFValueType.UINT32),
        f"{SHARD_KEYS}.count": (len(cuts), gguf.GGUFValueType.UINT32),
        f"{SHARD_KEYS}.kv_groups": ([c.n_groups for c in cuts], gguf.GGUFValueType.ARRAY),
        f"{SHARD_KEYS}.ffn_rows": ([c.n_ff for c in cuts], gguf.GGUFValueType.ARRAY),
        f"{SHARD_KEYS}.ffn_total": (sum(c.n_ff for c in cuts), gguf.GGUFValueType.UINT32),
        f"{SHARD_KEYS}.q_total": (hp.n_head * hp.head_dim, gguf.GGUFValueType.UINT32),
    }
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.partial"   # two cuts at once: their own
    writer = gguf.GGUFWriter(temporary, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in changed or field.name in added:
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    for name, (value, value_type) in {**changed, **added}.items():
        sub_type = gguf.GGUFValueType.UINT32 if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, value_type, sub_type=sub_type)
    parts = [(tensor, np.ascontiguousarray(slice_of(tensor, cut, hp))) for tensor in reader.tensors]
    for tensor, data in parts:
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in parts:
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()
    os.replace(temporary, path)
    return path


def write_shards(model_path: str, weights: list[float], out_dir: str) -> tuple[list[Cut], list[str]]:
    """Every node's shard of `model_path` in `out_dir` (shard-<i>-of-<n>.gguf), and the cuts."""
    import gguf
    reader = gguf.GGUFReader(model_path, "r")
    hp = hparams_of(reader)
    cuts = plan_cuts(hp, weights, ffn_block_of(reader))
    os.makedirs(out_dir, exist_ok=True)
    paths = [write_shard(reader, hp, cuts, i, os.path.join(out_dir, f"shard-{i}-of-{len(cuts)}.gguf"))
             for i in range(len(cuts))]
    return cuts, paths


VOCAB_BLOCK = 64                  # the vocabulary projection is cut on multiples of this many rows


def vocab_cut(n_vocab: int, weights: list[float], block: int = VOCAB_BLOCK) -> list[int]:
    """Row boundaries (n + 1, from 0 to n_vocab) of the vocabulary projection over the nodes, in
    proportion to `weights`, on multiples of `block` rows (the last node takes the rest)."""
    if n_vocab < 1 or not weights or any(not w > 0 for w in weights):
        raise ShardError("a vocabulary cut needs a vocabulary and a positive weight for every node")
    n_blocks = -(-n_vocab // block)
    if n_blocks < len(weights):
        raise ShardError(f"a vocabulary of {n_vocab} does not cut into {len(weights)} parts of {block} rows")
    counts = _largest_remainder([w / sum(weights) * n_blocks for w in weights], n_blocks, 1)
    cut, at = [0], 0
    for count in counts:
        at = min(n_vocab, at + count * block)
        cut.append(at)
    cut[-1] = n_vocab
    return cut


def weights_key(weights: list[float]) -> str:
    """The weights as a cut reads them (rounded, so the leader's and a follower's agree)."""
    return ",".join(f"{w:.4f}" for w in weights)


def runs_of(path: str) -> tuple[int, int] | None:
    """A shard's chunked-form runs, those of the whole model's weights (accel.set_runs; the
    engine worker reads the same two keys through the loaded model: worker.shard_runs); None
    for a whole model, whose weights give their own."""
    import gguf
    reader = gguf.GGUFReader(path)
    return accel.shard_runs(*(int(_field(reader, f"{SHARD_KEYS}.{key}", 0)) for key in ("q_total", "ffn_total")))


def shard_for(model_path: str, weights: list[float], index: int, cache_dir: str, digest: str) -> str:
    """This node's shard (`index` of len(weights)) of the model whose file digest is `digest`,
    cut once and kept in `cache_dir` under the digest and the weights: a follower cuts its own
    from the file it holds, and a placement made again finds it there."""
    import hashlib

    import gguf
    weights = [float(w) for w in weights_key(weights).split(",")]
    plan = hashlib.sha256(f"{PLAN_VERSION}:{weights_key(weights)}".encode()).hexdigest()[:12]
    folder = os.path.join(cache_dir, f"{digest[:16]}-{plan}")
    path = os.path.join(folder, f"shard-{index}-of-{len(weights)}.gguf")
    if os.path.exists(path):
        return path
    if not 0 <= index < len(weights):
        raise ShardError(f"shard {index} of {len(weights)} does not exist")
    reader = gguf.GGUFReader(model_path, "r")
    hp = hparams_of(reader)
    cuts = plan_cuts(hp, weights, ffn_block_of(reader))
    os.makedirs(folder, exist_ok=True)
    return write_shard(reader, hp, cuts, index, path)


def _field(reader, key: str, default=None):
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise ShardError(f"the model has no '{key}'")
        return default
    return field.contents()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("out_dir")
    parser.add_argument("--weights", default="1,1", help="each node's compute, comma-separated")
    args = parser.parse_args()
    cuts, paths = write_shards(args.model, [float(w) for w in args.weights.split(",")], args.out_dir)
    for cut, path in zip(cuts, paths):
        print(f"node {cut.index}: KV groups {cut.groups[0]}-{cut.groups[1]}, FFN rows {cut.ffn[0]}-{cut.ffn[1]}: {path}")


if __name__ == "__main__":
    main()
