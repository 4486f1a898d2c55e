"""Family formats on a live daemon, through the official openai SDK: the default SmolLM2 GGUF
rewritten (testing.gguf_patch) with Qwen 2.5's Hermes <tool_call> template and with a
Qwen3-style thinking template. Tool calls (required and named enforced by the family's grammar,
auto by its lazy grammar), streamed deltas reassembled, reasoning split out, the thinking budget
of each reasoning_effort; in an engine worker (the default isolation) and inline."""
import json
import os

import openai
import pytest

from stackd.store.store import ModelStore
from testing.daemon import Daemon
from testing.gguf_patch import QWEN25_TOOLS, QWEN3_THINKING, rewritten_with_chat_template

from .test_tools import TIME

pytestmark = pytest.mark.slow

TOOLS_MODEL = "qwen-tools-fixture"
THINKING_MODEL = "qwen3-thinking-fixture"
BUDGET_LOW = 8                   # inference.reasoning_budget.low, small enough to be spent
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 2048\n"
          'isolation = "{isolation}"\n'
          f"[inference.reasoning_budget]\nlow = {BUDGET_LOW}\nhigh = -1\n")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def fixture_models(tmp_path_factory):
    """The two rewritten GGUFs, once per session of this module."""
    folder = tmp_path_factory.mktemp("family-models")
    return {TOOLS_MODEL: rewritten_with_chat_template(QWEN25_TOOLS, str(folder / "tools.gguf")),
            THINKING_MODEL: rewritten_with_chat_template(QWEN3_THINKING, str(folder / "thinking.gguf"))}


@pytest.fixture(scope="module", params=["worker", "inline"])
def daemon(request, tmp_path_factory, fixture_models):
    data_dir = str(tmp_path_factory.mktemp(f"families-{request.param}") / "data")
    os.makedirs(data_dir, mode=0o700)
    store = ModelStore(data_dir)
    for name, path in fixture_models.items():
        store.import_file(name, path, source="local")
    daemon = Daemon(data_dir, CONFIG.format(isolation=request.param), models=True)
    yield daemon
    assert daemon.proc.poll() is None, "the daemon died"
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.openai_client()


def create(client, model=TOOLS_MODEL, **kwargs):
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 60)
    return client.chat.completions.create(model=model, temperature=0, **kwargs)


def reassemble(stream):
    """The chunks of one choice back into (reasoning, content, calls, finish_reason)."""
    reasoning, content, calls, finish = "", "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                if call.id:
                    entry["id"] = call.id
                if call.function and call.function.name:
                    entry["name"] += call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
            finish = choice.finish_reason or finish
    return reasoning, content, [calls[i] for i in sorted(calls)], finish


def check_call(call, name="get_weather"):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == name
    assert isinstance(json.loads(call.function.arguments)["city"], str)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_in_the_hermes_format(client, choice):
    [answer] = create(client, tools=[WEATHER], tool_choice=choice).choices
    assert answer.finish_reason == "tool_calls"
    assert not answer.message.content             # the <tool_call> text is not content
    [call] = answer.message.tool_calls
    check_call(call)


def test_named_choice_picks_that_function_among_several(client):
    [answer] = create(client, tools=[WEATHER, TIME],
                      tool_choice={"type": "function", "function": {"name": "get_time"}}).choices
    [call] = answer.message.tool_calls
    check_call(call, "get_time")


def test_auto_is_a_parsed_call_or_plain_content(client):
    [answer] = create(client, tools=[WEATHER], tool_choice="auto").choices
    if answer.message.tool_calls:
        assert answer.finish_reason == "tool_calls"
        check_call(answer.message.tool_calls[0])
    else:
        assert "<tool_call>" not in (answer.message.content or "")


def test_streamed_call_reassembles_to_the_whole_answer(client):
    whole = create(client, tools=[WEATHER], tool_choice="required").choices[0]
    _, content, calls, finish = reassemble(create(client, tools=[WEATHER], tool_choice="required",
                                                  stream=True))
    assert finish == "tool_calls" and not content
    [call] = calls
    assert call["id"].startswith("call_")
    assert call["name"] == whole.message.tool_calls[0].function.name
    assert call["arguments"] == whole.message.tool_calls[0].function.arguments


def test_the_tool_result_turn_renders_in_the_family_format(client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    [answer] = create(client, messages=history, tools=[WEATHER], max_tokens=16).choices
    assert answer.finish_reason in ("stop", "length", "tool_calls")


def test_thinking_is_split_out_and_bounded_by_the_effort_budget(client):
    # ignore_eos: whether this small model ends its answer right after the budget's </think> is
    # its own near tie; what is tested is that the engine goes on into the answer
    [answer] = create(client, THINKING_MODEL, reasoning_effort="low", max_tokens=40,
                      extra_body={"ignore_eos": True}).choices
    message = answer.message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and "</think>" not in reasoning and "<think>" not in reasoning
    assert message.content and "</think>" not in message.content   # the answer went on
    assert len(reasoning.split()) <= BUDGET_LOW + 2


def test_streamed_thinking_reassembles_to_the_whole_answer(client):
    whole = create(client, THINKING_MODEL, reasoning_effort="low", max_tokens=40).choices[0].message
    reasoning, content, calls, _ = reassemble(create(client, THINKING_MODEL, reasoning_effort="low",
                                                     max_tokens=40, stream=True))
    assert reasoning == whole.model_extra["reasoning_content"]
    assert content == whole.content and not calls


def test_effort_none_switches_the_thinking_off(client):
    [answer] = create(client, THINKING_MODEL, reasoning_effort="none", max_tokens=16).choices
    assert not answer.message.model_extra.get("reasoning_content")
    assert answer.message.content


def test_an_unbounded_effort_may_think_the_whole_answer(client):
    """high = -1 here: no bound, so the small model thinks until max_tokens."""
    [answer] = create(client, THINKING_MODEL, reasoning_effort="high", max_tokens=24).choices
    assert answer.finish_reason == "length"
    assert answer.message.model_extra["reasoning_content"]
    assert not answer.message.content


def test_thinking_then_a_forced_call(client):
    [answer] = create(client, THINKING_MODEL, tools=[WEATHER], tool_choice="required",
                      reasoning_effort="low", max_tokens=80).choices
    assert answer.finish_reason == "tool_calls"
    assert answer.message.model_extra["reasoning_content"]
    check_call(answer.message.tool_calls[0])


def test_a_bad_effort_is_a_400_naming_it(client):
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, THINKING_MODEL, reasoning_effort="extreme")
    assert caught.value.body["param"] == "reasoning_effort"
