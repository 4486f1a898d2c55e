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
   charsmap that fits its own header; suppress tokens as int32; a BOS / EOS / separator
   token for each one the tokenizer adds to every text (the tokenizer asserts it has them);
   for SentencePiece, a token for each of the 256 bytes (its fallback for unknown pieces); for
   RWKV, a one-byte token for the first byte of every token (else its tokenizer never ends).
2. `load_in_child`: llama.cpp itself loads the vocabulary (`vocab_only`) and tokenizes a
   short text in a child process (vocab_load.py). Whatever the rules miss, including an
   assert in the tokenizer's set-up, kills only that child, and a dead or failing child
   is a refusal with llama.cpp's own last words.

Usage: python -m stackd.store.vocab_check FILE.gguf ...
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

# tokenizer.ggml.model values llama-vocab.cpp knows (anything else throws "unknown tokenizer");
# of those, the ones without a tokenizer that turns text into tokens are refused too: with
# them llama.cpp aborts (GGML_ABORT / "Tokenizer not initialized") on the first text.
TOKENIZER_MODELS = frozenset({"llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "plamo2",
                              "gemma4"})
TEXTLESS_MODELS = frozenset({"no_vocab", "none", "test"})
NEEDS_MERGES = frozenset({"gpt2", "hybriddna", "whitespace", "gemma4"})

# Special tokens: each tokenizer model's default (bos, eos, sep) ids, and whether it adds
# BOS / EOS to every text unless tokenizer.ggml.add_{bos,eos}_token says otherwise (a BPE
# tokenizer adds BOS only after the pre-tokenizers below). llama.cpp's tokenizer asserts
# (aborts) when it must add a token the vocabulary does not have.
_SPECIAL_DEFAULTS = {
    "llama": (1, 2, None), "bert": (101, None, 102), "gpt2": (11, 11, None), "hybriddna": (11, 11, None),
    "whitespace": (11, 11, None), "t5": (None, 1, None), "plamo2": (1, 2, None),
}
_ADDS_BY_DEFAULT = {            # tokenizer model -> (adds BOS, adds EOS)
    "llama": (True, False), "bert": (True, False), "gpt2": (False, False), "hybriddna": (False, False),
    "whitespace": (False, False), "gemma4": (True, False), "t5": (False, True),
}
BPE_PRE_ADDING_BOS = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                                "midm-2.0", "lfm2", "jina-v5-nano", "tekken", "chameleon"})

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
    texts = _check_unique(meta)
    _check_special_tokens(meta, model, n_tokens)
    if model == "llama":
        _check_byte_fallback(texts)
    if model == "rwkv":
        _check_rwkv_prefixes(texts)


def _tokenizer_model(meta: Metadata) -> str:
    kind = meta.type_name("tokenizer.ggml.model")
    if kind is None:
        raise VocabError("the model has no tokenizer (metadata key 'tokenizer.ggml.model' is missing); "
                         "llama.cpp cannot load it")
    if kind != "string":
        raise VocabError(f"metadata key 'tokenizer.ggml.model' must be a string, not {kind}")
    model = meta.string("tokenizer.ggml.model")
    if model in TEXTLESS_MODELS:
        raise VocabError(f"the model has no text tokenizer (tokenizer.ggml.model is {model!r}); llama.cpp "
                         "aborts on the first text it is given")
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


def _check_unique(meta: Metadata) -> dict[bytes, int]:
    """Every token text once; returns text -> id."""
    first_id: dict[bytes, int] = {}
    for token_id, text in enumerate(meta.strings("tokenizer.ggml.tokens")):
        text = text.split(b"\0", 1)[0]           # llama.cpp reads each as a C string: to its first NUL
        if not text:
            text = b"[EMPTY_%d]" % token_id       # llama.cpp's name for an empty token
        seen = first_id.setdefault(text, token_id)
        if seen != token_id:
            shown = text[:60].decode("utf-8", "replace")
            raise VocabError(f"the vocabulary holds the token {shown!r} twice (ids {seen} and "
                             f"{token_id}); llama.cpp aborts loading such a vocabulary")
    return first_id


