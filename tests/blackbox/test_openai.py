"""The inference API through the official openai SDK, against the real daemon and models."""
import base64
import json

import numpy as np
import openai
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

FIXTURE = json.load(open(__file__.rsplit("/", 2)[0] + "/fixtures/minilm_reference.json"))
CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
CONFIG = "[rate_limits]\ninference = 0\n[engine]\nslots = 8\ncontext_length = 1024\n"


@pytest.fixture(scope="module", params=["worker", "inline"])
def daemon(tmp_path_factory, request):
    """The whole module runs against each engine isolation mode."""
    daemon = Daemon(str(tmp_path_factory.mktemp("openai") / "data"),
                    CONFIG + f'isolation = "{request.param}"\n', models=True)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.openai_client()


def ask(client, text, **kwargs):
    return client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": text}],
                                          **kwargs)


def test_models_are_listed_with_kind_and_state(client):
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {CHAT, EMBED}
    assert models[CHAT].owned_by == "stackd" and models[CHAT].object == "model"
    assert models[CHAT].model_extra["kind"] == "chat" and models[EMBED].model_extra["kind"] == "embedding"
    assert models[CHAT].model_extra["state"] == "loaded"
    assert client.models.retrieve(CHAT).id == CHAT


def test_chat_completion_shape(client):
    reply = ask(client, "What is the capital of France?", max_tokens=20, temperature=0)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == CHAT and reply.system_fingerprint
    [choice] = reply.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_greedy_is_reproducible(client):
    first = ask(client, "Name a fruit.", max_tokens=12, temperature=0).choices[0].message.content
    second = ask(client, "Name a fruit.", max_tokens=12, temperature=0).choices[0].message.content
    assert first == second


def test_seeded_sampling_is_reproducible(client):
    runs = [ask(client, "Write one word.", max_tokens=10, temperature=1.0, seed=99).choices[0].message.content
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_content_parts_and_roles(client):
    reply = client.chat.completions.create(model=CHAT, max_tokens=8, messages=[
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": [{"type": "text", "text": "Sky color?"}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And grass?"}])
    assert reply.choices[0].message.content


