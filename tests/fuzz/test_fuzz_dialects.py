"""Fuzz: /v1/responses and /v1/messages bodies -> their checks and their parse into the typed
chat request (serving/request.py), then the checks made once the model is known (the vocabulary).

Property: any JSON body is parsed or refused with an ApiError whose status is a 4xx, never
another exception (that would be a 500); and a body the dialect accepts gives a request whose
turns the template can take (a role chat knows, text content). Bodies are built around the fields the dialects read: items,
blocks and tools mostly well-formed, with hostile values of every JSON type spliced in.
"""
from __future__ import annotations

import orjson
import pytest
from hypothesis import strategies as st

from stackd.api.errors import answer_of
from stackd.api.inference import anthropic_messages, chat, openai_responses, params
from stackd.serving.request import ChatRequest

from tests.answers import ANSWERED

from .budget import fuzz
from .test_fuzz_params import json_values, scalars, schemas

pytestmark = pytest.mark.fuzz

text = st.one_of(st.text(max_size=8), scalars)
obj = st.one_of(st.dictionaries(st.text(max_size=5), json_values, max_size=3), schemas, json_values)


def maybe(strategy):
    """Mostly the strategy, sometimes any JSON value."""
    return st.one_of(strategy, strategy, strategy, json_values)


# ---- Responses --------------------------------------------------------------------------------

parts = st.lists(maybe(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                                               "text": text})), max_size=3)
items = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
                           "content": st.one_of(text, parts)}, optional={"type": st.sampled_from(["message", None])}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text, "name": text, "arguments": text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text,
                           "output": st.one_of(text, parts)}),
    st.fixed_dictionaries({"type": st.just("reasoning")}, optional={"content": parts, "summary": parts}),
    json_values)
function_tool = st.fixed_dictionaries({"type": st.sampled_from(["function", "web_search"]), "name": text},
                                      optional={"parameters": obj, "description": text, "strict": scalars})
RESPONSES = {
    "model": st.just("m"), "input": st.one_of(text, st.lists(maybe(items), max_size=6)),
    "instructions": text, "tools": maybe(st.lists(maybe(function_tool), max_size=3)),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                             st.fixed_dictionaries({"type": st.just("function"), "name": text}), json_values),
    "parallel_tool_calls": scalars,
    "text": maybe(st.fixed_dictionaries({"format": maybe(st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema", "yaml"])},
        optional={"schema": schemas, "name": text, "strict": scalars}))})),
    "reasoning": maybe(st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "max", ""])})),
    "max_output_tokens": scalars, "temperature": scalars, "top_p": scalars, "stream": scalars,
    "store": scalars, "previous_response_id": scalars, "conversation": scalars, "background": scalars,
    "metadata": json_values, "user": scalars}

# ---- Anthropic messages -----------------------------------------------------------------------

text_blocks = st.lists(maybe(st.fixed_dictionaries({"type": st.just("text"), "text": text})), max_size=3)
blocks = st.lists(maybe(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image"]), "text": text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": text, "input": obj}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text},
                          optional={"content": st.one_of(text, text_blocks), "is_error": scalars}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text}, optional={"signature": text}),
)), max_size=4)
messages = st.lists(maybe(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                                 "content": st.one_of(text, blocks)})), max_size=5)
tool = st.fixed_dictionaries({"name": text, "input_schema": obj},
                             optional={"description": text, "type": st.sampled_from(["custom", "bash_20250124"])})
MESSAGES = {
    "model": st.just("m"), "max_tokens": st.one_of(st.integers(1, 64), scalars), "messages": maybe(messages),
    "system": st.one_of(text, text_blocks), "stop_sequences": maybe(st.lists(text, max_size=5)),
    "temperature": scalars, "top_p": scalars, "top_k": scalars, "stream": scalars, "metadata": json_values,
    "tools": maybe(st.lists(maybe(tool), max_size=3)),
    "tool_choice": maybe(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none", "x"])},
                                               optional={"name": text, "disable_parallel_tool_use": scalars})),
}


