"""The tensor-parallel shard writer (server/cluster/shard.py) on the default model (SmolLM2-135M,
Q4_1, 3 KV-head groups): the cuts it plans, that the shards' partial sums of each layer add up
to the whole layer's (numpy, on dequantized weights), and that each shard is a model llama.cpp
loads and decodes with, unpatched."""
from __future__ import annotations

import hashlib

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from stackd.cluster import shard
from stackd.store import defaults

LAYERS = (0, 17, 29)


@pytest.fixture(scope="module")
def whole():
    return gguf.GGUFReader(defaults.smollm2_path(), "r")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """{nodes: (cuts, readers)} for two and three equal nodes, and two nodes 3:1."""
    out = {}
    for weights in ((1, 1), (1, 1, 1), (3, 1)):
        cuts, paths = shard.write_shards(defaults.smollm2_path(), list(weights),
                                         str(tmp_path_factory.mktemp("shards")))
        out[weights] = (cuts, paths, [gguf.GGUFReader(p, "r") for p in paths])
    return out


def tensors(reader) -> dict:
    return {t.name: t for t in reader.tensors}


_DEQUANTIZED: dict = {}


def weight(reader, name: str) -> np.ndarray:
    key = (reader.data.filename, name)
    if key not in _DEQUANTIZED:
        _DEQUANTIZED[key] = _dequantized(reader, name)
    return _DEQUANTIZED[key]


def _dequantized(reader, name: str) -> np.ndarray:
    t = tensors(reader)[name]
    return dequantize(t.data, t.tensor_type).astype(np.float32).reshape(int(t.shape[1]), int(t.shape[0])) \
        if len(t.shape) == 2 else dequantize(t.data, t.tensor_type).astype(np.float32)


def hp_of(reader) -> shard.Hparams:
    return shard.hparams_of(reader)


# ---- the plan ------------------------------------------------------------------------------------

def test_two_equal_nodes_split_each_half_of_a_layer_on_its_own(whole):
    # each half of a layer ends in an exchange every node waits at, so the FFN does not make up
    # for the attention's uneven groups (that would hold the nodes twice); the odd group goes to
    # the follower, the leader samples besides
    hp = hp_of(whole)
    assert (hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_ff) == (9, 3, 64, 1536)
    cuts = shard.plan_cuts(hp, [1.0, 1.0], 32)
    assert [c.groups for c in cuts] == [(0, 1), (1, 3)]
    assert [c.ffn for c in cuts] == [(0, 768), (768, 1536)]


