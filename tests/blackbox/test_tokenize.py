"""POST /tokenize, /detokenize and GET /tokenizer_info against the real daemon and the default
chat model: vLLM's shapes and llama-server's fields, round trips, the chat path's tokens for
`messages`, and hostile sizes."""
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONFIG = "[rate_limits]\ninference = 0\n[engine]\nslots = 2\ncontext_length = 2048\n"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    started = Daemon(str(tmp_path_factory.mktemp("tokenize") / "data"), CONFIG, models=True)
    yield started
    assert started.proc.poll() is None, "the daemon died"
    started.stop()


def post(daemon, path, body, key="admin"):
    return daemon.request("POST", path, port="inference", body=body,
                          key=daemon.admin_key if key == "admin" else key)


def ok(answer):
    status, _, body = answer
    assert status == 200, body
    return body


def refused(answer, param, words=""):
    status, _, body = answer
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"].get("param") == param, body
    assert words in body["error"]["message"], body


TEXT = "Hello, world! Ünïcödé 日本語 🙂"


def test_vllm_shape_and_round_trip(daemon):
    got = ok(post(daemon, "/tokenize", {"model": CHAT, "prompt": TEXT}))
    assert got["count"] == len(got["tokens"]) > 5 and got["max_model_len"] == 2048
    assert all(isinstance(t, int) for t in got["tokens"])
    marked = ok(post(daemon, "/tokenize", {"prompt": "a<|im_end|>"}))["tokens"]
    assert marked[-1] == 2                         # <|im_end|> parsed as the special token it is
    back = ok(post(daemon, "/detokenize", {"model": CHAT, "tokens": got["tokens"]}))
    assert back["prompt"] == back["content"] == TEXT
    # control tokens come back as their text, so a tokenized chat prompt reads as it was written
    assert ok(post(daemon, "/detokenize", {"tokens": marked}))["prompt"] == "a<|im_end|>"


def test_the_same_tokens_as_a_completion_prompt(daemon):
    """The tokens /tokenize gives are the prompt /v1/completions runs: its usage counts them."""
    tokens = ok(post(daemon, "/tokenize", {"prompt": "The capital of France is"}))["tokens"]
    done = ok(post(daemon, "/v1/completions", {"model": CHAT, "prompt": "The capital of France is",
                                               "max_tokens": 1, "temperature": 0}))
    assert done["usage"]["prompt_tokens"] == len(tokens)


def test_llama_server_fields(daemon):
    got = ok(post(daemon, "/tokenize", {"content": "a<|im_end|>", "parse_special": False,
                                        "with_pieces": True}))
    assert 2 not in [t["id"] for t in got["tokens"]]           # the marker stays text
    assert "".join(t["piece"] for t in got["tokens"]) == "a<|im_end|>"
    split = ok(post(daemon, "/tokenize", {"content": "🙂", "with_pieces": True}))["tokens"]
    joined = b"".join(bytes(t["piece"]) if isinstance(t["piece"], list) else t["piece"].encode()
                      for t in split)
    assert joined.decode() == "🙂"
    strs = ok(post(daemon, "/tokenize", {"prompt": "hello world", "return_token_strs": True}))
    assert "".join(strs["token_strs"]) == "hello world" and len(strs["token_strs"]) == strs["count"]


def test_messages_tokenized_as_chat_renders_them(daemon):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    got = ok(post(daemon, "/tokenize", {"model": CHAT, "messages": messages}))
    rendered = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert got["tokens"] == ok(post(daemon, "/tokenize", {"prompt": rendered}))["tokens"]
    chat = ok(post(daemon, "/v1/chat/completions", {"model": CHAT, "messages": messages, "max_tokens": 1}))
    assert chat["usage"]["prompt_tokens"] == got["count"]


def test_tokenizer_info_for_lm_eval(daemon):
    status, _, info = daemon.request("GET", "/tokenizer_info", port="inference", key=daemon.admin_key)
    assert status == 200, info
    assert info["eos_token"] == "<|im_end|>" and info["model_max_length"] == 2048
    assert "<|im_start|>" in info["chat_template"]


def test_bad_requests_name_their_field(daemon):
    refused(post(daemon, "/tokenize", {"prompt": "a", "content": "b"}), "content", "exactly one")
    refused(post(daemon, "/tokenize", {}), "prompt", "exactly one")
    refused(post(daemon, "/tokenize", {"prompt": 5}), "prompt")
    refused(post(daemon, "/tokenize", {"prompt": "a", "add_special": True, "add_special_tokens": True}),
            "add_special")
    refused(post(daemon, "/detokenize", {"tokens": [1, 10 ** 9]}), "tokens", "outside the vocabulary")
    refused(post(daemon, "/detokenize", {"tokens": [-1]}), "tokens[0]")
    refused(post(daemon, "/detokenize", {"tokens": "abc"}), "tokens")
    status, _, body = post(daemon, "/tokenize", {"prompt": "a"}, key=None)
    assert status == 401 and body["error"]["type"] == "authentication_error"
    status, _, body = post(daemon, "/tokenize", {"model": "no-such-model", "prompt": "a"})
    assert status == 404, body


def test_detokenize_takes_every_id_of_the_vocabulary_and_no_more(daemon):
    """The edge itself: the last id (n_vocab - 1) is detokenized, n_vocab is refused naming the
    field, the entry and the range (llama.cpp would read past its table)."""
    status, _, info = daemon.request("GET", f"/tokenizer_info?model={CHAT}", port="inference",
                                     key=daemon.admin_key)
    assert status == 200, info
    n_vocab = info["vocab_size"]
    assert n_vocab == 49152                        # SmolLM2's
    assert isinstance(ok(post(daemon, "/detokenize", {"tokens": [0, n_vocab - 1]}))["prompt"], str)
    refused(post(daemon, "/detokenize", {"tokens": [n_vocab]}), "tokens",
            f"'tokens[0]' ({n_vocab}) is outside the vocabulary (0..{n_vocab - 1})")
    refused(post(daemon, "/detokenize", {"tokens": [0, n_vocab - 1, n_vocab]}), "tokens", "'tokens[2]'")


def test_hostile_sizes(daemon):
    """A long text tokenizes (off the loop) and comes back whole; pieces stop at their bound with a
    400; an empty text and an empty token list are answered."""
    long_text = "lorem ipsum dolor sit amet " * 20000          # ~540 KB, ~100k tokens
    got = ok(post(daemon, "/tokenize", {"prompt": long_text}))
    assert got["count"] > 65536
    assert ok(post(daemon, "/detokenize", {"tokens": got["tokens"]}))["prompt"] == long_text
    refused(post(daemon, "/tokenize", {"prompt": long_text, "with_pieces": True}), "with_pieces", "65536")
    assert ok(post(daemon, "/tokenize", {"prompt": ""}))["tokens"] == []
    assert ok(post(daemon, "/detokenize", {"tokens": []}))["prompt"] == ""
    status, _, _ = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert status == 200                           # still serving
