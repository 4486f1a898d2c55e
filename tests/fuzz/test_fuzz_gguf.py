"""Fuzz: GGUF bytes -> gguf_check + the vocabulary rules (+ llama.cpp's own vocab load).

Properties:
- any bytes are described (GGUFInfo) or refused with a GGUFError whose message is the
  checker's own, never an exception the checker did not foresee (those it would only wrap);
- a vocabulary the rules accept never makes llama.cpp abort: the rules are the complete list
  of what llama-vocab.cpp asserts (the child load still guards the daemon if they were not).
"""
from __future__ import annotations

import os
import struct

import pytest
from hypothesis import strategies as st

from stackd.store.gguf_check import GGUFError
from stackd.store.vocab_check import VocabError, check_model_file, load_in_child
from tests.store.tiny import write_tiny

from . import gguf_bytes as g
from .budget import fuzz

pytestmark = pytest.mark.fuzz


def described_or_refused(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
    try:
        check_model_file(path, load=False)
    except GGUFError as exc:
        unforeseen = exc.__cause__
        assert unforeseen is None or isinstance(unforeseen, GGUFError), \
            f"unforeseen {type(unforeseen).__name__} wrapped as {exc}"


# ---------------------------------------------------------------- mutations of a sound file

INTERESTING_U64 = [0, 1, 2, 7, 255, 256, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 62,
                   (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def mutations(base: bytes):
    """Up to four edits of `base`, placed in its first 8 KiB: header, metadata, tensor table."""
    @st.composite
    def mutated(draw) -> bytes:
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 4))):
            if not data:
                break
            at = draw(st.integers(0, min(len(data), 8192) - 1))
            op = draw(st.sampled_from(["byte", "u32", "u64", "truncate", "insert", "delete", "copy"]))
            if op == "byte":
                data[at] = draw(st.integers(0, 255))
            elif op == "u32":
                data[at:at + 4] = struct.pack("<I", draw(st.sampled_from(INTERESTING_U64)) & 0xFFFFFFFF)
            elif op == "u64":
                data[at:at + 8] = struct.pack("<Q", draw(st.sampled_from(INTERESTING_U64)))
            elif op == "truncate":
                del data[at:]
            elif op == "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=16))
            elif op == "delete":
                del data[at:at + draw(st.integers(1, 16))]
            else:                              # a slice of the file somewhere else in it
                src = draw(st.integers(0, min(len(base), 8192) - 1))
                data[at:at + 64] = base[src:src + draw(st.integers(1, 64))]
        return bytes(data)
    return mutated()


def test_mutated_gguf_is_described_or_refused(tmp_path, fuzz_seconds):
    base = open(write_tiny(tmp_path / "base.gguf"), "rb").read()
    path = str(tmp_path / "fuzz.gguf")
    fuzz(mutations(base), lambda data: described_or_refused(path, data), seconds=fuzz_seconds)


# ---------------------------------------------------------------- metadata said any way at all

KEYS = [b"general.architecture", b"general.alignment", b"general.name", b"general.file_type",
        b"llama.context_length", b"llama.embedding_length", b"llama.block_count",
        b"llama.attention.head_count", b"llama.attention.head_count_kv", b"llama.pooling_type",
        b"tokenizer.ggml.model", b"tokenizer.ggml.pre", b"tokenizer.ggml.tokens", b"tokenizer.ggml.scores",
        b"tokenizer.ggml.token_type", b"tokenizer.ggml.merges", b"tokenizer.ggml.precompiled_charsmap",
        b"tokenizer.ggml.suppress_tokens", b"tokenizer.ggml.bos_token_id", b"x"]
TEXTS = st.one_of(st.sampled_from([b"llama", b"gpt2", b"t5", b"bert", b"no_vocab", b"rwkv", b"", b"kimi-k2",
                                   b"a b", b"[EMPTY_0]", b"\xff\xfe"]), st.binary(max_size=12))


def scalar(vtype: int):
    if vtype == g.STRING:
        return TEXTS
    if vtype in (g.FLOAT32, g.FLOAT64):
        return st.floats(width=32 if vtype == g.FLOAT32 else 64)
    fmt = g.SCALAR_FORMATS[vtype][1]
    bits = struct.calcsize(fmt) * 8
    return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if fmt.islower() and fmt != "?" \
        else st.integers(0, (1 << bits) - 1)


ELEMENT_TYPES = [t for t in range(13) if t != g.ARRAY]