# well-formed values, so that most bodies get as far as the translation and chat's checks
words = st.text(max_size=8)
VALID_RESPONSES = {
    "input": st.one_of(words, st.lists(st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]), "content": words}),
        st.fixed_dictionaries({"type": st.just("function_call"), "call_id": words.filter(bool),
                               "name": words.filter(bool), "arguments": words}),
        st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": words.filter(bool),
                               "output": words})), min_size=1, max_size=5)),
    "instructions": words, "max_output_tokens": st.integers(1, 64), "stream": st.booleans(),
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": st.just("f")},
                                            optional={"parameters": schemas}), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none"]), "temperature": st.floats(0, 2),
    "text": st.fixed_dictionaries({"format": st.fixed_dictionaries({"type": st.just("json_schema"),
                                                                    "schema": schemas})}),
}
VALID_MESSAGES = {
    "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.one_of(
        words, st.lists(st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": words}),
            st.fixed_dictionaries({"type": st.just("tool_use"), "id": words.filter(bool), "name": st.just("f"),
                                   "input": st.dictionaries(words, words, max_size=2)}),
            st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": words.filter(bool),
                                   "content": words})), max_size=3))}), min_size=1, max_size=4),
    "system": words, "stop_sequences": st.lists(words.filter(bool), max_size=4), "stream": st.booleans(),
    "tools": st.lists(st.fixed_dictionaries({"name": st.just("f"), "input_schema": schemas}), max_size=2),
    "tool_choice": st.fixed_dictionaries({"type": st.sampled_from(["auto", "none"])}),
    "temperature": st.floats(0, 1), "top_k": st.integers(0, 100),
}


@st.composite
def valid_but_one(draw, valid: dict, hostile: dict, required: dict) -> dict:
    """Valid values for the required fields and some others, then at most one field (maybe)
    hostile."""
    body = draw(st.fixed_dictionaries(required, optional=valid))
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(hostile)))
        body[name] = draw(hostile[name])
    return body


def read_responses(body: dict) -> ChatRequest:
    return openai_responses.request_of(openai_responses.read(body))


def read_messages(body: dict) -> ChatRequest:
    return anthropic_messages.request_of(anthropic_messages.READ.read(body))


def read_count(body: dict) -> ChatRequest:
    return anthropic_messages.request_of(anthropic_messages.READ_COUNT.read(body))


def translated_or_4xx(drawn) -> None:
    translate, body = drawn
    try:
        body = orjson.loads(orjson.dumps(body))           # only what a JSON body can hold
    except (orjson.JSONEncodeError, orjson.JSONDecodeError, TypeError):
        return
    try:
        request = translate(body)
        params.check_vocabulary(request.gen, 49152, request.name_of("top_k"))
        assert all(m["role"] in chat.ROLES and isinstance(m["content"], str) for m in request.messages)
    except ANSWERED as exc:
        exc = answer_of(exc)
        assert 400 <= exc.kind.status < 500, (exc.kind, exc.message)


MODEL = {"model": st.just("m")}
bodies = st.one_of(
    st.tuples(st.just(read_responses), valid_but_one(VALID_RESPONSES, RESPONSES, MODEL)),
    st.tuples(st.just(read_messages), valid_but_one(VALID_MESSAGES, MESSAGES, {**MODEL, "max_tokens": st.just(8)})),
    st.tuples(st.just(read_count), valid_but_one(VALID_MESSAGES, MESSAGES, MODEL)),
    st.tuples(st.just(read_responses), st.fixed_dictionaries({}, optional=RESPONSES)),
    st.tuples(st.just(read_messages), st.fixed_dictionaries({}, optional=MESSAGES)),
    st.tuples(st.just(read_count), st.fixed_dictionaries({}, optional=MESSAGES)),
    st.tuples(st.sampled_from([read_responses, read_messages, read_count]),
              st.dictionaries(st.sampled_from(sorted({*RESPONSES, *MESSAGES})) | st.text(max_size=6),
                              json_values, max_size=6)))


def test_dialect_bodies_are_translated_or_refused_with_a_4xx(fuzz_seconds):
    fuzz(bodies, translated_or_4xx, seconds=fuzz_seconds, batch=100)
