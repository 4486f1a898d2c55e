"""JSON Schemas of what /v1/responses and /v1/messages answer, for the OpenAPI document (the
request side is described by the specs the handlers read). Both stream named server-sent
events: `event:` is the event's type and `data:` a JSON object with the same `type`."""
from __future__ import annotations

from ...http.openapi import json_answer
from .schemas import INT, NULL, NUM, STR, nullable, obj

ANY_OBJECT = {"type": "object"}


def named_events(description: str, event: dict) -> dict:
    """A text/event-stream whose events carry a name and a JSON `data` (no [DONE])."""
    return {"text/event-stream": {"schema": {
        "type": "object", "required": ["event", "data"], "properties": {
            "event": STR,
            "data": {"type": "string", "description": description,
                     "contentMediaType": "application/json", "contentSchema": event}}}}}


def streamed(schema: dict, description: str, events: str, event: dict) -> dict:
    answer = json_answer(schema, description)
    answer["content"].update(named_events(events, event))
    return answer


# ---- Anthropic --------------------------------------------------------------------------------

ANTHROPIC_USAGE = obj({"input_tokens": INT, "output_tokens": INT},
                      {"cache_read_input_tokens": INT, "cache_creation_input_tokens": INT})
CONTENT_BLOCK = {"anyOf": [
    obj({"type": {"const": "text"}, "text": STR}),
    obj({"type": {"const": "thinking"}, "thinking": STR, "signature": STR}),
    obj({"type": {"const": "tool_use"}, "id": STR, "name": STR, "input": ANY_OBJECT}),
]}
STOP_REASON = nullable({"type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]})
MESSAGE = obj({
    "id": STR, "type": {"const": "message"}, "role": {"const": "assistant"}, "model": STR,
    "content": {"type": "array", "items": CONTENT_BLOCK},
    "stop_reason": STOP_REASON, "stop_sequence": nullable(STR), "usage": ANTHROPIC_USAGE})
MESSAGE_EVENT = obj({"type": {"enum": [
    "message_start", "content_block_start", "content_block_delta", "content_block_stop",
    "message_delta", "message_stop", "error"]}})
MESSAGE_ANSWER = streamed(MESSAGE, "The message.", "message_start, then per content block "
                          "content_block_start, content_block_delta..., content_block_stop, then "
                          "message_delta (stop_reason, usage) and message_stop; or an error event.",
                          MESSAGE_EVENT)
TOKEN_COUNT = json_answer(obj({"input_tokens": INT}), "The prompt's tokens.")

# ---- OpenAI Responses -------------------------------------------------------------------------

RESPONSE_USAGE = obj({"input_tokens": INT, "output_tokens": INT, "total_tokens": INT,
                      "input_tokens_details": obj({"cached_tokens": INT}),
                      "output_tokens_details": obj({"reasoning_tokens": INT})})
ITEM_STATUS = {"type": "string", "enum": ["in_progress", "completed", "incomplete"]}
OUTPUT_ITEM = {"anyOf": [
    obj({"type": {"const": "message"}, "id": STR, "role": {"const": "assistant"}, "status": ITEM_STATUS,
         "content": {"type": "array", "items": obj({"type": {"const": "output_text"}, "text": STR,
                                                    "annotations": {"type": "array"}})}}),
    obj({"type": {"const": "function_call"}, "id": STR, "call_id": STR, "name": STR,
         "arguments": STR, "status": ITEM_STATUS}),
    obj({"type": {"const": "reasoning"}, "id": STR, "summary": {"type": "array"}},
        {"content": {"type": "array"}, "status": ITEM_STATUS}),
]}
RESPONSE = obj({
    "id": STR, "object": {"const": "response"}, "created_at": NUM, "model": STR,
    "status": {"type": "string", "enum": ["completed", "incomplete", "failed", "in_progress"]},
    "output": {"type": "array", "items": OUTPUT_ITEM},
    "incomplete_details": nullable(obj({"reason": STR})),
    "error": nullable(obj({"code": STR, "message": STR})),
    "parallel_tool_calls": {"type": "boolean"}, "tool_choice": {}, "tools": {"type": "array"},
}, {"usage": nullable(RESPONSE_USAGE), "instructions": nullable(STR), "store": {"const": False},
    "max_output_tokens": nullable(INT), "temperature": nullable(NUM), "top_p": nullable(NUM),
    "previous_response_id": NULL})
RESPONSE_EVENT = obj({"type": STR, "sequence_number": INT})
RESPONSE_ANSWER = streamed(RESPONSE, "The response.", "response.created, response.in_progress, the "
                           "output items' events (response.output_item.added, "
                           "response.output_text.delta, response.function_call_arguments.delta, "
                           "..., response.output_item.done), then response.completed or "
                           "response.incomplete; on a failure after the head, error and "
                           "response.failed.", RESPONSE_EVENT)
