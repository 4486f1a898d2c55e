"""Tool calling on /v1/chat/completions through the official openai SDK, against the real daemon
and the default SmolLM2 model (whose template has no tools: the generic JSON form)."""
import json

import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 2048\n"
          'isolation = "inline"\n')
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("tools") / "data"), CONFIG, models=True)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(daemon):
    return daemon.openai_client()


def create(client, **kwargs):
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=CHAT, temperature=0, **kwargs)


def check_weather_call(call):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit"} and isinstance(arguments["city"], str)
    assert arguments["unit"] in ("c", "f")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_call_is_well_formed_and_validates(client, choice):
    reply = create(client, tools=[WEATHER], tool_choice=choice)
    [answer] = reply.choices
    assert answer.finish_reason == "tool_calls"
    assert answer.message.content is None
    [call] = answer.message.tool_calls
    check_weather_call(call)


def test_named_choice_picks_that_function_among_several(client):
    reply = create(client, tools=[WEATHER, TIME],
                   tool_choice={"type": "function", "function": {"name": "get_time"}})
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_auto_answers_with_a_call_or_content(client):
    answer = create(client, tools=[WEATHER], tool_choice="auto").choices[0]
    if answer.message.tool_calls:
        assert answer.finish_reason == "tool_calls"
        check_weather_call(answer.message.tool_calls[0])
    else:
        assert isinstance(answer.message.content, str)


def test_none_is_a_plain_answer(client):
    answer = create(client, tools=[WEATHER], tool_choice="none", max_tokens=16).choices[0]
    assert answer.message.tool_calls is None and answer.message.content
    assert answer.finish_reason in ("stop", "length")


def test_parallel_calls_are_a_list(client):
    answer = create(client, tools=[WEATHER, TIME], tool_choice="required",
                    parallel_tool_calls=True).choices[0]
    assert answer.finish_reason == "tool_calls" and answer.message.tool_calls
    for call in answer.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)
    assert len({c.id for c in answer.message.tool_calls}) == len(answer.message.tool_calls)


def test_stream_carries_index_then_name_then_argument_fragments(client):
    whole = create(client, tools=[WEATHER], tool_choice="required").choices[0].message.tool_calls[0]
    chunks = list(create(client, tools=[WEATHER], tool_choice="required", stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id.startswith("call_") and first.type == "function"
    assert first.function.name == "get_weather"
    assert rest and all(c.index == 0 and c.function.name is None and c.id is None for c in rest)
    assert "".join(c.function.arguments for c in calls) == whole.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_the_sdk_reassembles_a_streamed_call(client):
    with client.beta.chat.completions.stream(model=CHAT, messages=ASK, tools=[WEATHER],
                                             tool_choice="required", temperature=0,
                                             max_tokens=120) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls
    check_weather_call(call)
    assert final.choices[0].finish_reason == "tool_calls"


def test_tool_result_turns_are_rendered_and_answered(client):
    call = create(client, tools=[WEATHER], tool_choice="required").choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    answer = create(client, messages=messages, tools=[WEATHER], tool_choice="none",
                    max_tokens=24).choices[0]
    assert answer.message.content and answer.message.tool_calls is None
    # without tools at all, the same turns render too
    answer = create(client, messages=messages, max_tokens=8).choices[0]
    assert answer.message.content


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"s": {"type": "string", "maxLength": 20000}}}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "$ref": "https://example.com/schema.json"}}}]}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"e": {"enum": list(range(300))}}}}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {f"p{j}": {"type": "string"} for j in range(40)}}}}
        for i in range(40)]}, "tools"),
])
def test_bad_tool_fields_are_400_naming_the_field(daemon, body, param):
    status, _, answer = daemon.request("POST", "/v1/chat/completions", port="inference",
                                       key=daemon.admin_key,
                                       body={"model": CHAT, "messages": ASK, "max_tokens": 4, **body})
    error = answer["error"]
    assert status == 400 and error["code"] == 400 and error["type"] == "invalid_request_error", answer
    assert error["param"] == param, error
