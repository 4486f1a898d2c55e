"""Prompt log-probabilities on /v1/completions (echo with logprobs), against the real daemon and
the default chat model: every prompt token's log-probability and alternatives (the first null),
text_offset, string / token-array / batched prompts, max_tokens 0, the same numbers whether the
prompt was in the KV cache or not, the same numbers as the engine gives a token it samples, and
the bound on the rows a request may ask for."""
import pytest

from stackd.api.inference.completions import MAX_PROMPT_LOGPROB_ROWS
from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
# batch_invariant: a row's numbers do not depend on what shared its step, so the numbers of a
# prompt chunk and of a single sampled position can be compared closely
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 2\ncontext_length = 2048\n"
          "batch_invariant = true\n")
TEXT = "The capital of France is Paris. Ünïcödé 🙂 done."
CLOSE = 1e-3


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    started = Daemon(str(tmp_path_factory.mktemp("prompt-logprobs") / "data"), CONFIG, models=True)
    yield started
    assert started.proc.poll() is None, "the daemon died"
    started.stop()


def post(daemon, path, body):
    status, _, answer = daemon.request("POST", path, port="inference", body=body, key=daemon.admin_key)
    return status, answer


def complete(daemon, **body):
    status, answer = post(daemon, "/v1/completions", {"model": CHAT, "temperature": 0, **body})
    assert status == 200, answer
    return answer


def tokens_of(daemon, text):
    status, answer = post(daemon, "/tokenize", {"prompt": text})
    assert status == 200, answer
    return answer["tokens"]


def forced_logprob(daemon, prefix: list[int], token: int) -> float:
    """The engine's own log-probability of `token` after `prefix`, as it reports a token it
    samples (a bias forces the pick; the log-probability is of the logits before it)."""
    answer = complete(daemon, prompt=prefix, max_tokens=1, logprobs=1, logit_bias={str(token): 100})
    entries = answer["choices"][0]["logprobs"]
    assert len(entries["token_logprobs"]) == 1, entries
    return entries["token_logprobs"][0]


def test_every_prompt_token_is_scored(daemon):
    answer = complete(daemon, prompt=TEXT, echo=True, logprobs=3, max_tokens=0)
    choice = answer["choices"][0]
    lp = choice["logprobs"]
    n = len(tokens_of(daemon, TEXT))
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 0 and answer["usage"]["prompt_tokens"] == n
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    for token, logprob, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert 1 <= len(top) <= 3 and all(v <= 0 for v in top.values())   # pieces that decode alike share a key
        assert logprob <= max(top.values()) + 1e-6
        if token in top and "\ufffd" not in token:
            assert abs(top[token] - logprob) < 1e-6
    for token, offset in zip(lp["tokens"], lp["text_offset"]):    # each token where the text has it
        if "\ufffd" not in token:
            assert TEXT[offset:offset + len(token)] == token
    assert lp["text_offset"] == sorted(lp["text_offset"])


def test_the_same_numbers_as_the_engine_gives_a_sampled_token(daemon):
    tokens = tokens_of(daemon, TEXT)
    scored = complete(daemon, prompt=tokens, echo=True, logprobs=1, max_tokens=0)
    logprobs = scored["choices"][0]["logprobs"]["token_logprobs"]
    for j in (1, 2, len(tokens) // 2, len(tokens) - 1):
        assert abs(logprobs[j] - forced_logprob(daemon, tokens[:j], tokens[j])) < CLOSE, j


def test_a_cached_prompt_is_scored_the_same(daemon):
    """The second request finds the prompt in a slot's KV cache; its rows are computed again."""
    prompt = "Once upon a time, in a land far away, there lived a dragon who loved tea."
    first = complete(daemon, prompt=prompt, echo=True, logprobs=2, max_tokens=1)
    again = complete(daemon, prompt=prompt + " It", echo=True, logprobs=2, max_tokens=1)
    a, b = first["choices"][0]["logprobs"], again["choices"][0]["logprobs"]
    n = len(tokens_of(daemon, prompt))
    assert len(a["token_logprobs"]) == n + 1          # the prompt, then the token generated
    assert b["token_logprobs"][0] is None and None not in b["token_logprobs"][1:]
    for x, y in zip(a["token_logprobs"][1:n], b["token_logprobs"][1:n]):
        assert abs(x - y) < CLOSE


def test_batched_prompts_and_choices(daemon):
    prompts = ["Hello there, how are you?", "One two three four five"]
    together = complete(daemon, prompt=prompts, echo=True, logprobs=1, max_tokens=2, n=2)
    assert [c["index"] for c in together["choices"]] == [0, 1, 2, 3]
    for i, choice in enumerate(together["choices"]):
        alone = complete(daemon, prompt=prompts[i // 2], echo=True, logprobs=1, max_tokens=0)
        n = len(alone["choices"][0]["logprobs"]["tokens"])
        got = choice["logprobs"]
        assert choice["text"].startswith(prompts[i // 2])
        assert got["tokens"][:n] == alone["choices"][0]["logprobs"]["tokens"]
        assert got["token_logprobs"][0] is None
        for x, y in zip(got["token_logprobs"][1:n], alone["choices"][0]["logprobs"]["token_logprobs"][1:]):
            assert abs(x - y) < CLOSE
        assert n < len(got["tokens"]) <= n + 2          # then the tokens generated (an end token too)


def test_streamed_echo_carries_the_prompt_rows(daemon):
    import http.client
    import orjson
    conn = http.client.HTTPConnection("127.0.0.1", daemon.inference_port, timeout=300)
    conn.request("POST", "/v1/completions", orjson.dumps({
        "model": CHAT, "prompt": TEXT, "echo": True, "logprobs": 1, "max_tokens": 2, "temperature": 0,
        "stream": True}), {"Authorization": f"Bearer {daemon.admin_key}", "Content-Type": "application/json"})
    body = conn.getresponse().read().decode()
    chunks = [orjson.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    first = chunks[0]["choices"][0]
    assert first["text"] == TEXT and first["logprobs"]["token_logprobs"][0] is None
    whole = complete(daemon, prompt=TEXT, echo=True, logprobs=1, max_tokens=0)["choices"][0]["logprobs"]
    assert first["logprobs"]["tokens"] == whole["tokens"]


def test_max_tokens_zero_needs_echo(daemon):
    status, answer = post(daemon, "/v1/completions", {"model": CHAT, "prompt": "hi", "max_tokens": 0})
    assert status == 400 and answer["error"]["param"] == "max_tokens", answer


def test_the_bound_on_rows_at_its_edge(daemon):
    """Rows are the prompts' tokens times n: exactly the bound is answered, one more is a 400."""
    n = 16
    length = MAX_PROMPT_LOGPROB_ROWS // n
    prompt = [1000 + (i % 500) for i in range(length)]
    answer = complete(daemon, prompt=prompt, echo=True, logprobs=0, max_tokens=0, n=n)
    assert len(answer["choices"]) == n
    assert all(len(c["logprobs"]["token_logprobs"]) == length for c in answer["choices"])
    status, refused = post(daemon, "/v1/completions", {"model": CHAT, "prompt": prompt + [1000], "echo": True,
                                                        "logprobs": 0, "max_tokens": 0, "n": n})
    assert status == 400 and refused["error"]["param"] == "echo", refused
    assert str(MAX_PROMPT_LOGPROB_ROWS) in refused["error"]["message"]
