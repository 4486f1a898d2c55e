"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over chat.

The body is checked here, field by field, in Anthropic's words, and parsed into the typed chat
request (system -> a system message, tool_use blocks -> an assistant turn's tool_calls,
tool_result blocks -> tool turns, tool_choice any -> required); chat's typed answer or steps
are rendered as a Message or Anthropic's event sequence (message_start, content_block_start/delta/
stop, message_delta with the stop_reason, message_stop). Errors on these routes come in
Anthropic's shape, with the spec's `code` kept inside `error` (ERROR_SHAPE).
"""
from __future__ import annotations

import contextlib

import orjson

from ...errors import DomainError
from ...http import validate as V
from ...http.errors import ApiError, ErrorShape, invalid
from ...http.openapi import ERROR_SCHEMA
from ...http.response import Response, StreamingResponse, json_response
from ..errors import answer_of
from . import chat, dialect, params
from . import tools as tools_params
from .dialect import tag
from ...chat.tools import ToolRequest
from ...serving.request import ChatRequest, plain_generation, plain_sampling
from ...serving.output import CLOSE, DELTA, END, OPEN, REASONING, TEXT, TOOL, Block, Message, block_events, blocks_of

# ---- errors -----------------------------------------------------------------------------------

# HTTP status -> Anthropic's error type (anything else: api_error at 5xx, else invalid_request_error)
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


def error_body(err: ApiError) -> dict:
    status = err.kind.status
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    error = {"type": kind, "message": err.message, "code": status}
    if err.param is not None:
        error["param"] = err.param
    return {"type": "error", "error": error}


_SPEC_ERROR = ERROR_SCHEMA["properties"]["error"]
ERROR_SHAPE = ErrorShape("AnthropicError", error_body, {
    "type": "object", "required": ["error"],
    "description": "Anthropic's error shape; `error.code` is the HTTP status, as in the spec's. "
                   "The HTTP layer's own refusals (408, 413, 414, 431) have no top-level `type`.",
    "properties": {
        "type": {"const": "error"},
        "error": {**_SPEC_ERROR, "properties": {
            **_SPEC_ERROR["properties"],
            "type": {"type": "string", "enum": sorted({*ERROR_TYPES.values(),
                                                       *_SPEC_ERROR["properties"]["type"]["enum"]})}}}}})

# ---- the body ---------------------------------------------------------------------------------

TEXT_BLOCK = V.Object("", tag("text"), V.String("text", required=True, max_len=None, allow_empty=True))
TEXT_BLOCKS = V.Array(items=TEXT_BLOCK)
BLOCK = dialect.Tagged("", {
    "text": TEXT_BLOCK,
    "tool_use": V.Object("", tag("tool_use"), V.String("id", required=True, max_len=256),
                         V.String("name", required=True, max_len=256),
                         V.Object("input", required=True, doc="The call's arguments.")),
    "tool_result": V.Object("", tag("tool_result"), V.String("tool_use_id", required=True, max_len=256),
                            V.OneOf("content", V.String(max_len=None, allow_empty=True), TEXT_BLOCKS),
                            V.Boolean("is_error")),
    "thinking": V.Object("", tag("thinking"),
                         V.String("thinking", required=True, max_len=None, allow_empty=True),
                         V.String("signature", max_len=None, allow_empty=True)),
}, what="content block; text, tool_use, tool_result and thinking are supported")
MESSAGE = V.Object(
    "", V.String("role", required=True, choices=("user", "assistant")),
    V.OneOf("content", V.String(max_len=None, allow_empty=True),
            V.Array(items=BLOCK), required=True))
MESSAGES = V.Array("messages", MESSAGE, required=True, min_items=1, max_items=chat.MAX_MESSAGES,
                   doc="The conversation, oldest first: user and assistant turns.")
SYSTEM = V.OneOf("system", V.String(max_len=None, allow_empty=True), TEXT_BLOCKS,
                 doc="The system prompt: a string or text blocks.")
TOOL_SPEC = V.Object("", V.String("name", required=True, max_len=256),
                     V.String("description", max_len=None, allow_empty=True),
                     V.Object("input_schema", required=True, doc="A JSON Schema of the tool's input."),
                     V.String("type", choices=("custom",)))
TOOLS = V.Array("tools", TOOL_SPEC, max_items=dialect.MAX_TOOLS, doc="Tools the model may call.")
_PARALLEL = V.Boolean("disable_parallel_tool_use")
TOOL_CHOICE = dialect.Tagged("tool_choice", {
    "auto": V.Object("", tag("auto"), _PARALLEL),
    "any": V.Object("", tag("any"), _PARALLEL),
    "tool": V.Object("", tag("tool"), V.String("name", required=True, max_len=256), _PARALLEL),
    "none": V.Object("", tag("none")),
}, what="tool choice", doc="auto (default), any (some tool must be called), tool (this one), none.")
STOP_SEQUENCES = V.Array("stop_sequences", V.String(max_len=params.MAX_STOP_LEN), max_items=params.MAX_STOP,
                         doc="Where generation stops (not included in the text).")
COUNT_FIELDS = [params.MODEL, MESSAGES, SYSTEM, TOOLS, TOOL_CHOICE]
FIELDS = COUNT_FIELDS + [
    V.Integer("max_tokens", required=True, lo=1, hi=dialect.MAX_TOKENS, doc="Tokens to generate at most."),
    STOP_SEQUENCES,
    V.Number("temperature", lo=0.0, hi=1.0, doc=f"Default {params.DEFAULT_TEMPERATURE}."),
    V.Number("top_p", lo=0.0, hi=1.0),
    V.Integer("top_k", lo=0, doc="At most the model's vocabulary size."),
    V.Boolean("stream", doc="Send the answer as Anthropic's server-sent events."),
    V.Object("metadata", doc="Not used."),
]
READ = V.Fields(FIELDS)
READ_COUNT = V.Fields(COUNT_FIELDS)


def messages_of(v: dict) -> list[dict]:
    """system and messages as the chat template takes a conversation: tool_use blocks become
    the assistant turn's tool_calls, tool_result blocks tool turns."""
    out = []
    if v["system"] is not None:
        out.append({"role": "system", "content": dialect.text_of(v["system"], "\n")})
    for i, message in enumerate(v["messages"]):
        role, content = message["role"], message["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        texts, calls, thinking, results = [], [], [], []
        for j, block in enumerate(content):
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
            elif kind == "thinking":
                thinking.append(block["thinking"])
            elif kind == "tool_use":
                _only_in(role, "assistant", kind, i, j)
                calls.append({"id": block["id"], "type": "function", "function": {
                    "name": block["name"], "arguments": orjson.dumps(block["input"]).decode()}})
            else:
                _only_in(role, "user", kind, i, j)
                results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                "content": dialect.text_of(block.get("content") or "", "\n")})
        if role == "assistant":
            turn = {"role": "assistant", "content": "".join(texts)}
            if calls:
                turn["tool_calls"] = calls
            if thinking:
                turn["reasoning_content"] = "".join(thinking)
            out.append(turn)
            continue
        out.extend(results)                  # tool results answer the turn before: first
        if texts or not results:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _only_in(role: str, allowed: str, kind: str, i: int, j: int) -> None:
    if role != allowed:
        where = f"messages[{i}].content[{j}]"
        raise invalid(f"'{where}' is a {kind} block, which only a {allowed} turn may hold", where)


