"""JSON Schemas of what the inference handlers answer (responses.py builds these shapes),
for the OpenAPI document. The request side is described by the specs the handlers read."""
from __future__ import annotations

from ...engine.core import FINISH_REASONS
from ...http.openapi import ERROR_SCHEMA, event_stream, json_answer

INT = {"type": "integer"}
STR = {"type": "string"}
NUM = {"type": "number"}
NULL = {"type": "null"}


def obj(required: dict, optional: dict | None = None) -> dict:
    return {"type": "object", "required": list(required),
            "properties": {**required, **(optional or {})}}


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, NULL]}


FINISH_REASON = nullable({"type": "string", "enum": sorted({r for r in FINISH_REASONS if r})})
# Beside finish_reason "stop" when one of the request's `stop` strings ended the text: that
# string (vLLM's field; /v1/messages answers it as stop_sequence).
STOP_REASON = {"stop_reason": {"type": "string", "description": "the `stop` string that ended the text"}}
USAGE = obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT},
            {"prompt_tokens_details": obj({"cached_tokens": INT})})
ENVELOPE = {"id": STR, "created": INT, "model": STR, "system_fingerprint": STR}

_TOP = obj({"token": STR, "logprob": NUM, "bytes": {"type": "array", "items": INT}})
CHAT_LOGPROBS = nullable(obj({
    "content": {"type": "array", "items": obj({**_TOP["properties"],
                                               "top_logprobs": {"type": "array", "items": _TOP}})},
    "refusal": NULL}))
CHAT_COMPLETION = obj({
    **ENVELOPE,
    "object": {"const": "chat.completion"},
    "choices": {"type": "array", "items": obj({
        "index": INT,
        "message": obj({"role": {"const": "assistant"}, "content": STR}, {"refusal": NULL}),
        "logprobs": CHAT_LOGPROBS,
        "finish_reason": FINISH_REASON}, STOP_REASON)},
    "usage": USAGE})

COMPLETION_LOGPROBS = nullable(obj({
    "tokens": {"type": "array", "items": STR},
    "token_logprobs": {"type": "array", "items": nullable(NUM),
                       "description": "with echo, the prompt's tokens first: the very first null"},
    "top_logprobs": {"type": "array", "items": nullable({"type": "object", "additionalProperties": NUM})},
    "text_offset": {"type": "array", "items": INT}}))
TEXT_COMPLETION = obj({
    **ENVELOPE,
    "object": {"const": "text_completion"},
    "choices": {"type": "array", "items": obj({
        "text": STR, "index": INT, "logprobs": COMPLETION_LOGPROBS, "finish_reason": FINISH_REASON}, STOP_REASON)},
    "usage": USAGE})

EMBEDDINGS = obj({
    "object": {"const": "list"},
    "data": {"type": "array", "items": obj({
        "object": {"const": "embedding"}, "index": INT,
        "embedding": {"anyOf": [{"type": "array", "items": NUM},
                                {"type": "string", "description": "base64 of little-endian float32"}]}})},
    "model": STR,
    "usage": obj({"prompt_tokens": INT, "total_tokens": INT})})

# Stream chunks: a choice's delta as it is produced; with stream_options.include_usage every
# chunk has "usage": null and a last chunk with no choices carries it.
STREAM_USAGE = {"usage": nullable(USAGE)}
CHAT_CHUNK = obj({
    **ENVELOPE,
    "object": {"const": "chat.completion.chunk"},
    "choices": {"type": "array", "items": obj({
        "index": INT,
        "delta": {"type": "object", "properties": {"role": {"const": "assistant"}, "content": STR}},
        "logprobs": CHAT_LOGPROBS,
        "finish_reason": FINISH_REASON}, STOP_REASON)}}, STREAM_USAGE)
TEXT_CHUNK = obj({**TEXT_COMPLETION["properties"], "usage": nullable(USAGE)})
TEXT_CHUNK["required"].remove("usage")


def streamed(schema: dict, description: str, chunk: dict, events: str) -> dict:
    """A JSON answer, or with `stream: true` server-sent events: each `data:` is a chunk (or,
    when the request fails once the stream has begun, an error), the last `[DONE]`."""
    answer = json_answer(schema, description)
    answer["content"].update(event_stream(events, {"anyOf": [chunk, ERROR_SCHEMA]}))
    return answer


CHAT_ANSWER = streamed(CHAT_COMPLETION, "The completion (chat.completion).", CHAT_CHUNK,
                       "chat.completion.chunk objects, then [DONE].")
COMPLETION_ANSWER = streamed(TEXT_COMPLETION, "The completion (text_completion).", TEXT_CHUNK,
                             "text_completion objects, then [DONE].")

# Why an inference request can fail beyond its own fields.
MODEL_ERRORS = {
    404: "The model is not in the store.",
    503: "The model is loading, unloading, not loaded (autoload off) or restarting after its "
         "worker was lost, or its queue is full; see Retry-After.",
    507: "Loading the model on demand does not fit in memory.",
    429: "The key already holds its share (inference.limits.key_share) of the model's queue.",
}

# /tokenize, /detokenize, /tokenizer_info
_PIECE = {"anyOf": [STR, {"type": "array", "items": INT, "description": "bytes that are not UTF-8"}]}
TOKENIZED = json_answer(obj({
    "count": INT, "max_model_len": INT,
    "tokens": {"type": "array", "items": {"anyOf": [INT, obj({"id": INT, "piece": _PIECE})]},
               "description": "ids; with with_pieces, {id, piece} objects"}},
    {"token_strs": {"type": "array", "items": STR}}), "The tokens (vLLM's shape; llama-server's `tokens`).")
DETOKENIZED = json_answer(obj({"prompt": STR, "content": STR}),
                          "The text (`prompt` as vLLM answers it, `content` as llama-server does).")
_MAYBE_STR = nullable(STR)
TOKENIZER_INFO = json_answer(obj({
    "tokenizer_class": STR, "model": STR, "bos_token": _MAYBE_STR, "eos_token": _MAYBE_STR,
    "pad_token": _MAYBE_STR, "chat_template": _MAYBE_STR, "model_max_length": INT,
    "max_model_len": INT, "vocab_size": INT}), "The model's tokenizer facts.")

# /infill: llama-server's own answer (not OpenAI's), and its stream of {content, stop} objects
_INFILL_PART = obj({"index": INT, "content": STR, "stop": {"type": "boolean"}},
                   {"tokens": {"type": "array", "items": INT}, "id_slot": INT, "tokens_predicted": INT,
                    "tokens_evaluated": INT})
INFILL = obj({**_INFILL_PART["properties"], "model": STR, "tokens_predicted": INT, "tokens_evaluated": INT,
              "tokens_cached": INT, "truncated": {"type": "boolean"}, "has_new_line": {"type": "boolean"},
              "stop_type": {"enum": ["eos", "word", "limit", "none"]}, "stopping_word": STR,
              "timings": nullable({"type": "object"})})
INFILL_ANSWER = json_answer({"anyOf": [INFILL, {
    "type": "object", "description": "with response_fields: those found, keyed by their path"}]},
    "The text to insert at the cursor (`content`), llama-server's shape.")
INFILL_ANSWER["content"].update(event_stream(
    "llama-server's chunks: {content, stop: false}, the last the whole answer with stop: true",
    {"anyOf": [_INFILL_PART, INFILL, ERROR_SCHEMA]}))
