"""Tools and the Responses API through the official openai SDK, unchanged."""
import json

from .conftest import CHAT
from .tools import ADD, TOOLS, WEATHER, arguments_of

ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
# Greedy where a test needs the call to end within max_tokens (test_anthropic_sdk.py says why).


def test_required_tool_choice_returns_a_call_that_matches_the_schema(openai_client):
    reply = openai_client.chat.completions.create(
        model=CHAT, messages=ASK_WEATHER, tools=TOOLS, tool_choice="required", max_tokens=128,
        temperature=0)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls", choice.message
    [call, *_] = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name in ("get_weather", "add")
    arguments_of(call.function.name, call.function.arguments)


def test_named_tool_choice_calls_that_tool(openai_client):
    reply = openai_client.chat.completions.create(
        model=CHAT, messages=[{"role": "user", "content": "What is two plus three?"}], tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=128,
        temperature=0)
    [choice] = reply.choices
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.function.name == "add"
    args = arguments_of("add", call.function.arguments)
    assert isinstance(args["a"], int) and isinstance(args["b"], int)


def test_tool_choice_none_answers_in_text(openai_client):
    reply = openai_client.chat.completions.create(
        model=CHAT, messages=ASK_WEATHER, tools=TOOLS, tool_choice="none", max_tokens=24)
    [choice] = reply.choices
    assert not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length") and choice.message.content


def test_streamed_tool_call_is_reassembled_by_the_sdk(openai_client):
    with openai_client.chat.completions.stream(
            model=CHAT, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required",
            max_tokens=128, temperature=0) as stream:
        deltas = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls", choice.message
    [call] = choice.message.tool_calls
    assert call.id and call.function.name == "get_weather"
    assert arguments_of("get_weather", call.function.arguments)["city"]
    assert deltas, "the arguments arrive as deltas"
    assert "".join(d.arguments_delta for d in deltas) == call.function.arguments


def test_raw_stream_sends_index_id_and_name_before_the_arguments(openai_client):
    chunks = list(openai_client.chat.completions.create(
        model=CHAT, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=128,
        temperature=0, stream=True))
    calls = [call for chunk in chunks for choice in chunk.choices
             for call in (choice.delta.tool_calls or [])]
    assert calls and calls[0].index == 0 and calls[0].id and calls[0].function.name == "get_weather"
    assert all(c.index == 0 for c in calls)
    arguments = "".join(c.function.arguments or "" for c in calls)
    arguments_of("get_weather", arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls", arguments


def test_a_tool_result_turn_is_answered(openai_client):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    messages = ASK_WEATHER + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees celsius."},
    ]
    reply = openai_client.chat.completions.create(model=CHAT, messages=messages, tools=TOOLS,
                                                  max_tokens=48, temperature=0)
    [choice] = reply.choices
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    without_result = openai_client.chat.completions.create(
        model=CHAT, messages=ASK_WEATHER, tools=TOOLS, max_tokens=1)
    assert reply.usage.prompt_tokens > without_result.usage.prompt_tokens


def test_plain_chat_is_unchanged_by_the_tool_path(openai_client):
    reply = openai_client.chat.completions.create(model=CHAT, messages=ASK_WEATHER, max_tokens=16,
                                                  temperature=0)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls


def test_responses_text(openai_client):
    response = openai_client.responses.create(model=CHAT, input="Say hello.", max_output_tokens=24,
                                              instructions="Answer briefly.")
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


def test_responses_function_call_and_its_output(openai_client):
    tools = [{"type": "function", "name": ADD["function"]["name"],
              "description": ADD["function"]["description"],
              "parameters": ADD["function"]["parameters"]}]
    response = openai_client.responses.create(
        model=CHAT, input="What is two plus three?", tools=tools, tool_choice="required",
        max_output_tokens=128)
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls and calls[0].name == "add" and calls[0].call_id
    arguments_of("add", calls[0].arguments)
    follow_up = openai_client.responses.create(
        model=CHAT, tools=tools, max_output_tokens=24,
        input=[{"role": "user", "content": "What is two plus three?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "add",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "5"}])
    assert follow_up.status in ("completed", "incomplete")


def test_responses_stream_events(openai_client):
    # the SDK's stream helper needs response.completed: room enough for the whole answer
    with openai_client.responses.stream(model=CHAT, input="Say hello.", max_output_tokens=256,
                                        temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    assert final.output_text