@st.composite
def typed_value(draw):
    vtype = draw(st.sampled_from(list(range(13))))
    if vtype != g.ARRAY:
        return vtype, draw(scalar(vtype))
    etype = draw(st.sampled_from(ELEMENT_TYPES))
    return vtype, (etype, draw(st.lists(scalar(etype), max_size=12)))


@st.composite
def metadata(draw) -> bytes:
    kvs = [(b"general.architecture", g.STRING, draw(st.sampled_from([b"llama", b"bert", b"gpt2", b"?"])))]
    for _ in range(draw(st.integers(0, 10))):
        kvs.append((draw(st.sampled_from(KEYS)), *draw(typed_value())))
    return g.gguf(draw(st.permutations(kvs)))


def test_generated_metadata_is_described_or_refused(tmp_path, fuzz_seconds):
    path = str(tmp_path / "fuzz.gguf")
    fuzz(metadata(), lambda data: described_or_refused(path, data), seconds=fuzz_seconds)


# ---------------------------------------------------------------- the rules against llama.cpp

TOKEN_TEXT = st.one_of(st.sampled_from([b"", b"a", b"b", b"ab", b"<s>", b"</s>", b"<unk>", b"\n", b" ",
                                        b"<0x0A>", b"\xe2\x96\x81a", b"[EMPTY_1]", b"a b"]),
                       st.binary(min_size=1, max_size=6))


@st.composite
def vocabulary_file(draw) -> bytes:
    model = draw(st.sampled_from([b"llama", b"gpt2", b"bert", b"t5", b"rwkv", b"no_vocab", b"plamo2"]))
    tokens = draw(st.lists(TOKEN_TEXT, min_size=1, max_size=24))
    kvs = [(b"general.architecture", g.STRING, b"llama"), (b"llama.context_length", g.UINT32, 64),
           (b"llama.embedding_length", g.UINT32, 8), (b"llama.block_count", g.UINT32, 1),
           (b"llama.feed_forward_length", g.UINT32, 16), (b"llama.attention.head_count", g.UINT32, 2),
           (b"llama.attention.layer_norm_rms_epsilon", g.FLOAT32, 1e-5),
           (b"tokenizer.ggml.model", g.STRING, model),
           (b"tokenizer.ggml.tokens", g.ARRAY, (g.STRING, tokens))]
    if draw(st.booleans()):
        kvs.append((b"tokenizer.ggml.scores", g.ARRAY, (g.FLOAT32, [0.0] * draw(st.integers(0, len(tokens))))))
    if draw(st.booleans()):
        types = draw(st.lists(st.integers(-2, 8), min_size=len(tokens) - 1, max_size=len(tokens)))
        kvs.append((b"tokenizer.ggml.token_type", g.ARRAY, (g.INT32, types)))
    if model == b"gpt2" or draw(st.booleans()):
        merges = draw(st.lists(st.sampled_from([b"a b", b"ab", b" a", b"a  b", b"", b"\xff x"]), max_size=4))
        kvs.append((b"tokenizer.ggml.merges", g.ARRAY, (g.STRING, merges)))
    for key in draw(st.lists(st.sampled_from([b"bos", b"eos", b"unk", b"pad", b"sep", b"eot"]), unique=True)):
        kvs.append((b"tokenizer.ggml." + key + b"_token_id", g.UINT32, draw(st.integers(0, len(tokens) + 2))))
    if draw(st.booleans()):
        kvs.append((b"tokenizer.ggml.add_bos_token", g.BOOL, draw(st.integers(0, 1))))
    return g.gguf(kvs)


def test_llama_cpp_never_aborts_on_a_vocabulary_the_rules_accept(tmp_path, fuzz_seconds):
    path = str(tmp_path / "vocab.gguf")
    counter = [0]

    def check(data: bytes) -> None:
        counter[0] += 1
        one = f"{path}.{counter[0]}"                  # a new file: never a cached answer
        with open(one, "wb") as f:
            f.write(data)
        try:
            try:
                check_model_file(one, load=False)
            except GGUFError:
                return                                  # refused by the rules: nothing to compare
            try:
                load_in_child(one)
            except VocabError as exc:
                assert "crashed" not in str(exc), f"the rules accepted what aborts llama.cpp: {exc}"
        finally:
            os.unlink(one)

    fuzz(vocabulary_file(), check, seconds=fuzz_seconds, batch=5, shrink=False)
