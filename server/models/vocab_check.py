"""Can llama.cpp load this model's vocabulary? Asked before a model is accepted, and again
before a model from an older store is loaded.

A GGUF can be sound in structure (gguf_check.py) and still abort llama.cpp when it is
loaded: llama-vocab.cpp asserts some of what it reads (a token held twice fails
`GGML_ASSERT(id_to_token.size() == token_to_id.size())`, which kills the process), and
throws on the rest. Two checks, both before the model reaches the daemon's llama.cpp:

1. `check_rules`: what llama_vocab::impl::load asserts or throws, read from the metadata
   in Python, with a message that names the problem: a tokenizer model llama.cpp knows;
   `tokenizer.ggml.tokens` an array of strings with no string twice (an empty token
   counts as "[EMPTY_<id>]", as llama.cpp renames it); scores (int32 or float32) and token
   types (int32) at least as long as the vocabulary; BPE merges present as strings; a T5
   charsmap that fits its own header; suppress tokens as int32.
2. `load_in_child`: llama.cpp itself loads the vocabulary (`vocab_only`) and tokenizes a
   short text in a child process (vocab_load.py). Whatever the rules miss, including an
   assert in the tokenizer's set-up, kills only that child, and a dead or failing child
   is a refusal with llama.cpp's own last words.

Usage: python -m server.models.vocab_check FILE.gguf ...
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from . import gguf_check
from .gguf_check import GGUFError, GGUFInfo, Metadata

LOAD_TIMEOUT = 120.0            # seconds for the child's vocab-only load (a busy machine included)
CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vocab_load.py")

# tokenizer.ggml.model values llama-vocab.cpp knows (anything else throws "unknown tokenizer")
NO_VOCAB = frozenset({"no_vocab", "none"})
TOKENIZER_MODELS = NO_VOCAB | {"llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv",
                               "test", "plamo2", "gemma4"}
NEEDS_MERGES = frozenset({"gpt2", "hybriddna", "whitespace", "gemma4"})

# llama.cpp's log lines that say why, most telling first
_LAST_WORDS = (re.compile(r"GGML_ASSERT|GGML_ABORT|terminate called|what\(\)"),
               re.compile(r"error loading model"),
               re.compile(r"error|failed|exception", re.IGNORECASE))
_SOURCE_PATH = re.compile(r"\S*/(?=[\w.-]+\.(?:cpp|c|h):\d+)")


class VocabError(GGUFError):
    """llama.cpp cannot load the model's vocabulary. The message is meant for the user."""


def check_model_file(path: str, *, load: bool = True) -> GGUFInfo:
    """Structure, vocabulary rules and (with `load`) a vocab-only load by llama.cpp in a
    child process; raises GGUFError (VocabError for the vocabulary) when refused."""
    info = gguf_check.check_gguf(path, extra_checks=(check_rules,))
    if load:
        load_in_child(path)
    return info


# ------------------------------------------------------------------ the rules

def check_rules(meta: Metadata) -> None:
    model = _tokenizer_model(meta)
    if model in NO_VOCAB:
        return
    if model in NEEDS_MERGES and not (model == "gpt2" and meta.string("tokenizer.ggml.pre") == "kimi-k2"):
        _require_type(meta, "tokenizer.ggml.merges", ("array of string",), f"a {model} tokenizer's merges")
    if model == "t5" and meta.type_name("tokenizer.ggml.precompiled_charsmap") is not None:
        _check_charsmap(meta)
    _require_type(meta, "tokenizer.ggml.tokens", ("array of string",), "the vocabulary")
    n_tokens = meta.count("tokenizer.ggml.tokens")
    _check_parallel(meta, "tokenizer.ggml.scores", ("array of int32", "array of float32"), n_tokens)
    _check_parallel(meta, "tokenizer.ggml.token_type", ("array of int32",), n_tokens)
    if meta.type_name("tokenizer.ggml.suppress_tokens") not in (None, "array of int32"):
        raise VocabError("metadata key 'tokenizer.ggml.suppress_tokens' must be an array of int32")
    _check_unique(meta)