CHOICES = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}


def tools_of(v: dict) -> ToolRequest | None:
    """tools and tool_choice: any is chat's required, tool a named choice; parallel calls
    unless disable_parallel_tool_use."""
    offered = tools_params.functions([(t["name"], t.get("description"), t["input_schema"]) for t in v["tools"] or ()],
                                     lambda i, part: f"tools[{i}].{PARTS[part]}")
    choice = v["tool_choice"] or {"type": "auto"}
    kind, named = choice["type"], None
    if kind in ("any", "tool") and not offered:
        raise invalid(f"'tool_choice' {kind!r} needs 'tools'", "tool_choice")
    if kind == "tool":
        named = choice["name"]
        dialect.check_named_tool(named, offered, "tool_choice.name")
    if not offered:
        return None
    return ToolRequest(offered, CHOICES[kind], named, not choice.get("disable_parallel_tool_use"))


PARTS = {"name": "name", "parameters": "input_schema"}


def request_of(v: dict, stream: bool = False) -> ChatRequest:
    """The typed chat request, from the fields as read (count_tokens reads no sampling)."""
    temperature, top_p, top_k = v.get("temperature"), v.get("top_p"), v.get("top_k")
    sampling = plain_sampling(
        temperature=params.DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=params.DEFAULT_TOP_P if top_p is None else top_p,
        top_k=params.DEFAULT_TOP_K if top_k is None else top_k, min_p=params.DEFAULT_MIN_P)
    gen = plain_generation(sampling, max_tokens=v.get("max_tokens"), stop=v.get("stop_sequences") or [],
                           stream=stream)
    return ChatRequest(v["model"], messages_of(v), gen, tools_of(v))


