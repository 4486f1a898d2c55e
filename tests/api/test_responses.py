"""/v1/responses: the Responses body into the typed chat request, and chat's answer and chunks back into
a Response and the typed events, each checked by the openai SDK's own types. The run is a
fake (tests/api/dialect_fakes.py): the translation is the layer under test."""
import asyncio

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from stackd.api.inference import openai_responses as oresp
from stackd.errors import DomainError
from stackd.http.errors import ApiError, ErrorKind

from .dialect_fakes import USAGE, FakeRun, answer, deltas, gather

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "get_weather", "description": "The weather.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}


def read(**body):
    return oresp.read({"model": "m", **body})


def refusal(call, *args) -> ApiError | DomainError:
    """A 400 of the parse: an ApiError, or the chat layer's DomainError (the grammar budget's)."""
    with pytest.raises((ApiError, DomainError)) as caught:
        call(*args)
    return caught.value


def test_a_string_input_and_instructions():
    req = oresp.request_of(read(input="Hi", instructions="Be brief.", max_output_tokens=9, stream=True))
    assert req.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert req.gen.max_tokens == 9 and req.gen.stream and req.gen.include_usage and req.gen.n == 1
    assert req.tools is None and req.names["messages"] == "input"


def test_items_become_chat_messages_with_calls_joining_the_assistant_turn():
    v = read(input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "tool"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.",
                                                             "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Lyon"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "function_call", "call_id": "c3", "name": "get_weather", "arguments": "{}"},
    ], tools=[TOOL], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False)
    req = oresp.request_of(v)
    call = lambda id_, args: {"id": id_, "type": "function", "function": {"name": "get_weather", "arguments": args}}
    assert req.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "reasoning_content": "tool",
         "tool_calls": [call("c1", '{"city":"Paris"}'), call("c2", '{"city":"Lyon"}')]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "", "tool_calls": [call("c3", "{}")]}]
    (tool,) = req.tools.tools
    assert (tool.name, tool.description, tool.parameters) == ("get_weather", "The weather.", TOOL["parameters"])
    assert (req.tools.choice, req.tools.named, req.tools.parallel) == ("required", "get_weather", False)


def test_text_format_and_reasoning_effort():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = oresp.request_of(read(input="x", text={"format": {"type": "json_schema", "name": "A", "schema": schema}},
                                reasoning={"effort": "low"}))
    assert "root ::=" in req.gen.grammar and req.gen.sampling.grammar == req.gen.grammar
    assert req.reasoning_effort == "low"
    assert oresp.request_of(read(input="x", text={"format": {"type": "json_object"}})).gen.grammar
    assert oresp.request_of(read(input="x", text={"format": {"type": "text"}})).gen.grammar == ""
    assert oresp.request_of(read(input="x", reasoning={"effort": "xhigh"})).reasoning_effort == "high"


def test_a_schema_that_matches_nothing_names_text_format():
    schema = {"type": "array", "minItems": 3, "maxItems": 1}
    error = refusal(oresp.request_of, read(input="x", text={"format": {"type": "json_schema", "schema": schema}}))
    assert error.param == "text.format.schema" and "'text.format.schema'" in error.message


@pytest.mark.parametrize("body, param, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
    ({"conversation": "conv_1"}, "conversation", "keeps no responses"),
    ({"background": True}, "background", "must be false"),
    ({"input": None}, "input", "required"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "unsupported input item"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0].type",
     "unsupported content part"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "must be"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id", "required"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].name", "required"),
    ({"tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "required"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "unsupported text format"),
    ({"max_output_tokens": 0}, "max_output_tokens", "between 1"),
    ({"temperature": 2.5}, "temperature", "between 0.0 and 2.0"),
    ({"reasoning": {"effort": "max"}}, "reasoning.effort", "must be"),
])
def test_a_bad_body_is_a_400_naming_the_field(body, param, words):
    error = refusal(oresp.read, {"model": "m", "input": "x", **body})
    assert error.kind is ErrorKind.INVALID_REQUEST and error.param == param and words in error.message


@pytest.mark.parametrize("body, param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
    ({"tools": [TOOL, TOOL]}, "tools[1].name"),
    ({"tools": [{**TOOL, "name": "get weather"}]}, "tools[0].name"),
    ({"tools": [{**TOOL, "parameters": {"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 1}}}}]},
     "tools[0].parameters"),
])
def test_tools_and_tool_choice_are_checked_in_the_responses_words(body, param):
    assert refusal(oresp.request_of, read(input="x", **body)).param == param


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_a_tool_choice_with_nothing_to_call_is_no_tools(choice):
    assert oresp.request_of(read(input="x", tool_choice=choice)).tools is None


def test_a_response_with_reasoning_text_and_calls():
    reply = oresp.Reply(read(input="x", tools=[TOOL]))
    obj = oresp.response_of(answer("Looking.", reasoning="hmm", finish="tool_calls",
                                calls=[("call_1", "get_weather", '{"city":"Paris"}')]), USAGE, reply)
    parsed = Response.model_validate(obj)
    assert parsed.status == "completed" and parsed.id.startswith("resp_") and parsed.incomplete_details is None
    assert [item.type for item in parsed.output] == ["reasoning", "message", "function_call"]
    assert parsed.output_text == "Looking."
    call = parsed.output[2]
    assert (call.call_id, call.name, call.arguments) == ("call_1", "get_weather", '{"city":"Paris"}')
    assert parsed.usage.input_tokens == 12 and parsed.usage.output_tokens == 7
    assert parsed.usage.input_tokens_details.cached_tokens == 2 and parsed.usage.total_tokens == 19
    assert parsed.tools[0].name == "get_weather" and parsed.tool_choice == "auto"


def test_max_output_tokens_makes_it_incomplete():
    parsed = Response.model_validate(oresp.response_of(answer("Once", finish="length"), USAGE, oresp.Reply(read(input="x"))))
    assert parsed.status == "incomplete" and parsed.incomplete_details.reason == "max_output_tokens"


def test_the_typed_events_of_reasoning_text_and_a_call():
    run = FakeRun(deltas=deltas(reasoning=["hm"], text=["Hel", "lo"], finish="tool_calls",
                                calls=[("call_1", "get_weather", ['{"city":', '"Paris"}'])]))
    events = asyncio.run(gather(oresp.events(run, oresp.Reply(read(input="x", tools=[TOOL])))))
    for name, data in events:
        assert EVENT.validate_python(data).type == name
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    added = {d["item"]["id"] for n, d in events if n == "response.output_item.added"}
    done = {d["item"]["id"] for n, d in events if n == "response.output_item.done"}
    assert added == done and len(added) == 3
    final = Response.model_validate(events[-1][1]["response"])
    assert final.output_text == "Hello" and final.output[2].arguments == '{"city":"Paris"}'
    assert events[-2][1]["item"]["status"] == "completed" and run.closed


def test_a_failure_after_the_head_is_an_error_then_response_failed():
    run = FakeRun(deltas=deltas(text=["a", "b", "c"]), fail_after=2)
    events = asyncio.run(gather(oresp.events(run, oresp.Reply(read(input="x")))))
    for name, data in events:
        assert EVENT.validate_python(data).type == name
    (n1, error), (n2, failed) = events[-2:]
    assert n1 == "error" and error["code"] == "service_unavailable_error"
    assert n2 == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == "the model's worker was lost" and run.closed
