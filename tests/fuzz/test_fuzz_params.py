"""Fuzz: request JSON -> server.inference.params.parse (validated parameters -> grammar).

Property: any JSON body is turned into generation parameters or refused with an ApiError
whose status is a 4xx; never another exception (that would be a 500). Bodies are built
around the fields parse reads, with values of every JSON type, and JSON schemas for
`response_format` made of the keywords llama-cpp-python's schema converter knows. Sizes in
schemas stay small here: how big a schema may be is the grammar budget's business.
"""
from __future__ import annotations

import orjson
import pytest
from hypothesis import strategies as st

from stackd.api.errors import answer_of

from tests.answers import ANSWERED
from stackd.api.inference import params

from .budget import fuzz

pytestmark = pytest.mark.fuzz

FIELDS = ["max_tokens", "max_completion_tokens", "stream", "stream_options", "logprobs", "top_logprobs",
          "seed", "user", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
          "repeat_penalty", "logit_bias", "min_tokens", "ignore_eos", "stop", "n", "response_format"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                    st.sampled_from([0, 1, -1, 2, 16, 17, 20, 21, 256, 257, 1 << 20, (1 << 20) + 1, 2 ** 63 - 1]),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0.0, -0.0, 1e-300, 2.0, 2.0000001, 100.0, -100.0, 100.5]),
                    st.text(max_size=12), st.sampled_from(["", "1", "-1", "0x10", "1e3", " 7", "١", "49151", "49152"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                            st.dictionaries(st.text(max_size=6), inner, max_size=5)),
                           max_leaves=15)

SMALL = st.integers(-2, 40)
schema_leaf = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "number", "boolean", "null", "object",
                                                    "array", "nope"])},
                          optional={"minLength": SMALL, "maxLength": SMALL, "minimum": SMALL, "maximum": SMALL,
                                    "pattern": st.sampled_from(["^a+$", "[0-9]{2,3}", "(", "\\d", "a|b", ".*"]),
                                    "format": st.sampled_from(["date", "time", "date-time", "uuid", "email", "x"]),
                                    "enum": st.lists(scalars, max_size=4), "const": scalars}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#/definitions/a", "#/$defs/x", "#",
                                                    "#/properties/0", "x"])}),   # no https: $ref: the converter would fetch it
    json_values)


def schema_nodes(inner):
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("object")},
                              optional={"properties": st.dictionaries(st.text(max_size=5), inner, max_size=4),
                                        "required": st.lists(st.text(max_size=5), max_size=3),
                                        "additionalProperties": st.one_of(st.booleans(), inner),
                                        "definitions": st.dictionaries(st.sampled_from(["a", "b"]), inner),
                                        "$defs": st.dictionaries(st.sampled_from(["x"]), inner)}),
        st.fixed_dictionaries({"type": st.just("array")},
                              optional={"items": st.one_of(inner, st.lists(inner, max_size=3)),
                                        "prefixItems": st.lists(inner, max_size=3),
                                        "minItems": SMALL, "maxItems": SMALL}),
        st.fixed_dictionaries({st.sampled_from(["anyOf", "oneOf", "allOf"]): st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"type": st.lists(st.sampled_from(["string", "null", "integer"]), max_size=3)}))


schemas = st.recursive(schema_leaf, schema_nodes, max_leaves=10)
response_formats = st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "xml", None])},
                          optional={"json_schema": st.one_of(st.fixed_dictionaries({"schema": schemas},
                                                                                   optional={"name": scalars}),
                                                             json_values)}),
    json_values)

FLOATS = dict(allow_nan=False, allow_infinity=False)
VALID = {   # a value parse accepts, so that most bodies get as far as the grammar
    "max_tokens": st.integers(1, 1 << 20), "max_completion_tokens": st.integers(1, 1 << 20),
    "stream": st.booleans(), "stream_options": st.none(), "logprobs": st.none(), "top_logprobs": st.none(),
    "seed": st.integers(-(2 ** 63), 2 ** 63 - 1), "user": st.text(max_size=8),
    "temperature": st.floats(0, 2, **FLOATS), "top_p": st.floats(0, 1, **FLOATS), "top_k": st.integers(0, 1),
    "min_p": st.floats(0, 1, **FLOATS), "presence_penalty": st.floats(-2, 2, **FLOATS),
    "frequency_penalty": st.floats(-2, 2, **FLOATS), "repeat_penalty": st.floats(0.01, 10, **FLOATS),
    "logit_bias": st.dictionaries(st.just("0"), st.floats(-100, 100, **FLOATS)),
    "min_tokens": st.integers(0, 64), "ignore_eos": st.booleans(),
    "stop": st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=4), "n": st.integers(1, 16),
    "response_format": st.fixed_dictionaries({"type": st.just("json_schema"),
                                              "json_schema": st.fixed_dictionaries({"schema": schemas})}),
}
HOSTILE = {"response_format": response_formats,
           "logit_bias": st.one_of(st.dictionaries(st.one_of(st.text(max_size=6), st.integers(-3, 49155).map(str)),
                                                   scalars, max_size=4), json_values),
           "stop": st.one_of(st.lists(st.text(max_size=6), max_size=6), json_values),
           "stream_options": st.one_of(st.fixed_dictionaries({}, optional={"include_usage": scalars}), json_values)}


