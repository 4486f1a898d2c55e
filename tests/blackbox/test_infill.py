"""Fill-in-the-middle: POST /infill and `suffix` on /v1/completions, against the real daemon with
the default chat model rewritten to declare FIM tokens (its vocabulary has none of its own).

The prompt is compared token for token with llama-server's construction (format_prompt_infill
in tools/server/server-common.cpp, transcribed below over llama.cpp's own vocabulary through
llama-cpp-python: its FIM tokens, as llama.cpp declares and recognises them, its BOS rule, its
tokenizer), for the same file: the daemon's builder fed by the daemon's /tokenize gives the same
tokens, and the daemon evaluates exactly that many."""
import asyncio
import os

import pytest

from stackd.api.inference.infill import _declared
from stackd.chat import infill as fim
from stackd.store.defaults import smollm2_path
from stackd.store.store import ModelStore
from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
FIM_MODEL = "smollm2-fim"
CONTEXT = 4096
CONFIG = f"[rate_limits]\ninference = 0\n[engine]\nslots = 2\ncontext_length = {CONTEXT}\n"
# three of SmolLM2's control tokens (<jupyter_start>, <jupyter_text>, <jupyter_code>) declared as
# FIM prefix, suffix and middle
DECLARED = {"tokenizer.ggml.fim_pre_token_id": 11, "tokenizer.ggml.fim_suf_token_id": 12,
            "tokenizer.ggml.fim_mid_token_id": 13}
PREFIX = "def fibonacci(n):\n    \"\"\"The n-th Fibonacci number.\"\"\"\n    "
SUFFIX = "\n    return a\n\n\nprint(fibonacci(10))\n"
EXTRA = [{"filename": "util/math.py", "text": "def add(a, b):\n    return a + b\n"},
         {"text": "# notes: use iteration, not recursion\n"}]


