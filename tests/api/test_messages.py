"""/v1/messages: Anthropic's body into the typed chat request, and chat's answer and chunks back into a
Message and Anthropic's events, each checked by the anthropic SDK's own types. The run is a
fake (tests/api/dialect_fakes.py): the translation is the layer under test."""
import asyncio

import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent

from stackd.api.inference import anthropic_messages as am
from stackd.auth import permissions
from stackd.auth.guard import KeyGuard
from stackd.auth.keys import KeyStore
from stackd.auth.ratelimit import RateLimiter
from stackd.errors import DomainError
from stackd.http.errors import ApiError, ErrorKind
from stackd.http.request import Session

from .dialect_fakes import USAGE, FakeRun, answer, deltas, gather

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
TOOL = {"name": "get_weather", "description": "The weather.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def read(**body):
    return am.READ.read({"model": "m", "max_tokens": 16, **body})


def refusal(call, *args) -> ApiError | DomainError:
    """A 400 of the parse: an ApiError, or the chat layer's DomainError (the grammar budget's)."""
    with pytest.raises((ApiError, DomainError)) as caught:
        call(*args)
    return caught.value


def test_system_text_tool_use_and_tool_result_become_chat_messages():
    v = read(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}], messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": ""},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
            {"type": "text", "text": "And tomorrow?"}]}], tools=[TOOL], tool_choice={"type": "auto"})
    req = am.request_of(v)
    assert req.messages == [
        {"role": "system", "content": "Be brief.\nBe kind."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning_content": "use the tool", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"}]
    (tool,) = req.tools.tools
    assert (tool.name, tool.description, tool.parameters) == ("get_weather", "The weather.", TOOL["input_schema"])
    assert req.tools.choice == "auto" and req.gen.max_tokens == 16 and not req.gen.stream


@pytest.mark.parametrize("choice, chat, named", [
    ({"type": "auto"}, "auto", None), ({"type": "any"}, "required", None), ({"type": "none"}, "none", None),
    ({"type": "tool", "name": "get_weather"}, "required", "get_weather")])
def test_tool_choice_maps_to_chat(choice, chat, named):
    tools = am.request_of(read(messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice=choice)).tools
    assert (tools.choice, tools.named) == (chat, named)


def test_disable_parallel_tool_use_stop_sequences_and_sampling():
    req = am.request_of(read(messages=[{"role": "user", "content": "x"}], tools=[TOOL],
                             tool_choice={"type": "any", "disable_parallel_tool_use": True},
                             stop_sequences=["\n\n"], temperature=0.5, top_k=5), stream=True)
    assert req.tools.parallel is False and req.gen.stop == ["\n\n"]
    assert req.gen.include_usage and req.gen.sampling.temperature == 0.5 and req.gen.sampling.top_k == 5
    default = am.request_of(read(messages=[{"role": "user", "content": "x"}], tools=[TOOL]))
    assert default.tools.parallel is True and default.gen.sampling.top_k == 40


@pytest.mark.parametrize("body, param, words", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type", "unsupported content block"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "'user' or 'assistant'"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens", "between 1"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": None}, "max_tokens", "required"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature", "between 0.0 and 1.0"),
    ({"messages": [{"role": "user", "content": "x"}], "stop_sequences": ["a"] * 5}, "stop_sequences", "at most 4"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "tools[0].input_schema", "required"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{**TOOL, "type": "web_search_20250305"}]},
     "tools[0].type", "'custom'"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}},
     "tool_choice.type", "unsupported tool choice"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "messages[0].content[0].input", "required"),
    ({"messages": []}, "messages", "must not be empty"),
])
def test_a_bad_body_is_a_400_naming_the_field(body, param, words):
    error = refusal(am.READ.read, {"model": "m", "max_tokens": 16, **body})
    assert error.kind is ErrorKind.INVALID_REQUEST and error.param == param and words in error.message


@pytest.mark.parametrize("messages, tools, choice, param", [
    ([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}], None, None,
     "messages[0].content[0]"),
    ([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}], None, None,
     "messages[0].content[0]"),
    ([{"role": "user", "content": "x"}], None, {"type": "any"}, "tool_choice"),
    ([{"role": "user", "content": "x"}], [TOOL], {"type": "tool", "name": "other"}, "tool_choice.name"),
    ([{"role": "user", "content": "x"}], [TOOL, TOOL], None, "tools[1].name"),
    ([{"role": "user", "content": "x"}], [{**TOOL, "input_schema": {"type": "object", "properties": {
        "a": {"type": "array", "minItems": 3, "maxItems": 1}}}}], None, "tools[0].input_schema"),
])
def test_blocks_in_the_wrong_turn_and_unknown_tools_are_400s(messages, tools, choice, param):
    error = refusal(am.request_of, read(messages=messages, tools=tools, tool_choice=choice))
    assert error.param == param


def test_an_answer_with_tool_calls_is_a_tool_use_message():
    message = am.message_of(answer("Looking.", reasoning="hmm", finish="tool_calls",
                                   calls=[("call_1", "get_weather", '{"city": "Paris"}')]), USAGE, "m")
    parsed = Message.model_validate(message)
    assert [b.type for b in parsed.content] == ["thinking", "text", "tool_use"]
    assert parsed.content[2].input == {"city": "Paris"} and parsed.content[2].id == "call_1"
    assert parsed.stop_reason == "tool_use" and parsed.id.startswith("msg_")
    assert parsed.usage.input_tokens == 10 and parsed.usage.cache_read_input_tokens == 2
    assert parsed.usage.output_tokens == 7