def _check_byte_fallback(texts: dict[bytes, int]) -> None:
    """SentencePiece spells a piece it has no token for byte by byte, as "<0xAB>" tokens (or
    the byte itself); a byte with neither makes llama.cpp's tokenizer throw out of the C API,
    which ends the process, on the first text that holds it."""
    missing = [b for b in range(256) if b"<0x%02X>" % b not in texts and bytes([b]) not in texts]
    if missing:
        raise VocabError(f"the SentencePiece vocabulary has no token for {len(missing)} of the 256 bytes "
                         f"(e.g. <0x{missing[0]:02X}>); llama.cpp aborts on the first text holding one")


def _check_rwkv_prefixes(texts: dict[bytes, int]) -> None:
    """RWKV's tokenizer takes the longest token that matches, walking a trie byte by byte; when
    a text starts with the first byte of some token but no token matches there, it neither
    moves on nor stops, and grows its output until memory runs out. It always moves on when
    every first byte of a token is a token by itself."""
    pieces = [_unescape_rwkv(text) for text in texts]
    singles = {piece for piece in pieces if len(piece) == 1}
    for piece in pieces:
        if len(piece) > 1 and piece[:1] not in singles:
            raise VocabError(f"the RWKV vocabulary has the token {piece[:40]!r} but no token {piece[:1]!r}; "
                             "llama.cpp's RWKV tokenizer loops until memory runs out on a text starting "
                             f"with {piece[:1]!r} that the token does not continue")


def _unescape_rwkv(escaped: bytes) -> bytes:
    """llama_unescape_rwkv_token: \\t \\n \\r, \\xHH (with its lax hex digits), \\<c> is c."""
    out = bytearray()
    escaping, hex_left, acc = False, 0, 0
    for c in escaped:
        if hex_left:
            acc = ((acc << 4) + ((c - 97 + 10) if c >= 97 else (c - 48))) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            escaping = False
            if c == 0x78:                                  # x
                hex_left = 2
            else:
                out.append({0x74: 9, 0x6E: 10, 0x72: 13}.get(c, c))
        elif c == 0x5C:                                    # backslash
            escaping = True
        else:
            out.append(c)
    return bytes(out)


def _special_id(meta: Metadata, name: str, default: int | None, n_tokens: int) -> int | None:
    """The id llama.cpp ends up with: a default outside the vocabulary is dropped, a uint32
    key inside it wins."""
    token = default if default is not None and default < n_tokens else None
    key = f"tokenizer.ggml.{name}_token_id"
    if meta.type_name(key) == "uint32" and meta.scalar(key) < n_tokens:
        token = meta.scalar(key)
    return token


def _adds(meta: Metadata, which: str, default: bool) -> bool:
    key = f"tokenizer.ggml.add_{which}_token"
    return bool(meta.scalar(key)) if meta.type_name(key) == "bool" else default


def _check_special_tokens(meta: Metadata, model: str, n_tokens: int) -> None:
    bos_default, eos_default, sep_default = _SPECIAL_DEFAULTS.get(model, (None, None, None))
    add_bos, add_eos = _ADDS_BY_DEFAULT.get(model, (False, False))
    if model in NEEDS_MERGES and meta.type_name("tokenizer.ggml.pre") == "string":
        add_bos = add_bos or meta.string("tokenizer.ggml.pre") in BPE_PRE_ADDING_BOS
    needed = []
    if model == "bert":          # WordPiece wraps every text in BOS ... SEP, whatever the flags say
        needed = [("bos", bos_default), ("seperator", sep_default)]
    elif model in _ADDS_BY_DEFAULT:
        add_bos = add_bos if model == "gemma4" else _adds(meta, "bos", add_bos)   # gemma4: forced on
        needed = [("bos", bos_default)] * add_bos + [("eos", eos_default)] * _adds(meta, "eos", add_eos)
    for name, default in needed:
        if _special_id(meta, name, default, n_tokens) is None:
            shown = "separator" if name == "seperator" else name.upper()
            raise VocabError(f"the tokenizer adds a {shown} token to every text but the vocabulary has "
                             f"none (tokenizer.ggml.{name}_token_id missing or outside the {n_tokens} "
                             f"tokens); llama.cpp aborts on the first text it tokenizes")


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
    """`python -m stackd.store.vocab_check FILE...`: every check a model gets before the store
    takes it (structure, vocabulary, a vocab-only load), file by file."""
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