def with_fim_tokens(path: str) -> str:
    """A copy of the default chat model whose GGUF declares FIM tokens (every other key and every
    tensor copied by the gguf package)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(smollm2_path(), "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(path, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(gguf.GGUFValueType.UINT32, value)
                                            for key, value in DECLARED.items()}, [])
    return path


@pytest.fixture(scope="module")
def fim_path(tmp_path_factory):
    return with_fim_tokens(str(tmp_path_factory.mktemp("fim-model") / "fim.gguf"))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, fim_path):
    data_dir = str(tmp_path_factory.mktemp("infill") / "data")
    os.makedirs(data_dir, mode=0o700)
    ModelStore(data_dir).import_file(FIM_MODEL, fim_path, source="local")
    started = Daemon(data_dir, CONFIG, models=True)
    yield started
    assert started.proc.poll() is None, "the daemon died"
    started.stop()


class LlamaServerPrompt:
    """llama-server's format_prompt_infill over llama.cpp's vocabulary of a file, line by line."""

    def __init__(self, path: str):
        import llama_cpp
        self.ll = llama_cpp
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(path.encode(), params)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def close(self):
        self.ll.llama_model_free(self.model)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode()
        room = len(data) + 8
        out = (self.ll.llama_token * room)()
        n = self.ll.llama_tokenize(self.vocab, data, len(data), out, room, add_special, parse_special)
        assert n >= 0
        return list(out[:n])

    def token(self, role: str):
        token = getattr(self.ll, f"llama_vocab_fim_{role}")(self.vocab)
        return None if token == -1 else token

    def __call__(self, input_prefix: str, input_suffix: str, input_extra: list, n_batch: int, n_predict: int,
                 n_ctx: int, spm_infill: bool, tokens_prompt: list[int]) -> list[int]:
        extra_tokens = []
        tokens_prefix = self.tokenize(input_prefix, False, False)
        tokens_suffix = self.tokenize(input_suffix, False, False)
        if self.token("rep") is not None:
            extra_tokens += [self.token("rep"), *self.tokenize("myproject\n", False, False)]
        for chunk in input_extra:
            text, filename = chunk.get("text", ""), chunk.get("filename", "tmp")
            if self.token("sep") is not None:
                extra_tokens += [self.token("sep"), *self.tokenize(filename + "\n", False, False)]
            else:
                prefix = bytes([0x0a, 0x0a, 0x2d, 0x2d, 0x2d, 0x20, 0x73, 0x6e, 0x69, 0x70, 0x70, 0x65, 0x74,
                                0x20, 0x2d, 0x2d, 0x2d, 0x0a, 0x0a]).decode()
                extra_tokens += self.tokenize(prefix, False, False)
            extra_tokens += self.tokenize(text, False, False)
        if self.token("sep") is not None:
            extra_tokens += [self.token("sep"), *self.tokenize("filename\n", False, False)]
        n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
        n_suffix_take = min(len(tokens_suffix), max(0, (n_batch // 4) - (2 + len(tokens_prompt))))
        n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
        tokens_prefix = tokens_prefix[len(tokens_prefix) - n_prefix_take:]
        tokens_suffix = tokens_suffix[:n_suffix_take]
        tokens_prefix = [self.token("pre"), *tokens_prefix, *tokens_prompt]
        tokens_suffix = [self.token("suf"), *tokens_suffix]
        embd_inp, embd_end = (tokens_suffix, tokens_prefix) if spm_infill else (tokens_prefix, tokens_suffix)
        if self.ll.llama_vocab_get_add_bos(self.vocab):
            embd_inp = [self.ll.llama_vocab_bos(self.vocab), *embd_inp]
        embd_inp = extra_tokens[len(extra_tokens) - n_extra_take:] + embd_inp
        return embd_inp + embd_end + [self.token("mid")]


@pytest.fixture(scope="module")
def llama_server(fim_path):
    oracle = LlamaServerPrompt(fim_path)
    yield oracle
    oracle.close()


def post(daemon, path, body):
    status, _, answer = daemon.request("POST", path, port="inference", body=body, key=daemon.admin_key)
    return status, answer


CASES = [
    pytest.param(PREFIX, SUFFIX, [], "", id="prefix-suffix"),
    pytest.param(PREFIX, SUFFIX, EXTRA, "a, b = 0, 1", id="extra-and-prompt"),
    pytest.param("x = 1\n" * 1200, "y = 2\n" * 700, EXTRA * 40, "", id="truncated"),
    pytest.param("", "", [], "", id="empty"),
]


@pytest.mark.parametrize("prefix, suffix, extra, prompt", CASES)
def test_the_prompt_is_llama_servers_token_for_token(daemon, fim_path, llama_server, prefix, suffix, extra, prompt):
    expected = llama_server(prefix, suffix, extra, fim.N_BATCH, fim.N_PREDICT, CONTEXT, False,
                            llama_server.tokenize(prompt, False, True))

    async def tokenize(texts, add_special, parse_special):   # the daemon's own tokenizer
        out = []
        for text in texts:
            status, answer = post(daemon, "/tokenize", {"model": FIM_MODEL, "content": text,
                                                        "add_special": add_special, "parse_special": parse_special})
            assert status == 200, answer
            out.append(answer["tokens"])
        return out

    async def built():
        tokens = await fim.fim_tokens(_declared(fim_path, 49152), tokenize)
        assert (tokens.pre, tokens.suf, tokens.mid) == (11, 12, 13)
        assert (tokens.rep, tokens.sep) == (llama_server.token("rep"), llama_server.token("sep"))
        return await fim.prompt_tokens(tokens, tokenize, prefix, suffix, extra, prompt, CONTEXT)

    assert asyncio.run(built()) == expected
    status, answer = post(daemon, "/infill", {"model": FIM_MODEL, "input_prefix": prefix, "input_suffix": suffix,
                                              "input_extra": extra, "prompt": prompt, "n_predict": 4,
                                              "temperature": 0})
    assert status == 200, answer
    assert answer["tokens_evaluated"] == len(expected)


def test_infill_answers_in_llama_servers_shape(daemon):
    status, answer = post(daemon, "/infill", {"model": FIM_MODEL, "input_prefix": PREFIX, "input_suffix": SUFFIX,
                                              "input_extra": EXTRA, "n_predict": 8, "temperature": 0})
    assert status == 200, answer
    assert isinstance(answer["content"], str) and answer["stop"] is True and answer["model"] == FIM_MODEL
    assert answer["stop_type"] in ("eos", "limit", "word") and answer["tokens_predicted"] <= 8
    assert answer["timings"]["predicted_n"] == answer["tokens_predicted"]


def test_the_request_llama_vim_sends(daemon):
    """llama.vim's body as it builds it (autoload/llama.vim, llama#fim): its extra fields are
    taken (the time limits, samplers and n_indent are not applied), and the answer has the
    flattened response_fields it reads."""
    status, answer = post(daemon, "/infill", {
        "model": FIM_MODEL, "input_prefix": PREFIX, "input_suffix": SUFFIX,
        "input_extra": [{"text": "def add(a, b):\n    return a + b\n", "time": 1712345678.5,
                         "filename": "util/math.py"}],
        "prompt": "a, b", "n_predict": 16, "n_indent": 4, "top_k": 40, "top_p": 0.90, "stream": False,
        "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500,
        "t_max_predict_ms": 250,
        "response_fields": ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                            "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                            "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
                            "tokens_cached"]})
    assert status == 200, answer
    assert isinstance(answer["content"], str) and answer["truncated"] is False
    assert {"timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_second", "timings/predicted_n",
            "timings/predicted_ms", "timings/predicted_per_second", "tokens_cached"} <= set(answer)
    assert "model" not in answer                            # only what was asked for


def test_infill_streams(daemon):
    import http.client
    import orjson
    conn = http.client.HTTPConnection("127.0.0.1", daemon.inference_port, timeout=300)
    conn.request("POST", "/infill", orjson.dumps({
        "model": FIM_MODEL, "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 6, "temperature": 0,
        "stream": True}), {"Authorization": f"Bearer {daemon.admin_key}", "Content-Type": "application/json"})
    events = [orjson.loads(line[6:]) for line in conn.getresponse().read().decode().splitlines()
              if line.startswith("data: ")]
    assert events and events[-1]["stop"] is True and all(e["stop"] is False for e in events[:-1])
    status, whole = post(daemon, "/infill", {"model": FIM_MODEL, "input_prefix": PREFIX, "input_suffix": SUFFIX,
                                             "n_predict": 6, "temperature": 0})
    assert "".join(e["content"] for e in events) == whole["content"]


def test_suffix_on_completions_is_the_same_prompt(daemon):
    status, answer = post(daemon, "/v1/completions", {"model": FIM_MODEL, "prompt": PREFIX, "suffix": SUFFIX,
                                                      "max_tokens": 6, "temperature": 0})
    assert status == 200, answer
    status, infilled = post(daemon, "/infill", {"model": FIM_MODEL, "input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                "n_predict": 6, "temperature": 0})
    assert answer["usage"]["prompt_tokens"] == infilled["tokens_evaluated"]
    assert answer["choices"][0]["text"] == infilled["content"]


def test_a_model_without_fim_tokens_is_a_400_naming_the_field(daemon):
    status, answer = post(daemon, "/v1/completions", {"model": CHAT, "prompt": PREFIX, "suffix": SUFFIX})
    assert status == 400 and answer["error"]["param"] == "suffix", answer
    assert "fill-in-the-middle" in answer["error"]["message"]
    status, answer = post(daemon, "/infill", {"model": CHAT, "input_prefix": PREFIX, "input_suffix": SUFFIX})
    assert status == 400 and answer["error"]["param"] == "input_prefix", answer
    # an empty suffix is no infill: an ordinary completion
    status, answer = post(daemon, "/v1/completions", {"model": CHAT, "prompt": "Hi", "suffix": "", "max_tokens": 1})
    assert status == 200, answer


def test_bad_infill_bodies_name_their_field(daemon):
    for body, param in (({"input_suffix": ""}, "input_prefix"),
                        ({"input_prefix": "", "input_suffix": 3}, "input_suffix"),
                        ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]},
                         "input_extra[0]"),
                        ({"input_prefix": [1, 10 ** 9], "input_suffix": ""}, "input_prefix"),
                        ({"input_prefix": "", "input_suffix": "", "n_predict": -2}, "n_predict")):
        status, answer = post(daemon, "/infill", {"model": FIM_MODEL, **body})
        assert status == 400 and answer["error"]["param"] == param, (body, answer)
    status, answer = post(daemon, "/v1/completions", {"model": FIM_MODEL, "prompt": "a", "suffix": "b",
                                                      "echo": True})
    assert status == 400 and answer["error"]["param"] == "echo", answer