def test_streaming_with_usage(client):
    stream = ask(client, "Count to five.", max_tokens=16, temperature=0, stream=True,
                 stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals and finals[-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    whole = ask(client, "Count to five.", max_tokens=16, temperature=0).choices[0].message.content
    assert text == whole


def test_n_choices(client):
    reply = ask(client, "Say a number.", max_tokens=6, temperature=1.0, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]


def test_max_tokens_gives_length(client):
    reply = ask(client, "Tell me a long story.", max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4


def test_stop_sequences(client):
    reply = ask(client, "List the numbers 1, 2, 3, 4, 5 separated by commas.", max_tokens=40,
                temperature=0, stop=["3"])
    assert "3" not in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].stop_reason == "3"          # which stop ended it, as vLLM says


def test_the_stop_string_that_ended_a_stream_or_a_completion_is_named(client):
    stops = ["e", "a", "o"]                             # letters some English answer has
    stream = client.chat.completions.create(model=CHAT, max_tokens=48, temperature=0, stop=stops, stream=True,
                                            messages=[{"role": "user", "content": "Tell me about the sea."}])
    finals = [c.choices[0] for c in stream if c.choices and c.choices[0].finish_reason]
    assert finals[-1].finish_reason == "stop" and finals[-1].stop_reason in stops
    completion = client.completions.create(model=CHAT, prompt="The sea is", max_tokens=48, temperature=0,
                                           stop=stops)
    assert completion.choices[0].finish_reason == "stop" and completion.choices[0].stop_reason in stops
    streamed = [c.choices[0] for c in client.completions.create(
        model=CHAT, prompt="The sea is", max_tokens=48, temperature=0, stop=stops, stream=True)]
    assert streamed[-1].finish_reason == "stop" and streamed[-1].stop_reason == completion.choices[0].stop_reason
    assert all(getattr(c, "stop_reason", None) is None for c in streamed[:-1])
    plain = client.completions.create(model=CHAT, prompt="The sea is", max_tokens=2, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert plain.choices[0].finish_reason == "length" and getattr(plain.choices[0], "stop_reason", None) is None


def test_json_schema_response_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = ask(client, "Give a city and its population as JSON.", max_tokens=80, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    value = json.loads(reply.choices[0].message.content)
    assert isinstance(value["city"], str) and isinstance(value["population"], int)


def test_json_object_response_format(client):
    reply = ask(client, 'Reply with exactly this JSON: {"ok": true}', max_tokens=400, temperature=0,
                response_format={"type": "json_object"})
    assert reply.choices[0].finish_reason == "stop"     # only a finished answer must parse
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_chat_logprobs(client):
    reply = ask(client, "Hi", max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert content and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)


def test_completions(client):
    reply = client.completions.create(model=CHAT, prompt=["The sky is", "Water is"], max_tokens=5,
                                      temperature=0, n=2)
    assert reply.object == "text_completion" and len(reply.choices) == 4
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert reply.choices[0].text == reply.choices[1].text      # greedy: both choices agree
    stream = list(client.completions.create(model=CHAT, prompt="The sky is", max_tokens=5,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in stream if c.choices) == \
        client.completions.create(model=CHAT, prompt="The sky is", max_tokens=5, temperature=0).choices[0].text


def test_completions_echo_streamed_puts_each_prompt_first(client):
    prompts = ["The sky is", "Water is"]
    texts = {}
    for chunk in client.completions.create(model=CHAT, prompt=prompts, max_tokens=4, temperature=0,
                                           n=2, echo=True, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    plain = client.completions.create(model=CHAT, prompt=prompts, max_tokens=4, temperature=0, n=2, echo=True)
    assert [texts[i] for i in range(4)] == [c.text for c in plain.choices]
    assert texts[0].startswith("The sky is") and texts[2].startswith("Water is")
    assert len(texts[0]) > len("The sky is")


def test_completions_best_of_returns_the_best_n_of_its_candidates(client):
    reply = client.completions.create(model=CHAT, prompt="My favourite colour is", max_tokens=6,
                                      temperature=1.0, seed=11, n=2, best_of=5, logprobs=1)
    assert [c.index for c in reply.choices] == [0, 1]
    means = [sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs) for c in reply.choices]
    assert means[0] >= means[1]                                # best first
    # the same seeded request without best_of: its 5 candidates, of which these are the best
    every = client.completions.create(model=CHAT, prompt="My favourite colour is", max_tokens=6,
                                      temperature=1.0, seed=11, n=5, logprobs=1)
    ranked = sorted(every.choices, key=lambda c: -sum(c.logprobs.token_logprobs) / len(c.logprobs.token_logprobs))
    assert [c.text for c in reply.choices] == [c.text for c in ranked[:2]]
    assert reply.usage.completion_tokens == every.usage.completion_tokens   # every candidate's tokens


@pytest.mark.parametrize("fields, param", [({"suffix": "}"}, "suffix"), ({"n": 3, "best_of": 2}, "best_of"),
                                           ({"best_of": 2, "stream": True}, "best_of")])
def test_completions_refuse_what_they_cannot_honour(client, fields, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=CHAT, prompt="a", max_tokens=2, **fields)
    assert caught.value.body["param"] == param


def test_completion_logprobs(client):
    reply = client.completions.create(model=CHAT, prompt="One, two,", max_tokens=3, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3


def test_embeddings_match_sentence_transformers(client):
    sentences = FIXTURE["sentences"]
    reply = client.embeddings.create(model=EMBED, input=sentences)
    assert [d.index for d in reply.data] == list(range(len(sentences)))
    assert reply.usage.prompt_tokens > 0
    for got, want in zip(reply.data, FIXTURE["embeddings"]):
        a, b = np.array(got.embedding), np.array(want)
        assert a.shape == (384,)
        assert a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) >= 0.99


def test_embeddings_base64_and_tokens(client, daemon):
    status, _, body = daemon.request("POST", "/v1/embeddings", port="inference", key=daemon.admin_key,
                                     body={"model": EMBED, "input": "hello", "encoding_format": "base64"})
    assert status == 200
    vector = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-3
    status, _, body = daemon.request("POST", "/v1/embeddings", port="inference", key=daemon.admin_key,
                                     body={"model": EMBED, "input": [[101, 7592, 102]]})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384


# ---- errors in the spec's shape --------------------------------------------------------------

def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        ask(client, "hi", max_tokens=2) if False else client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["type"] == "model_not_found"


@pytest.mark.parametrize("field,value", [
    ("temperature", 3), ("temperature", "hot"), ("max_tokens", 0), ("max_tokens", 1.5), ("n", 17),
    ("top_p", -0.1), ("stop", ["a", "b", "c", "d", "e"]), ("logit_bias", {"abc": 1}),
    ("logit_bias", {"1": 500}), ("presence_penalty", 9), ("seed", "x"), ("top_logprobs", 3),
    ("response_format", {"type": "xml"}), ("stream_options", {"include_usage": True}),
])
def test_bad_parameters_are_400_naming_them(daemon, field, value):
    body = {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], field: value}
    status, _, reply = daemon.request("POST", "/v1/chat/completions", port="inference",
                                      key=daemon.admin_key, body=body)
    assert status == 400 and reply["error"]["type"] == "invalid_request_error"
    assert field in reply["error"]["message"]


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "wizard", "content": "x"}],
                                      [{"role": "user"}], [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}]])