def test_what_two_nodes_want_equally_goes_to_the_later_node():
    one_b = shard.Hparams("llama", 2048, 32, 8, 8192, 64, 16)       # Llama-3.2-1B's shape
    three = shard.plan_cuts(one_b, [1, 1, 1], 32)
    assert [c.n_groups for c in three] == [2, 3, 3]
    assert [c.n_ff // 32 for c in three] == [85, 85, 86]
    assert [c.groups for c in shard.plan_cuts(one_b, [1, 1], 32)] == [(0, 4), (4, 8)]


def test_cuts_follow_the_weights_and_refuse_what_cannot_be_cut(whole):
    hp = hp_of(whole)
    three = shard.plan_cuts(hp, [1, 1, 1], 32)
    assert [c.groups for c in three] == [(0, 1), (1, 2), (2, 3)]
    assert [c.n_ff for c in three] == [512, 512, 512]
    fast_first = shard.plan_cuts(hp, [3, 1], 32)
    assert [c.n_groups for c in fast_first] == [2, 1] and fast_first[0].n_ff > fast_first[1].n_ff
    slow_first = shard.plan_cuts(hp, [1, 3], 32)
    assert [c.n_groups for c in slow_first] == [1, 2] and slow_first[0].n_ff < slow_first[1].n_ff
    for cuts in (three, fast_first, slow_first):
        assert cuts[-1].ffn[1] == hp.n_ff and all(c.n_ff % 32 == 0 and c.n_ff > 0 for c in cuts)
    with pytest.raises(shard.ShardError, match="at most 3 nodes"):
        shard.plan_cuts(hp, [1, 1, 1, 1], 32)
    with pytest.raises(shard.ShardError, match="positive weight"):
        shard.plan_cuts(hp, [1, 0], 32)


def test_only_llama_models_are_cut(tmp_path):
    path = str(tmp_path / "bert.gguf")
    writer = gguf.GGUFWriter(path, arch="bert")
    writer.add_tensor("x", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(shard.ShardError, match="llama"):
        shard.write_shards(path, [1, 1], str(tmp_path / "out"))


# ---- the shards ------------------------------------------------------------------------------------

def test_each_shard_declares_its_slice(shards):
    cuts, _, readers = shards[(1, 1)]
    for cut, reader in zip(cuts, readers):
        hp = hp_of(reader)
        assert (hp.n_head, hp.n_head_kv, hp.n_ff, hp.head_dim) == (3 * cut.n_groups, cut.n_groups, cut.n_ff, 64)
        assert reader.get_field("stackd.shard.index").contents() == cut.index
        assert reader.get_field("stackd.shard.kv_groups").contents() == [1, 2]
        t = tensors(reader)
        assert tuple(int(d) for d in t["blk.3.attn_q.weight"].shape) == (576, 192 * cut.n_groups)
        assert tuple(int(d) for d in t["blk.3.attn_output.weight"].shape) == (192 * cut.n_groups, 576)
        assert tuple(int(d) for d in t["blk.3.ffn_down.weight"].shape) == (cut.n_ff, 576)


@pytest.mark.parametrize("weights", [(1, 1), (1, 1, 1), (3, 1)])
def test_the_slices_put_back_together_are_the_whole_bytes(whole, shards, weights):
    _, _, readers = shards[weights]
    parts = [tensors(r) for r in readers]
    for name, t in tensors(whole).items():
        pieces = [p[name].data for p in parts]
        if name.endswith(("attn_output.weight", "ffn_down.weight")):
            joined = np.concatenate(pieces, axis=1)
        elif name.endswith(("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight", "ffn_up.weight")):
            joined = np.concatenate(pieces, axis=0)
        else:                                             # norms, embeddings: whole on every node
            assert all(np.array_equal(p, t.data) for p in pieces), name
            continue
        assert np.array_equal(joined, t.data), name


def attention_and_ffn(reader, layer: int, xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One layer's attention output and FFN output (each before its residual add) for the token
    rows `xs` (causal, GQA as llama.cpp maps query heads to KV heads; no rope, which acts within a
    head and so does not touch the cut), in float32 as a kernel computes."""
    hp = hp_of(reader)
    w = {k: weight(reader, f"blk.{layer}.{k}.weight")
         for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")}
    n_tok, d = len(xs), hp.head_dim
    q = (xs @ w["attn_q"].T).reshape(n_tok, hp.n_head, d)
    k = (xs @ w["attn_k"].T).reshape(n_tok, hp.n_head_kv, d)
    v = (xs @ w["attn_v"].T).reshape(n_tok, hp.n_head_kv, d)
    heads = np.empty((n_tok, hp.n_head, d), dtype=np.float32)
    for h in range(hp.n_head):
        g = h // hp.gqa
        scores = (q[:, h] @ k[:, g].T) / np.sqrt(d)
        scores[np.triu_indices(n_tok, 1)] = -np.inf
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        heads[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, g]
    attn = heads.reshape(n_tok, -1) @ w["attn_output"].T
    gate, up = xs @ w["ffn_gate"].T, xs @ w["ffn_up"].T
    ffn = (gate / (1 + np.exp(-gate)) * up) @ w["ffn_down"].T
    return attn, ffn


@pytest.mark.parametrize("weights", [(1, 1), (1, 1, 1), (3, 1)])
@pytest.mark.parametrize("layer", LAYERS)
def test_the_partial_sums_of_a_layer_add_up_to_the_whole_layer(whole, shards, weights, layer):
    xs = np.random.default_rng(layer).standard_normal((5, 576)).astype(np.float32)
    attn, ffn = attention_and_ffn(whole, layer, xs)
    parts = [attention_and_ffn(r, layer, xs) for r in shards[weights][2]]
    attn_sum, ffn_sum = parts[0][0].copy(), parts[0][1].copy()
    for a, f in parts[1:]:                                # in node order, as the exchange adds
        attn_sum += a
        ffn_sum += f
    for got, want in ((attn_sum, attn), (ffn_sum, ffn)):
        scale = float(np.abs(want).max())
        assert np.abs(got - want).max() <= 1e-4 * scale
    assert np.abs(parts[0][1] - ffn).max() > 1e-2 * float(np.abs(ffn).max())   # a part is not the whole


def test_each_shard_loads_and_decodes_in_llama_cpp(shards):
    from llama_cpp import Llama
    for path in shards[(1, 1)][1]:
        model = Llama(model_path=path, n_ctx=64, n_threads=1, logits_all=True, verbose=False)
        try:
            tokens = model.tokenize(b"Once upon a time")
            model.eval(tokens)
            logits = np.array(model.scores[len(tokens) - 1])
            assert logits.shape == (49152,) and np.isfinite(logits).all() and logits.std() > 0
        finally:
            model.close()


def test_a_shard_is_the_same_bytes_each_time_it_is_cut(shards, tmp_path):
    _, paths, _ = shards[(1, 1)]
    _, again = shard.write_shards(defaults.smollm2_path(), [1, 1], str(tmp_path))
    for a, b in zip(paths, again):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert hashlib.sha256(fa.read()).digest() == hashlib.sha256(fb.read()).digest()
