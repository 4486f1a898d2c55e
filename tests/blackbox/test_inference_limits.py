"""Every limit of the inference API at its edge: N is accepted, N + 1 is refused naming it."""
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT, EMBED = "smollm2-135m-instruct", "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("limits") / "data"),
                    "[rate_limits]\ninference = 0\n[engine]\nslots = 16\ncontext_length = 1024\n"
                    "max_queue = 256\n[http]\nmax_body_bytes = 4194304\n", models=True)
    yield daemon
    daemon.stop()


def post(daemon, path, body):
    return daemon.request("POST", path, port="inference", key=daemon.admin_key, body=body)


def chat(daemon, **fields):
    return post(daemon, "/v1/chat/completions",
                {"model": CHAT, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], **fields})


def refused(reply, word: str) -> bool:
    status, _, body = reply
    return status == 400 and word in body["error"]["message"]


def test_n(daemon):
    assert chat(daemon, n=16)[0] == 200
    assert refused(chat(daemon, n=17), "'n'")


def test_stop_count_and_length(daemon):
    assert chat(daemon, stop=["a", "b", "c", "d"])[0] == 200
    assert refused(chat(daemon, stop=["a", "b", "c", "d", "e"]), "at most 4")
    assert chat(daemon, stop=["s" * 256])[0] == 200
    assert refused(chat(daemon, stop=["s" * 257]), "256")


def test_logit_bias_entries(daemon):
    assert chat(daemon, logit_bias={str(t): 1 for t in range(1024)})[0] == 200
    assert refused(chat(daemon, logit_bias={str(t): 1 for t in range(1025)}), "1024")


def test_top_logprobs(daemon):
    assert chat(daemon, logprobs=True, top_logprobs=20)[0] == 200
    assert refused(chat(daemon, logprobs=True, top_logprobs=21), "top_logprobs")


def test_messages_count(daemon):
    many = [{"role": "user", "content": ""}] * 4096
    status, _, body = chat(daemon, messages=many)
    assert status == 200 or body["error"]["type"] == "context_length_exceeded"
    assert refused(chat(daemon, messages=many + [{"role": "user", "content": ""}]), "at most 4096")


def test_completion_prompts_count(daemon):
    assert post(daemon, "/v1/completions", {"model": CHAT, "prompt": ["a"] * 64, "max_tokens": 1})[0] == 200
    assert refused(post(daemon, "/v1/completions", {"model": CHAT, "prompt": ["a"] * 65, "max_tokens": 1}),
                   "at most 64")


def test_embedding_inputs_count(daemon):
    assert post(daemon, "/v1/embeddings", {"model": EMBED, "input": ["a"] * 2048})[0] == 200
    assert refused(post(daemon, "/v1/embeddings", {"model": EMBED, "input": ["a"] * 2049}), "at most 2048")


def test_embedding_input_tokens(daemon):
    assert post(daemon, "/v1/embeddings", {"model": EMBED, "input": [[101] * 512]})[0] == 200
    status, _, body = post(daemon, "/v1/embeddings", {"model": EMBED, "input": [[101] * 513]})
    assert status == 400 and body["error"]["type"] == "context_length_exceeded"


def test_prompt_must_leave_room_to_generate(daemon):
    fits = post(daemon, "/v1/completions", {"model": CHAT, "prompt": [1] * 1023, "max_tokens": 5})
    assert fits[0] == 200 and fits[2]["choices"][0]["finish_reason"] == "length"
    assert fits[2]["usage"]["completion_tokens"] == 1
    status, _, body = post(daemon, "/v1/completions", {"model": CHAT, "prompt": [1] * 1024, "max_tokens": 5})
    assert status == 400 and body["error"]["type"] == "context_length_exceeded"