@pytest.mark.parametrize("finish, reason", [("stop", "end_turn"), ("length", "max_tokens")])
def test_stop_reasons(finish, reason):
    assert Message.model_validate(am.message_of(answer("hi", finish=finish), USAGE, "m")).stop_reason == reason


def test_a_stop_string_is_the_stop_sequence_in_the_message_and_its_events():
    finished = answer("The end", finish="stop")
    finished.stop = "###"
    message = Message.model_validate(am.message_of(finished, USAGE, "m"))
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == "###"
    plain = Message.model_validate(am.message_of(answer("The end", finish="stop"), USAGE, "m"))
    assert plain.stop_reason == "end_turn" and plain.stop_sequence is None
    called = answer(calls=[("c", "f", "{}")], finish="tool_calls")
    called.stop = "###"
    tool_use = Message.model_validate(am.message_of(called, USAGE, "m"))
    assert tool_use.stop_reason == "tool_use" and tool_use.stop_sequence is None   # not what ended it

    chunks = deltas(text=["The", " end"], finish="stop")
    run = FakeRun(deltas=chunks[:-1])
    run.finish_step = ("stop", "###")
    events = asyncio.run(gather(am.events(run, "m")))
    delta = events[-2][1]
    assert EVENT.validate_python(delta).type == "message_delta"
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "###"}


def test_arguments_that_are_not_an_object_are_kept():
    message = am.message_of(answer(calls=[("c", "f", "not json")], finish="tool_calls"), USAGE, "m")
    assert message["content"][0]["input"] == {"arguments": "not json"}


def test_the_event_sequence_of_reasoning_text_and_a_tool_call():
    run = FakeRun(deltas=deltas(reasoning=["th", "ink"], text=["Hel", "lo"],
                                calls=[("call_1", "get_weather", ['{"city": ', '"Paris"}'])],
                                finish="tool_calls"))
    events = asyncio.run(gather(am.events(run, "m")))
    for name, data in events:
        assert EVENT.validate_python(data).type == name
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    starts = [data["content_block"] for name, data in events if name == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"]
    assert starts[2] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    json_deltas = [d["delta"]["partial_json"] for n, d in events
                   if n == "content_block_delta" and d["index"] == 2]
    assert "".join(json_deltas) == '{"city": "Paris"}'
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"]["output_tokens"] == 7 and run.closed


def test_a_failure_after_the_head_is_an_error_event():
    run = FakeRun(deltas=deltas(text=["a", "b", "c"]), fail_after=2)
    events = asyncio.run(gather(am.events(run, "m")))
    name, data = events[-1]
    assert name == "error" and data == {"type": "error", "error": {
        "type": "overloaded_error", "message": "the model's worker was lost", "code": 503}}
    assert run.closed


@pytest.mark.parametrize("kind, anthropic_type", [
    (ErrorKind.INVALID_REQUEST, "invalid_request_error"), (ErrorKind.AUTHENTICATION, "authentication_error"),
    (ErrorKind.PERMISSION, "permission_error"), (ErrorKind.MODEL_NOT_FOUND, "not_found_error"),
    (ErrorKind.RATE_LIMIT, "rate_limit_error"), (ErrorKind.CONTEXT_LENGTH_EXCEEDED, "invalid_request_error"),
    (ErrorKind.INTERNAL, "api_error"), (ErrorKind.UNAVAILABLE, "overloaded_error"),
    (ErrorKind.INSUFFICIENT_MEMORY, "api_error")])
def test_errors_in_anthropic_s_shape_keep_the_code(kind, anthropic_type):
    body = am.error_body(ApiError(kind, "no", param="f"))
    assert body == {"type": "error", "error": {"type": anthropic_type, "message": "no",
                                               "code": kind.status, "param": "f"}}


# ---- the key as x-api-key ----------------------------------------------------------------------

class Route:
    permission, group = permissions.INFERENCE, "inference"

    def __init__(self, credential_header=None):
        self.credential_header = credential_header


class Request:
    def __init__(self, headers):
        self.headers, self.session, self.key, self.rate_headers = headers, Session(), None, b""


@pytest.fixture
def guard(tmp_path):
    store = KeyStore(str(tmp_path))
    guard = KeyGuard(store, RateLimiter({}))
    guard.key = store.create("client", frozenset([permissions.INFERENCE]))[1]
    guard.other = store.create("reader", frozenset([permissions.CLUSTER_READ]))[1]
    return guard


def test_x_api_key_is_the_same_key_on_a_route_that_takes_it(guard):
    request = Request({b"x-api-key": guard.key.encode()})
    guard(request, Route(b"x-api-key"))
    assert request.key.name == "client"


def test_x_api_key_is_not_read_where_the_route_does_not_take_it(guard):
    error = refusal(guard, Request({b"x-api-key": guard.key.encode()}), Route())
    assert error.kind is ErrorKind.AUTHENTICATION and "Authorization" in error.message


@pytest.mark.parametrize("value, kind", [(b"sk-wrong", ErrorKind.AUTHENTICATION),
                                         (b"", ErrorKind.AUTHENTICATION),
                                         (b"Bearer sk-x", ErrorKind.AUTHENTICATION)])
def test_a_bad_x_api_key_is_a_401(guard, value, kind):
    assert refusal(guard, Request({b"x-api-key": value}), Route(b"x-api-key")).kind is kind


def test_x_api_key_carries_the_key_s_permissions(guard):
    error = refusal(guard, Request({b"x-api-key": guard.other.encode()}), Route(b"x-api-key"))
    assert error.kind is ErrorKind.PERMISSION


def test_without_either_header_the_401_names_both(guard):
    error = refusal(guard, Request({}), Route(b"x-api-key"))
    assert "Authorization: Bearer" in error.message and "x-api-key" in error.message