def test_bad_messages_are_400(daemon, messages):
    status, _, reply = daemon.request("POST", "/v1/chat/completions", port="inference",
                                      key=daemon.admin_key, body={"model": CHAT, "messages": messages})
    assert status == 400 and "messages" in reply["error"]["message"]


def test_context_overflow_is_400(daemon):
    body = {"model": CHAT, "messages": [{"role": "user", "content": "word " * 3000}]}
    status, _, reply = daemon.request("POST", "/v1/chat/completions", port="inference",
                                      key=daemon.admin_key, body=body)
    assert status == 400 and reply["error"]["type"] == "context_length_exceeded"


def test_wrong_kind_of_model(daemon):
    status, _, reply = daemon.request("POST", "/v1/embeddings", port="inference", key=daemon.admin_key,
                                      body={"model": CHAT, "input": "x"})
    assert status == 400 and "chat model" in reply["error"]["message"]


@pytest.mark.parametrize("value", ["", [], [""], [[]], [1.5], {"a": 1}, [[999999]]])
def test_bad_embedding_inputs(daemon, value):
    status, _, reply = daemon.request("POST", "/v1/embeddings", port="inference", key=daemon.admin_key,
                                      body={"model": EMBED, "input": value})
    assert status == 400 and "input" in reply["error"]["message"]


def sampled_tokens(daemon) -> int:
    """The chat engine's count of sampled tokens (workers report theirs once a second)."""
    metrics = daemon.request("GET", "/metrics", key=daemon.admin_key)[2].decode()
    line = next(l for l in metrics.splitlines()
                if l.startswith("stackd_engine_n_tokens_sampled_total") and CHAT in l)
    return int(line.rsplit(" ", 1)[1])


def test_abandoned_stream_frees_its_slot(client, daemon):
    import time
    stream = ask(client, "Write a long essay.", max_tokens=900, stream=True,
                 extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    reply = ask(client, "Hi", max_tokens=3, temperature=0)
    assert reply.choices[0].message.content is not None
    time.sleep(2.5)
    settled = sampled_tokens(daemon)
    time.sleep(2.5)
    assert sampled_tokens(daemon) == settled       # nothing is generating for the closed stream


def test_a_client_that_times_out_frees_its_slot(daemon):
    """An SDK's timeout closes the socket of a non-streaming request: nothing is ever written
    to it, so the end of its input is the only sign. The generation stops."""
    import socket
    import time
    body = json.dumps({"model": CHAT, "max_tokens": 900, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "Write a long essay."}]}).encode()
    sock = socket.create_connection(("127.0.0.1", daemon.inference_port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + daemon.admin_key.encode() +
                 b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    started = sampled_tokens(daemon)
    deadline = time.monotonic() + 60
    while sampled_tokens(daemon) == started and time.monotonic() < deadline:
        time.sleep(0.2)                            # it is generating (workers report each second)
    sock.close()
    time.sleep(2.5)
    settled = sampled_tokens(daemon)
    time.sleep(2.5)
    assert sampled_tokens(daemon) == settled       # nothing is generating for the closed client


def test_the_daemon_maps_one_copy_of_llama_cpp(daemon):
    mapped = {line.split()[-1] for line in open(f"/proc/{daemon.proc.pid}/maps")
              if ".so" in line and ("libllama" in line or "libggml-base" in line)}
    assert len([m for m in mapped if "libllama" in m]) == 1, mapped
    assert len([m for m in mapped if "libggml-base" in m]) == 1, mapped