@st.composite
def valid_but_one(draw) -> dict:
    """Valid values for some fields, then at most one field (maybe) hostile."""
    request = draw(st.fixed_dictionaries({}, optional=VALID))
    if draw(st.booleans()):
        name = draw(st.sampled_from(FIELDS))
        request[name] = draw(HOSTILE.get(name, json_values))
    return request


body = st.one_of(valid_but_one(), valid_but_one(),
                 st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), json_values, max_size=6))


def parsed_or_4xx(drawn) -> None:
    request, n_vocab, chat = drawn
    try:
        request = orjson.loads(orjson.dumps(request))      # only what a JSON body can hold
    except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError):
        return
    try:
        params.parse(request, n_vocab=n_vocab, chat=chat)
    except ANSWERED as exc:
        exc = answer_of(exc)
        assert 400 <= exc.kind.status < 500, (exc.kind, exc.message)


def test_request_json_is_parsed_or_refused_with_a_4xx(fuzz_seconds):
    fuzz(st.tuples(body, st.sampled_from([49152, 30522, 1, 2]), st.booleans()), parsed_or_4xx,
         seconds=fuzz_seconds, batch=100)


# ---- tools: `tools` and `tool_choice` -> the tool request -> its grammar ------------------------

function_tool = st.fixed_dictionaries(
    {"type": st.one_of(st.just("function"), scalars)},
    optional={"function": st.one_of(
        st.fixed_dictionaries({"name": st.one_of(st.sampled_from(["f", "get_weather", "a-b_9"]), scalars)},
                              optional={"description": scalars, "parameters": st.one_of(schemas, json_values),
                                        "strict": scalars}),
        json_values)})
tool_choices = st.one_of(st.sampled_from(["none", "auto", "required", "any", ""]),
                         st.fixed_dictionaries({"type": st.just("function"),
                                                "function": st.fixed_dictionaries(
                                                    {"name": st.sampled_from(["f", "g", "get_weather"])})}),
                         json_values)
tool_bodies = st.fixed_dictionaries({}, optional={
    "tools": st.one_of(st.lists(function_tool, max_size=3), json_values),
    "tool_choice": tool_choices, "parallel_tool_calls": scalars})


def tools_read_or_4xx(request: dict) -> None:
    from stackd.api.inference import tools as tool_params
    from stackd.chat import tools as chat_tools
    try:
        request = orjson.loads(orjson.dumps(request))
    except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError):
        return
    try:
        tool_request = tool_params.read(request)
        if tool_request is not None and tool_request.active:
            chat_tools.generic_grammar(tool_request)
    except ANSWERED as exc:
        exc = answer_of(exc)
        assert 400 <= exc.kind.status < 500, (exc.kind, exc.message)


def test_tool_bodies_become_a_grammar_or_a_4xx(fuzz_seconds):
    fuzz(tool_bodies, tools_read_or_4xx, seconds=fuzz_seconds, batch=50)


def parsed_whole_and_in_pieces(text: str) -> None:
    """Whatever a model writes, the generic tool-call reader reads it (whole and streamed in
    pieces) without raising: a call it cannot finish is content."""
    from stackd.serving.reader import Reader
    from stackd.chat import tools as chat_tools
    chat_tools.parse_generic(text)
    reader = Reader(lambda so_far, final: chat_tools.parse_generic(so_far))
    for i in range(0, len(text), 5):
        reader.feed(text[i:i + 5])
    Reader(lambda so_far, final: chat_tools.parse_generic(so_far)).message(text, "stop", None, None)


model_texts = st.one_of(
    st.text(max_size=80),
    st.builds(lambda a, b: a + b, st.sampled_from(['{"tool_call": {"name": "f", "arguments": ',
                                                   '{"tool_calls": [{"name": "f", "arguments": {',
                                                   '{"response": "', '{"tool_call": {"name": "']),
              st.text(alphabet='{}[]":,\\ ab1\n', max_size=40)))


def test_model_output_is_read_whole_and_streamed_without_raising(fuzz_seconds):
    fuzz(model_texts, parsed_whole_and_in_pieces, seconds=fuzz_seconds, batch=100)
