"""The client libraries, unchanged, against a tensor split (docs/cluster.md, "Tensor parallelism"):
the official openai and anthropic SDKs talk to the leader of a two-node split of the default model
as they talk to one node (tests/clients/). One split, started once for the module: a leader and
one follower, each with an engine worker on its shard, the placement checked to be "tensor" over
both. The clients are built as tests/clients' are (the daemon's admin key, retries off: a retry
would hide a failed first answer; a timeout no slow CI run reaches)."""
from __future__ import annotations

import anthropic
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from stackd.engine import accel
from testing.cluster_nodes import eventually, statuses
from testing.daemon import free_port
from testing.two_daemons import MODEL, daemons

from ..clients.tools import TOOLS, WEATHER, arguments_of

CLIENT_TIMEOUT = 600.0
MAX_TOKENS = 16
# test_tensor_split.py's engine, with context enough for the tools' schemas in the prompt
ENV = {"STACKD_ENGINE_KERNELS": "auto", "STACKD_ENGINE_SLOTS": "4", "STACKD_ENGINE_CONTEXT_LENGTH": "1024",
       "STACKD_ENGINE_THREADS": "1", "STACKD_MODELS_MEMORY_LIMIT_MB": "1200",
       "STACKD_RATE_LIMITS_INFERENCE": "0"}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def leader(tmp_path_factory):
    """A leader and one follower, the default model loaded as a tensor split over both."""
    if not accel.cpu_supports("avx2"):
        pytest.skip("a tensor split runs on our kernels, which need AVX2")
    with daemons(tmp_path_factory.mktemp("tensor_clients")) as start_node:
        leader = start_node("leader", env={**ENV, "STACKD_CLUSTER_RPC_PORT": str(free_port())})
        host = "127.0.0.2"
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=host, reach=host,
                              env={**ENV, "STACKD_CLUSTER_RPC_PORT": str(free_port(host))})
        eventually(lambda: statuses(leader).get(follower.node_id) == "up")
        nodes = [leader.node_id, follower.node_id]
        status, _, body = leader.request("POST", "/v1/models/load", body={
            "model": MODEL, "options": {"nodes": nodes, "split_mode": "tensor"}})
        assert status == 200, body
        placement = body["placement"]
        assert placement["split_mode"] == "tensor"
        assert [n["id"] for n in placement["nodes"]] == nodes
        assert all(n["share"] > 0 for n in placement["nodes"])
        described = leader.request("GET", f"/v1/models/{MODEL}", port="inference")[2]
        assert described["state"] == "loaded" and described["placement"]["split_mode"] == "tensor", described
        yield leader


@pytest.fixture(scope="module")
def client(leader):
    return openai.OpenAI(base_url=f"http://{leader.reach}:{leader.inference_port}/v1", api_key=leader.admin_key,
                         max_retries=0, timeout=CLIENT_TIMEOUT)


@pytest.fixture(scope="module")
def claude(leader):
    return anthropic.Anthropic(base_url=f"http://{leader.reach}:{leader.inference_port}", api_key=leader.admin_key,
                               max_retries=0, timeout=CLIENT_TIMEOUT)


def test_models_list_shows_the_split_model(client):
    ids = [model.id for model in client.models.list()]
    assert MODEL in ids, ids


def test_chat_completion(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(reply, ChatCompletion) and reply.object == "chat.completion"
    [choice] = reply.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= MAX_TOKENS
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    again = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0)
    assert again.choices[0].message.content == choice.message.content      # greedy: the same answer