# ---- the answer -------------------------------------------------------------------------------

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def stop_fields(finish_reason: str | None, blocks, stop_sequence: str | None) -> dict:
    """stop_reason, and stop_sequence: the string when it is what ended the message, else null
    (a tool call that followed one ends it as tool_use). A call cut off by max_tokens is
    max_tokens, as Anthropic answers: its input is incomplete, not a call to run."""
    if finish_reason == "length":
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if any(block.kind == TOOL for block in blocks):
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if stop_sequence is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_sequence}
    return {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn"), "stop_sequence": None}


def usage_of(usage: dict) -> dict:
    """Anthropic counts cache reads apart from input_tokens."""
    prompt = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": prompt - cached, "output_tokens": usage.get("completion_tokens", 0),
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}


def tool_input(arguments: str) -> dict:
    """A tool call's arguments as the object Anthropic's tool_use carries."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def content_block(block: Block, whole: bool) -> dict:
    """A block as Anthropic's content block: whole, or empty as content_block_start opens it."""
    text = block.text() if whole else ""
    if block.kind == TOOL:
        return {"type": "tool_use", "id": block.id, "name": block.name,
                "input": tool_input(text) if whole else {}}
    if block.kind == REASONING:
        return {"type": "thinking", "thinking": text, "signature": ""}
    return {"type": "text", "text": text}


DELTAS = {TEXT: ("text_delta", "text"), REASONING: ("thinking_delta", "thinking"),
          TOOL: ("input_json_delta", "partial_json")}


def message_head(model: str) -> dict:
    return {"id": dialect.new_id("msg"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None}


def message_of(message: Message, usage: dict, model: str) -> dict:
    blocks = blocks_of(message)
    return {**message_head(model), "content": [content_block(b, True) for b in blocks],
            **stop_fields(message.finish, blocks, message.stop), "usage": usage_of(usage)}


async def events(run: chat.ChatRun, model: str):
    """Anthropic's event sequence for a streamed run; a failure after the head is an `error`
    event, as Anthropic sends it."""
    yield dialect.named_sse("message_start", {"type": "message_start", "message": {
        **message_head(model), "usage": usage_of({})}})
    blocks = []
    try:
        async with contextlib.aclosing(block_events(run.steps(), run.usage)) as stream:
            async for event in stream:
                what = event[0]
                if what == OPEN:
                    blocks.append(event[1])
                    yield _event("content_block_start", index=event[1].index,
                                 content_block=content_block(event[1], False))
                elif what == DELTA:
                    kind, field = DELTAS[event[1].kind]
                    yield _event("content_block_delta", index=event[1].index,
                                 delta={"type": kind, field: event[2]})
                elif what == CLOSE:
                    yield _event("content_block_stop", index=event[1].index)
                elif what == END:
                    _, reason, usage, stop = event
                    yield _event("message_delta", delta=stop_fields(reason, blocks, stop), usage=usage_of(usage))
        yield _event("message_stop")
    except (ApiError, DomainError) as exc:
        yield dialect.named_sse("error", error_body(answer_of(exc)))


def _event(kind: str, **fields) -> bytes:
    return dialect.named_sse(kind, {"type": kind, **fields})


# ---- the handlers -----------------------------------------------------------------------------

async def messages(ctx, request) -> Response | StreamingResponse:
    """Anthropic's Messages API. The key may come as `x-api-key` or as a bearer token."""
    v = READ.read(request.json())
    run = await chat.start(ctx, request, request_of(v, bool(v["stream"])))
    if v["stream"]:
        return StreamingResponse(events(run, v["model"]), b"text/event-stream")
    (message,) = await run.result()
    return json_response(message_of(message, run.usage(), run.model.id))


async def count_tokens(ctx, request) -> Response:
    """The prompt's tokens for these messages and tools, as the model's chat template renders
    them for messages.create."""
    prepared = await chat.prepare(ctx, request_of(READ_COUNT.read(request.json())))
    return json_response({"input_tokens": len(await prepared.prompt_tokens())})
