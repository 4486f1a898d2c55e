"""server/store/vocab_check.py: what llama-vocab.cpp asserts or throws, refused before a load.

The rules are tested on tiny GGUFs written by gguf.GGUFWriter with one thing wrong; the
child-process load is tested on the real llama.cpp, including a vocabulary that makes it
abort (the child dies, this process does not)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

from stackd.store import vocab_check
from stackd.store.gguf_check import GGUFError
from stackd.store.vocab_check import VocabError, check_model_file, load_in_child

from .tiny import WORDS, vocabulary, write_tiny

pytestmark = pytest.mark.slow


def custom_gguf(path, tokenizer: dict | None) -> str:
    """A tiny llama GGUF whose tokenizer.* keys are exactly `tokenizer` (values typed by
    GGUFWriter's add_key_value)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-5)
    for key, (value, vtype, *sub) in (tokenizer or {}).items():
        writer.add_key_value(key, value, vtype, sub_type=sub[0] if sub else None)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


T = gguf.GGUFValueType
TOKENS = ["<unk>", "<s>", "</s>", *WORDS]


def spm(**overrides) -> dict:
    keys = {"tokenizer.ggml.model": ("llama", T.STRING),
            "tokenizer.ggml.tokens": (TOKENS, T.ARRAY, T.STRING),
            "tokenizer.ggml.scores": ([0.0] * len(TOKENS), T.ARRAY, T.FLOAT32),
            "tokenizer.ggml.token_type": ([1] * len(TOKENS), T.ARRAY, T.INT32)}
    keys.update(overrides)
    return {k: v for k, v in keys.items() if v is not None}


@pytest.mark.parametrize("tokenizer,message", [
    (None, "has no tokenizer"),
    (spm(**{"tokenizer.ggml.model": (7, T.UINT32)}), "must be a string"),
    (spm(**{"tokenizer.ggml.model": ("sentencepiece-ish", T.STRING)}), "unknown tokenizer model"),
    (spm(**{"tokenizer.ggml.tokens": None}), "vocabulary is missing"),
    (spm(**{"tokenizer.ggml.tokens": ([1, 2, 3], T.ARRAY, T.INT32)}), "must be an array of string"),
    (spm(**{"tokenizer.ggml.tokens": (TOKENS + ["▁the"], T.ARRAY, T.STRING),
            "tokenizer.ggml.scores": ([0.0] * 12, T.ARRAY, T.FLOAT32),
            "tokenizer.ggml.token_type": ([1] * 12, T.ARRAY, T.INT32)}), "'▁the' twice"),
    # llama.cpp renames an empty token "[EMPTY_<id>]": a real token of that name collides
    (spm(**{"tokenizer.ggml.tokens": (["<unk>", "", "[EMPTY_1]"], T.ARRAY, T.STRING),
            "tokenizer.ggml.scores": None, "tokenizer.ggml.token_type": None}), "'[EMPTY_1]' twice"),
    # llama.cpp reads a token as a C string, to its first NUL: "x\0y" is the token "x"
    (spm(**{"tokenizer.ggml.tokens": (["<unk>", "x", "x\0y"], T.ARRAY, T.STRING),
            "tokenizer.ggml.scores": None, "tokenizer.ggml.token_type": None}), "'x' twice"),
    (spm(**{"tokenizer.ggml.tokens": (["<unk>", "\0a", "[EMPTY_1]"], T.ARRAY, T.STRING),
            "tokenizer.ggml.scores": None, "tokenizer.ggml.token_type": None}), "'[EMPTY_1]' twice"),
    (spm(**{"tokenizer.ggml.scores": ([0.0] * 3, T.ARRAY, T.FLOAT32)}), "3 entries for 11 tokens"),
    (spm(**{"tokenizer.ggml.scores": (["x"] * 11, T.ARRAY, T.STRING)}), "tokenizer.ggml.scores"),
    (spm(**{"tokenizer.ggml.token_type": ([1] * 11, T.ARRAY, T.UINT8)}), "tokenizer.ggml.token_type"),
    (spm(**{"tokenizer.ggml.token_type": ([1] * 2, T.ARRAY, T.INT32)}), "2 entries for 11 tokens"),
    (spm(**{"tokenizer.ggml.suppress_tokens": ([1.0], T.ARRAY, T.FLOAT32)}), "suppress_tokens"),
    (spm(**{"tokenizer.ggml.model": ("gpt2", T.STRING)}), "merges is missing"),
    (spm(**{"tokenizer.ggml.model": ("gpt2", T.STRING),
            "tokenizer.ggml.merges": ([1, 2], T.ARRAY, T.INT32)}), "tokenizer.ggml.merges"),
    (spm(**{"tokenizer.ggml.model": ("t5", T.STRING),
            "tokenizer.ggml.precompiled_charsmap": ([200, 0, 0, 0, 1], T.ARRAY, T.UINT8)}), "charsmap"),
])
def test_rules_refuse_what_llama_vocab_cpp_asserts_or_throws(tmp_path, tokenizer, message):
    path = custom_gguf(tmp_path / "m.gguf", tokenizer)
    with pytest.raises(VocabError, match=message.replace("[", r"\[").replace("(", r"\(")):
        check_model_file(path, load=False)


def words(tokens: list[str], model: str = "llama", **extra) -> dict:
    keys = {"tokenizer.ggml.model": (model, T.STRING), "tokenizer.ggml.tokens": (tokens, T.ARRAY, T.STRING)}
    if model == "gpt2":
        keys["tokenizer.ggml.merges"] = (["a b"], T.ARRAY, T.STRING)
    return {**keys, **extra}


NO = (False, T.BOOL)
SPM_WORDS = vocabulary()[0]                 # <unk> <s> </s>, the 256 byte tokens, a few words
# Found by tests/fuzz: an SPM vocabulary of one token has no BOS (the default id 1 is outside
# it) and no byte tokens; llama.cpp's tokenizer aborts on the first text, with
# GGML_ASSERT(special_bos_id != LLAMA_TOKEN_NULL), or with an uncaught std::out_of_range
# once BOS is turned off.
CASES = {
    "spm of one token": (words(["a"]), "adds a BOS"),
    "spm of one token, adding no BOS": (words(["a"], **{"tokenizer.ggml.add_bos_token": NO}),
                                        "no token for 255 of the 256 bytes"),
    "spm with byte tokens": (words(SPM_WORDS), None),
    "spm with a BOS id outside, its default inside": (words(SPM_WORDS, **{
        "tokenizer.ggml.bos_token_id": (100000, T.UINT32)}), None),
    "bpe of ten tokens": (words(list("abcdefghij"), "gpt2"), None),
    "bpe of ten tokens, adding BOS": (words(list("abcdefghij"), "gpt2", **{
        "tokenizer.ggml.pre": ("llama-bpe", T.STRING)}), "adds a BOS"),
    "bpe naming its BOS": (words(list("abcdefghij"), "gpt2", **{
        "tokenizer.ggml.bos_token_id": (3, T.UINT32)}), None),
    "bpe adding no BOS": (words(list("abcdefghij"), "gpt2", **{
        "tokenizer.ggml.pre": ("llama-bpe", T.STRING), "tokenizer.ggml.add_bos_token": NO}), None),
    "bert without a separator": (words(["a", "b"], "bert", **{"tokenizer.ggml.bos_token_id": (0, T.UINT32)}),
                                 "adds a separator"),
    "t5 without an EOS": (words(["a"], "t5"), "adds a EOS"),
    # found by tests/fuzz: RWKV's tokenizer never moves past "H" in "Hello" when "Ht" is a token
    # and "H" is not; it grows its output until std::bad_alloc
    "rwkv with Ht but no H": (words(["Ht", "e"], "rwkv"), "token b'Ht' but no token b'H'"),
    "rwkv with Ht and H": (words(["Ht", "H"], "rwkv"), None),
    "rwkv, escaped": (words(["\\x48t", "\\x0a"], "rwkv"), "token b'Ht' but no token b'H'"),
    "rwkv, escaped, with H": (words(["\\x48t", "H"], "rwkv"), None),
}


@pytest.mark.parametrize("name", CASES)
def test_special_tokens_and_byte_fallback(tmp_path, name):
    tokenizer, message = CASES[name]
    path = custom_gguf(tmp_path / "m.gguf", tokenizer)
    if message is None:
        check_model_file(path, load=False)
    else:
        with pytest.raises(VocabError, match=message):
            check_model_file(path, load=False)


ABORT = r"crashed \(signal 6\): .*(GGML_ASSERT\(.*(bos|eos).* != LLAMA_TOKEN_NULL\)|what\(\))"


@pytest.mark.parametrize("name", ["spm of one token", "spm of one token, adding no BOS", "spm with byte tokens",
                                  "bpe of ten tokens", "bpe of ten tokens, adding BOS", "bpe adding no BOS"])
def test_the_rules_match_what_llama_cpp_does(tmp_path, name):
    tokenizer, message = CASES[name]
    path = custom_gguf(tmp_path / "m.gguf", tokenizer)
    if message is None:
        assert load_in_child(path) == len(tokenizer["tokenizer.ggml.tokens"][0])
    else:
        with pytest.raises(VocabError, match=ABORT):
            load_in_child(path)


@pytest.mark.parametrize("model", ["no_vocab", "none", "test"])
def test_a_model_without_a_text_tokenizer_is_refused(tmp_path, model):
    # found by tests/fuzz: a "no_vocab" model loads, then llama.cpp aborts on the first text
    # ("Tokenizer not initialized")
    path = custom_gguf(tmp_path / "m.gguf", {"tokenizer.ggml.model": (model, T.STRING)})
    with pytest.raises(VocabError, match="no text tokenizer"):
        check_model_file(path, load=False)
    if model == "no_vocab":
        with pytest.raises(VocabError, match="crashed.*Tokenizer not initialized"):
            load_in_child(path)


def test_a_vocab_error_is_a_gguf_error():
    # callers that refuse a bad GGUF (pull, import) refuse a bad vocabulary the same way
    assert issubclass(VocabError, GGUFError)


# ---------------------------------------------------------------- llama.cpp in a child

def test_llama_cpp_loads_a_good_vocabulary_in_a_child(tmp_path):
    path = write_tiny(tmp_path / "ok.gguf")
    assert load_in_child(path) == len(vocabulary()[0])


def test_an_abort_in_llama_cpp_kills_only_the_child(tmp_path):
    tokens, _, _ = vocabulary()
    tokens[-1] = tokens[-2]
    path = write_tiny(tmp_path / "dup.gguf", tokens=tokens)
    with pytest.raises(VocabError) as e:
        load_in_child(path)                # the rules are skipped: llama.cpp itself is asked
    assert "crashed (signal 6)" in str(e.value)
    assert "GGML_ASSERT(id_to_token.size() == token_to_id.size())" in str(e.value)
    assert "/vendor/" not in str(e.value)  # build paths are not the user's business


def test_what_the_rules_miss_the_child_refuses(tmp_path):
    # sound structure and vocabulary, but an architecture this llama.cpp does not know
    path = write_tiny(tmp_path / "arch.gguf", arch="nosucharch")
    check_model_file(path, load=False)
    with pytest.raises(VocabError, match="failed \\(exit status 1\\): .*unknown model architecture"):
        check_model_file(path)


def test_a_child_that_does_not_finish_is_a_refusal(tmp_path):
    with pytest.raises(VocabError, match="did not finish"):
        load_in_child(write_tiny(tmp_path / "ok.gguf"), timeout=0.001)


def test_last_words_pick_the_assert_and_drop_build_paths():
    log = (b"llama_model_loader: - kv 1 ...\n"
           b"/tmp/pip-wheel-x/vendor/llama.cpp/src/llama-vocab.cpp:2544: GGML_ASSERT(a == b) failed\n"
           b"Aborted\n")
    assert vocab_check.last_words(log) == "llama-vocab.cpp:2544: GGML_ASSERT(a == b) failed"
    assert vocab_check.last_words(b"") == "no message"


@pytest.mark.parametrize("whole_array_bytes", [64 << 20, 0])
def test_tokens_are_read_the_same_at_once_or_through_the_window(tmp_path, monkeypatch, whole_array_bytes):
    from stackd.store import gguf_check
    monkeypatch.setattr(gguf_check, "_WHOLE_ARRAY_BYTES", whole_array_bytes)
    tokens, _, _ = vocabulary()
    tokens[-1] = tokens[-2]
    with pytest.raises(VocabError, match=f"twice \\(ids {len(tokens) - 2} and {len(tokens) - 1}\\)"):
        check_model_file(write_tiny(tmp_path / "dup.gguf", tokens=tokens), load=False)
