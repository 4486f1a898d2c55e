"""The generic JSON tool form: prompt rewriting, grammar budget, and reading answers (whole and
while they grow)."""
import json

import pytest

from stackd.chat import tools
from stackd.errors import DomainError

WEATHER = tools.Tool("get_weather", "The weather", {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]})


def test_whole_call_keeps_the_models_argument_text():
    text = '{"tool_call": {"name": "get_weather", "arguments": { "city": "Par\\"is" }}}'
    message, complete = tools.parse_generic(text)
    assert complete and message.calls[0].name == "get_weather"
    assert message.calls[0].arguments == '{ "city": "Par\\"is" }'
    assert json.loads(message.calls[0].arguments) == {"city": 'Par"is'}


def test_every_prefix_reads_as_a_prefix_of_the_whole():
    text = ('{"tool_calls": [{"name": "a", "arguments": {"x": [1, {"y": "}"}]}}, '
            '{"name": "b", "arguments": {}}]}')
    whole, _ = tools.parse_generic(text)
    assert [c.name for c in whole.calls] == ["a", "b"]
    for cut in range(len(text)):
        part, complete = tools.parse_generic(text[:cut])
        assert not complete
        for got, final in zip(part.calls, whole.calls):
            assert got.name == final.name and final.arguments.startswith(got.arguments)


def test_response_content_streams_decoded_even_mid_escape():
    text = '{"response": "caf\\u00e9 \\"ok\\"\\n"}'
    seen = ""
    for cut in range(len(text) + 1):
        message, _ = tools.parse_generic(text[:cut])
        assert message.content.startswith(seen)
        seen = message.content
    assert seen == 'café "ok"\n'


def test_deep_arguments_do_not_recurse():
    deep = "[" * 100000 + "]" * 100000
    message, complete = tools.parse_generic('{"tool_call": {"name": "f", "arguments": ' + deep + "}}")
    assert complete and message.calls[0].arguments == deep


def test_turns_are_rewritten_for_templates_without_tools():
    request = tools.ToolRequest((WEATHER,), "auto")
    messages = tools.generic_messages([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "X"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], request)
    assert messages[0]["content"].startswith("Be brief.\n\nYou can call any of the following tools")
    assert "get_weather" in messages[0]["content"]
    assert json.loads(messages[2]["content"])["tool_calls"][0]["arguments"] == {"city": "X"}
    assert messages[3]["role"] == "user"
    assert json.loads(messages[3]["content"])["tool_response"]["tool_call_id"] == "call_1"


def test_named_choice_offers_only_that_function():
    other = tools.Tool("other", "", dict(tools.NO_PARAMETERS))
    schema = tools.generic_schema(tools.ToolRequest((WEATHER, other), "required", "other"))
    assert schema["properties"]["tool_call"]["properties"]["name"] == {"const": "other"}


def test_the_combined_grammar_is_held_to_the_budget():
    many = tuple(tools.Tool(f"f{i}", "", {"type": "object", "properties": {
        f"p{j}": {"type": "string"} for j in range(40)}}) for i in range(40))
    with pytest.raises(DomainError) as refused:
        tools.generic_grammar(tools.ToolRequest(many, "auto"))
    assert refused.value.param == "tools" and "grammar_max_" in refused.value.message
