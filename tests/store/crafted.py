"""Models that pass the structural GGUF check but that llama.cpp cannot load.

`duplicate_token_copy` patches a copy of the default SmolLM2 GGUF in place: one token of
its vocabulary is overwritten with another token of the same byte length, so every
offset stays valid and only `tokenizer.ggml.tokens` holds one string twice, which
llama.cpp's vocabulary loader asserts against (`id_to_token.size() == token_to_id.size()`
in llama-vocab.cpp: an abort of the whole process, not an exception).
"""
from __future__ import annotations

import shutil
import struct

import orjson

from stackd.store.defaults import smollm2_path
from stackd.store.gguf_check import check_gguf
from stackd.store.store import Manifest, ModelStore, file_sha256

TOKENS_KEY = b"tokenizer.ggml.tokens"
_T_ARRAY, _T_STRING = 9, 8


def token_table(data: bytes) -> list[tuple[int, bytes]]:
    """(offset of the text, text) for every token of the GGUF's vocabulary."""
    key = struct.pack("<Q", len(TOKENS_KEY)) + TOKENS_KEY
    at = data.index(key) + len(key)
    vtype, etype, count = struct.unpack_from("<IIQ", data, at)
    assert (vtype, etype) == (_T_ARRAY, _T_STRING)
    pos, out = at + 16, []
    for _ in range(count):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos + 8, data[pos + 8:pos + 8 + n]))
        pos += 8 + n
    return out


def duplicate_token(data: bytes) -> tuple[bytes, int, int]:
    """The GGUF bytes with token `j` overwritten by token `i` (same length, i < j)."""
    table = token_table(data)
    first_of_length: dict[int, int] = {}
    for index, (_, text) in enumerate(table):
        if len(text) >= 3 and text.isascii() and text.isalpha():
            if len(text) in first_of_length:
                i, j = first_of_length[len(text)], index
                out = bytearray(data)
                offset = table[j][0]
                out[offset:offset + len(text)] = table[i][1]
                return bytes(out), i, j
            first_of_length[len(text)] = index
    raise AssertionError("no two alphabetic tokens of one length")


def duplicate_token_copy(path) -> tuple[int, int]:
    """Write the crafted SmolLM2 copy to `path`; returns the two token ids that collide."""
    with open(smollm2_path(), "rb") as f:
        crafted, i, j = duplicate_token(f.read())
    with open(path, "wb") as f:
        f.write(crafted)
    return i, j


def old_store_manifest(store: ModelStore, path: str, model_id: str) -> Manifest:
    """Put `path` into `store` the way an older version did: the blob, and a manifest with
    the GGUF facts but no vocabulary check (no `vocab_checked` field at all)."""
    digest = file_sha256(path)
    shutil.copyfile(path, store.blob_path(digest))
    info = check_gguf(store.blob_path(digest))
    manifest = Manifest(id=model_id, file=f"blobs/sha256-{digest}", size=info.file_size, sha256=digest,
                        architecture=info.architecture, kind=info.kind, quantization=info.quantization,
                        parameter_count=info.parameter_count, context_length=info.context_length,
                        n_layer=info.block_count, n_embd=info.embedding_length,
                        n_head_kv=info.head_count_kv, n_head=info.head_count, source="registry")
    raw = manifest.to_json()
    raw.pop("vocab_checked", None)
    with open(store._manifest_path(model_id), "wb") as f:
        f.write(orjson.dumps(raw))
    return store.get(model_id)


def crafted(valid: bytes, kind: str) -> bytes:
    """A valid GGUF's bytes broken in its structure, one way per `kind`."""
    if kind == "truncated":
        return valid[: len(valid) // 2]
    if kind == "absurd tensor count":
        return valid[:8] + struct.pack("<Q", 1 << 60) + valid[16:]
    if kind == "huge string length":
        # the first metadata key's length, right after magic, version and the two counts
        return valid[:24] + struct.pack("<Q", (1 << 63) - 1) + valid[32:]
    if kind == "not gguf":
        return b"\x7fELF" + valid[4:]
    raise AssertionError(kind)