def _tokenizer_model(meta: Metadata) -> str:
    kind = meta.type_name("tokenizer.ggml.model")
    if kind is None:
        raise VocabError("the model has no tokenizer (metadata key 'tokenizer.ggml.model' is missing); "
                         "llama.cpp cannot load it")
    if kind != "string":
        raise VocabError(f"metadata key 'tokenizer.ggml.model' must be a string, not {kind}")
    model = meta.string("tokenizer.ggml.model")
    if model not in TOKENIZER_MODELS:
        raise VocabError(f"unknown tokenizer model {model[:64]!r}; llama.cpp knows "
                         f"{', '.join(sorted(TOKENIZER_MODELS))}")
    return model


def _require_type(meta: Metadata, key: str, allowed: tuple[str, ...], what: str) -> None:
    kind = meta.type_name(key)
    if kind is None:
        raise VocabError(f"{what} is missing (metadata key {key!r})")
    if kind not in allowed:
        raise VocabError(f"metadata key {key!r} must be an {' or '.join(allowed)}, not {kind}")


def _check_parallel(meta: Metadata, key: str, allowed: tuple[str, ...], n_tokens: int) -> None:
    """A per-token array, when present, has a valid type and an entry for every token."""
    if meta.type_name(key) is None:
        return
    _require_type(meta, key, allowed, key)
    if meta.count(key) < n_tokens:
        raise VocabError(f"metadata key {key!r} has {meta.count(key)} entries for {n_tokens} tokens")


def _check_charsmap(meta: Metadata) -> None:
    key = "tokenizer.ggml.precompiled_charsmap"
    _require_type(meta, key, ("array of int8", "array of uint8"), "the T5 charsmap")
    raw = meta.raw_array(key)
    if len(raw) < 4 or int.from_bytes(raw[:4], "little") + 4 >= len(raw):
        raise VocabError(f"the T5 charsmap ({len(raw)} bytes) is shorter than its own header says")


def _check_unique(meta: Metadata) -> None:
    first_id: dict[bytes, int] = {}
    for token_id, text in enumerate(meta.strings("tokenizer.ggml.tokens")):
        if not text:
            text = b"[EMPTY_%d]" % token_id       # llama.cpp's name for an empty token
        seen = first_id.setdefault(text, token_id)
        if seen != token_id:
            shown = text[:60].decode("utf-8", "replace")
            raise VocabError(f"the vocabulary holds the token {shown!r} twice (ids {seen} and "
                             f"{token_id}); llama.cpp aborts loading such a vocabulary")


# ------------------------------------------------------------------ llama.cpp in a child

# (device, inode, size, mtime) of files whose vocabulary llama.cpp loaded in this process
_LOADED: dict[tuple[int, int, int, int], int] = {}


def load_in_child(path: str, timeout: float = LOAD_TIMEOUT) -> int:
    """Load the vocabulary with llama.cpp in a child process; returns the vocabulary size."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key in _LOADED:
        return _LOADED[key]
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}     # an abort must not start gdb
    try:
        done = subprocess.run([sys.executable, "-I", CHILD_SCRIPT, os.path.abspath(path)],
                              stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise VocabError(f"llama.cpp did not finish loading the vocabulary within {timeout:g} s") from None
    if done.returncode != 0:
        how = (f"crashed (signal {-done.returncode})" if done.returncode < 0
               else f"failed (exit status {done.returncode})")
        raise VocabError(f"llama.cpp cannot load the vocabulary: its vocab-only load {how}: "
                         f"{last_words(done.stderr)}")
    try:
        n_vocab = json.loads(done.stdout.decode().strip().splitlines()[-1])["n_vocab"]
    except (ValueError, IndexError, KeyError, UnicodeDecodeError):
        raise VocabError("llama.cpp's vocab-only load answered nothing readable") from None
    _LOADED[key] = n_vocab
    return n_vocab


def last_words(stderr: bytes) -> str:
    """The last line of llama.cpp's log that says what went wrong, without build paths."""
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    for pattern in _LAST_WORDS:
        found = [line for line in lines if pattern.search(line)]
        if found:
            return _SOURCE_PATH.sub("", found[-1])[:300]
    return lines[-1][:300] if lines else "no message"


def main(argv: list[str] | None = None) -> int:
    status = 0
    for path in (sys.argv[1:] if argv is None else argv):
        try:
            info = check_model_file(path)
            print(f"{path}: ok ({info.architecture}, {info.kind})")
        except GGUFError as exc:
            print(f"{path}: REFUSED: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