def test_streamed_chat_reassembles_to_the_whole_answer(client):
    whole = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1
    with_choices = [c for c in chunks if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in with_choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in with_choices if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    usage = chunks[-1].usage                                  # include_usage: a last chunk, no choices
    assert not chunks[-1].choices and usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_tools_answer_with_a_call_or_text(client):
    # auto: the model may call a tool or answer; either way the shape is the SDK's (room for a
    # whole call: 16 tokens end it inside its JSON, which comes back as text)
    reply = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=TOOLS, max_tokens=64,
                                           temperature=0)
    [choice] = reply.choices
    print(f"tools, auto: {choice.finish_reason}, {choice.message.tool_calls or choice.message.content!r}")
    if choice.message.tool_calls:
        assert choice.finish_reason in ("tool_calls", "length")
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls:
                assert call.type == "function" and call.id
                arguments_of(call.function.name, call.function.arguments)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_required_tool_choice_returns_a_call_that_matches_the_schema(client):
    # a forced call runs under a grammar: the split's "rows whole" path. Greedy, so the call ends
    # within max_tokens (tests/clients/test_anthropic_sdk.py says why)
    reply = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER],
                                           tool_choice="required", max_tokens=128, temperature=0)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls", choice.message
    [call, *_] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert isinstance(arguments_of("get_weather", call.function.arguments)["city"], str)


def test_two_choices_with_a_seed(client):
    def draw():
        return client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, n=2, seed=7,
                                              temperature=0.8)
    reply = draw()
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.message.content and c.finish_reason in ("stop", "length") for c in reply.choices)
    assert 0 < reply.usage.completion_tokens <= 2 * MAX_TOKENS
    assert [c.message.content for c in draw().choices] == [c.message.content for c in reply.choices]  # the seed


def test_logprobs_with_top_logprobs(client):
    reply = client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, temperature=0,
                                           logprobs=True, top_logprobs=3)
    [choice] = reply.choices
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        tops = [top.logprob for top in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert entry.top_logprobs[0].token == entry.token                 # greedy: the chosen token is the best
        assert entry.logprob == pytest.approx(tops[0], abs=1e-5)


def test_legacy_completions(client):
    reply = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=MAX_TOKENS,
                                      temperature=0)
    assert isinstance(reply, Completion) and reply.object == "text_completion"
    [choice] = reply.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert 0 < reply.usage.completion_tokens <= MAX_TOKENS
    streamed = list(client.completions.create(model=MODEL, prompt="The capital of France is",
                                              max_tokens=MAX_TOKENS, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == choice.text


def test_anthropic_message(claude):
    message = claude.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK,
                                     system="Answer in one sentence.", extra_body={"temperature": 0})
    assert isinstance(message, anthropic.types.Message)
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.usage.input_tokens > 0 and 0 < message.usage.output_tokens <= MAX_TOKENS


def test_anthropic_stream(claude):
    with claude.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK,
                                extra_body={"temperature": 0}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds
    deltas = "".join(e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta")
    assert deltas and final.content[0].text == deltas
    assert final.stop_reason in ("end_turn", "max_tokens") and 0 < final.usage.output_tokens <= MAX_TOKENS
    whole = claude.messages.create(model=MODEL, max_tokens=MAX_TOKENS, messages=ASK, extra_body={"temperature": 0})
    assert whole.content[0].text == deltas                                # greedy: streamed as whole


def tensor_metrics(leader) -> dict[str, float]:
    """The leader's /metrics: partial-sum exchanges, and decodes by how their logits rows came."""
    status, _, text = leader.request("GET", "/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in text.decode().splitlines():
        if line.startswith("stackd_tensor_exchanges_total"):
            out["exchanges"] = out.get("exchanges", 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("stackd_tensor_logits_gathers_total{"):
            path = line.split('path="', 1)[1].split('"', 1)[0]
            out[path] = out.get(path, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_the_sdk_requests_go_through_the_split(leader, client):
    """What the SDK sends runs on the split: partial sums exchanged, greedy on the candidates
    path, logprobs on rows whole (the leader's worker pushes its counters once a second)."""
    before = tensor_metrics(leader)
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0)
    client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, temperature=0, logprobs=True)
    eventually(lambda: all(tensor_metrics(leader).get(k, 0) > before.get(k, 0)
                           for k in ("exchanges", "candidates", "full")))
