"""POST /v1/responses: OpenAI's Responses API over chat, stateless.

The body is checked here in the Responses API's words; `input` (a string, or items: messages,
function_call, function_call_output, reasoning) and `instructions` become chat messages, a
function_call joining the assistant turn before it; tools, tool_choice, text.format,
max_output_tokens and reasoning.effort become their chat fields. Chat's answer or chunks come
back as a Response object or as the typed events (response.created, response.output_item.added,
response.output_text.delta, response.function_call_arguments.delta, ..., response.completed).

Nothing is stored: previous_response_id, conversation and background: true are refused with a
400 that says so (the client sends the whole conversation in `input`). `store` is accepted and
answered as `"store": false`: OpenAI stores when it is absent, so clients send it either way,
and a client that never reads a response back loses nothing.
"""
from __future__ import annotations

import contextlib
import time

from ...errors import DomainError
from ...http import validate as V
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ..errors import answer_of
from . import chat, dialect, params
from . import tools as tools_params
from .dialect import tag
from ...chat.gbnf import json_gbnf
from ...chat.grammar import json_schema_grammar
from ...chat.tools import ToolRequest
from ...serving.request import ChatRequest, plain_generation, plain_sampling
from ...serving.output import CLOSE, DELTA, OPEN, REASONING, TEXT, TOOL, Block, Message, block_events, blocks_of

# ---- the body ---------------------------------------------------------------------------------

_TEXT = V.String("text", required=True, max_len=None, allow_empty=True)
INPUT_TEXT = V.Object("", tag("input_text"), _TEXT)
PART = dialect.Tagged("", {"input_text": INPUT_TEXT, "output_text": V.Object("", tag("output_text"), _TEXT)},
                      what="content part; input_text and output_text are supported")
_ID = V.String("id", max_len=256)
_CALL_ID = V.String("call_id", required=True, max_len=256)
_TEXT_ITEM = V.Object("", V.String("type", max_len=64), _TEXT)     # a reasoning item's summary and content
ITEM = dialect.Tagged("", {
    "message": V.Object("", tag("message", required=False), _ID,
                        V.String("role", required=True, choices=("user", "assistant", "system", "developer")),
                        V.OneOf("content", V.String(max_len=None, allow_empty=True),
                                V.Array(items=PART), required=True)),
    "function_call": V.Object("", tag("function_call"), _ID, _CALL_ID, V.String("name", required=True, max_len=256),
                              V.String("arguments", required=True, max_len=None, allow_empty=True)),
    "function_call_output": V.Object("", tag("function_call_output"), _ID, _CALL_ID,
                                     V.OneOf("output", V.String(max_len=None, allow_empty=True),
                                             V.Array(items=INPUT_TEXT),
                                             required=True)),
    "reasoning": V.Object("", tag("reasoning"), _ID,
                          V.Array("summary", _TEXT_ITEM),
                          V.Array("content", _TEXT_ITEM)),
}, untagged="message", what="input item; message, function_call, function_call_output and reasoning "
                           "are supported")
INPUT = V.OneOf("input", V.String(max_len=None, allow_empty=True),
                V.Array(items=ITEM, min_items=1, max_items=chat.MAX_MESSAGES), required=True,
                doc="The conversation: a user message, or input items, oldest first.")
TOOLS = V.Array("tools", dialect.Tagged("", {"function": V.Object(
    "", tag("function"), V.String("name", required=True, max_len=256),
    V.String("description", max_len=None, allow_empty=True),
    V.Object("parameters", doc="A JSON Schema of the arguments."), V.Boolean("strict"))},
    what="tool type; only function tools are supported"), max_items=dialect.MAX_TOOLS)
TOOL_CHOICE = V.OneOf("tool_choice", V.String(choices=("none", "auto", "required")),
                      dialect.Tagged("", {"function": V.Object("", tag("function"),
                                                               V.String("name", required=True, max_len=256))},
                                     what="tool choice"),
                      doc="none, auto (default), required, or {type: function, name}.")
FORMAT = dialect.Tagged("format", {
    "text": V.Object("", tag("text")),
    "json_object": V.Object("", tag("json_object")),
    "json_schema": V.Object("", tag("json_schema"), V.String("name", max_len=256, allow_empty=True),
                            V.Object("schema", required=True, doc="A JSON Schema the output must match."),
                            V.Boolean("strict"), V.String("description", max_len=None, allow_empty=True)),
}, what="text format")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
FIELDS = [
    params.MODEL, INPUT,
    V.String("instructions", max_len=None, allow_empty=True, doc="A system message put first."),
    TOOLS, TOOL_CHOICE, V.Boolean("parallel_tool_calls", default=True),
    V.Object("text", FORMAT, V.String("verbosity", choices=("low", "medium", "high"))),
    V.Object("reasoning", V.String("effort", choices=EFFORTS), V.String("summary", max_len=64)),
    V.Integer("max_output_tokens", lo=1, hi=dialect.MAX_TOKENS, doc="Tokens to generate at most."),
    V.Number("temperature", lo=0.0, hi=2.0, default=params.DEFAULT_TEMPERATURE),
    V.Number("top_p", lo=0.0, hi=1.0, default=params.DEFAULT_TOP_P),
    V.Boolean("stream", doc="Send the answer as the Responses API's server-sent events."),
    V.Boolean("store", doc="Accepted; nothing is stored (the answer says \"store\": false)."),
    V.Boolean("background", doc="Must be false (or absent)."),
    V.String("previous_response_id", max_len=256, doc="Refused: nothing is stored."),
    V.OneOf("conversation", V.String(max_len=256), V.Object(), doc="Refused: nothing is stored."),
    V.Object("metadata", doc="Echoed in the response."), params.USER,
]
READ = V.Fields(FIELDS)
STATELESS = "this server keeps no responses: send the whole conversation in 'input'"


def read(body: dict) -> dict:
    v = READ.read(body)
    for name in ("previous_response_id", "conversation"):
        if v[name] is not None:
            raise invalid(f"'{name}' is not supported: {STATELESS}", name)
    if v["background"]:
        raise invalid(f"'background' must be false: {STATELESS}", "background")
    return v


def messages_of(v: dict) -> list[dict]:
    """`instructions` and `input` as the chat template takes a conversation; a function_call
    joins the assistant turn before it, a reasoning item the assistant turn after it."""
    out = []
    if v["instructions"]:
        out.append({"role": "system", "content": v["instructions"]})
    if isinstance(v["input"], str):
        out.append({"role": "user", "content": v["input"]})
        return out
    turn = None                 # the assistant turn a function_call joins
    reasoning = None            # a reasoning item's text, for the assistant turn after it
    for item in v["input"]:
        kind = ITEM.kind_of(item)
        if kind == "reasoning":
            reasoning = dialect.text_of(item.get("content") or item.get("summary") or [], "\n")
            continue
        if kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"],
                        "content": dialect.text_of(item["output"])})
            turn = None
            continue
        if kind == "message" and item["role"] != "assistant":
            role = "system" if item["role"] == "developer" else item["role"]
            out.append({"role": role, "content": dialect.text_of(item["content"])})
            turn = None
            continue
        if turn is None or kind == "message":
            turn = {"role": "assistant", "content": ""}
            out.append(turn)
            if reasoning:
                turn["reasoning_content"], reasoning = reasoning, None
        if kind == "message":
            turn["content"] = dialect.text_of(item["content"])
        else:
            turn.setdefault("tool_calls", []).append({"id": item["call_id"], "type": "function", "function": {
                "name": item["name"], "arguments": item["arguments"]}})
    return out


def tools_of(v: dict) -> ToolRequest | None:
    """tools and tool_choice; a named choice must name one of the tools."""
    offered = tools_params.functions([(t["name"], t.get("description"), t.get("parameters"))
                                      for t in v["tools"] or ()], lambda i, part: f"tools[{i}].{part}")
    choice, named = v["tool_choice"], None
    if isinstance(choice, dict):
        named = choice["name"]
        dialect.check_named_tool(named, offered, "tool_choice.name")
        choice = "required"
    elif choice == "required" and not offered:
        raise invalid("'tool_choice' 'required' needs 'tools'", "tool_choice")
    if not offered:
        return None                 # 'auto' or 'none' with nothing to call: nothing to do
    return ToolRequest(offered, choice or "auto", named, v["parallel_tool_calls"])


def grammar_of(v: dict) -> str:
    """text.format as a grammar: any JSON object, or JSON matching the schema."""
    fmt = (v["text"] or {}).get("format")
    if fmt is None or fmt["type"] == "text":
        return ""
    if fmt["type"] == "json_object":
        return json_gbnf()
    return json_schema_grammar(fmt["schema"], param="text.format.schema")


# the fields checked once the model is known, as this body names them
NAMES = {"messages": "input", "response_format": "text.format"}


def request_of(v: dict) -> ChatRequest:
    """The typed chat request, from the fields as read."""
    sampling = plain_sampling(temperature=v["temperature"], top_p=v["top_p"], top_k=params.DEFAULT_TOP_K,
                              min_p=params.DEFAULT_MIN_P, grammar=grammar_of(v))
    gen = plain_generation(sampling, max_tokens=v["max_output_tokens"], stop=[], stream=bool(v["stream"]))
    effort = (v["reasoning"] or {}).get("effort")
    return ChatRequest(v["model"], messages_of(v), gen, tools_of(v), EFFORT.get(effort, effort), NAMES)


# OpenAI's efforts above ours take our highest budget (inference.reasoning_budget.high)
EFFORT = {"xhigh": "high"}


# ---- the answer -------------------------------------------------------------------------------

class Reply:
    """What one response says of itself; its output items are built from chat's blocks."""

    __slots__ = ("id", "created", "v")

    def __init__(self, v: dict):
        self.id = dialect.new_id("resp")
        self.created = int(time.time())
        self.v = v

    def item_id(self, block: Block) -> str:
        prefix = {TEXT: "msg", REASONING: "rs", TOOL: "fc"}[block.kind]
        return f"{prefix}_{self.id[5:]}{block.index:04d}"

    def item(self, block: Block, whole: bool = True) -> dict:
        """The output item of `block`: whole and completed, or empty as it is added."""
        status = "completed" if whole else "in_progress"
        text = block.text() if whole else ""
        if block.kind == TOOL:
            return {"id": self.item_id(block), "type": "function_call", "status": status,
                    "call_id": block.id, "name": block.name, "arguments": text}
        if block.kind == REASONING:
            return {"id": self.item_id(block), "type": "reasoning", "status": status, "summary": [],
                    "content": [{"type": "reasoning_text", "text": text}] if whole else []}
        return {"id": self.item_id(block), "type": "message", "status": status, "role": "assistant",
                "content": [output_text(text)] if whole else []}

    def items(self, blocks, status: str) -> list[dict]:
        """The output items; in an incomplete response the last one is the one cut short."""
        items = [self.item(block) for block in blocks]
        if status == "incomplete" and items:
            items[-1]["status"] = "incomplete"
        return items

    def response(self, status: str = "in_progress", blocks=(), usage: dict | None = None,
                 finish_reason: str | None = None, error: dict | None = None) -> dict:
        v = self.v
        if status == "completed" and finish_reason == "length":
            status = "incomplete"
        return {
            "id": self.id, "object": "response", "created_at": self.created, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": v["instructions"], "max_output_tokens": v["max_output_tokens"],
            "model": v["model"], "output": self.items(blocks, status), "store": False,
            "parallel_tool_calls": v["parallel_tool_calls"], "previous_response_id": None,
            "reasoning": {"effort": (v["reasoning"] or {}).get("effort"), "summary": None},
            "temperature": v["temperature"], "top_p": v["top_p"],
            "text": {"format": (v["text"] or {}).get("format") or {"type": "text"}},
            "tool_choice": v["tool_choice"] or "auto", "tools": v["tools"] or [],
            "truncation": "disabled", "metadata": v["metadata"] or {}, "user": v["user"],
            "usage": usage_of(usage) if usage is not None else None,
        }


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def usage_of(usage: dict) -> dict:
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response_of(message: Message, usage: dict, reply: Reply) -> dict:
    return reply.response("completed", blocks_of(message), usage, message.finish)


class Events:
    """The typed events of one streamed response, numbered."""

    __slots__ = ("reply", "n")

    def __init__(self, reply: Reply):
        self.reply, self.n = reply, 0

    def __call__(self, kind: str, **fields) -> bytes:
        self.n += 1
        return dialect.named_sse(kind, {"type": kind, "sequence_number": self.n - 1, **fields})

    def at(self, kind: str, block: Block, **fields) -> bytes:
        """An event about one block's item (and its one content part)."""
        if block.kind != TOOL:
            fields["content_index"] = 0
        return self(kind, item_id=self.reply.item_id(block), output_index=block.index, **fields)


def _part(block: Block, text: str) -> dict:
    return output_text(text) if block.kind == TEXT else {"type": "reasoning_text", "text": text}


async def events(run: chat.ChatRun, reply: Reply):
    event = Events(reply)
    yield event("response.created", response=reply.response())
    yield event("response.in_progress", response=reply.response())
    blocks = []
    try:
        async with contextlib.aclosing(block_events(run.steps(), run.usage)) as stream:
            async for what, *rest in stream:
                if what == OPEN:
                    block = rest[0]
                    blocks.append(block)
                    yield event("response.output_item.added", output_index=block.index,
                                item=reply.item(block, whole=False))
                    if block.kind != TOOL:
                        yield event.at("response.content_part.added", block, part=_part(block, ""))
                elif what == DELTA:
                    block, text = rest
                    if block.kind == TOOL:
                        yield event.at("response.function_call_arguments.delta", block, delta=text)
                    elif block.kind == TEXT:
                        yield event.at("response.output_text.delta", block, delta=text, logprobs=[])
                    else:
                        yield event.at("response.reasoning_text.delta", block, delta=text)
                elif what == CLOSE:
                    block = rest[0]
                    text = block.text()
                    if block.kind == TOOL:
                        yield event.at("response.function_call_arguments.done", block, arguments=text,
                                       name=block.name)
                    else:
                        if block.kind == TEXT:
                            yield event.at("response.output_text.done", block, text=text, logprobs=[])
                        else:
                            yield event.at("response.reasoning_text.done", block, text=text)
                        yield event.at("response.content_part.done", block, part=_part(block, text))
                    yield event("response.output_item.done", output_index=block.index, item=reply.item(block))
                else:
                    reason, usage, _ = rest
                    final = reply.response("completed", blocks, usage, reason)
                    yield event(f"response.{final['status']}", response=final)
    except (ApiError, DomainError) as exc:
        error = answer_of(exc)
        yield event("error", code=error.kind.type, message=error.message, param=error.param)
        yield event("response.failed", response=reply.response(
            "failed", blocks, error={"code": "server_error", "message": error.message}))


# ---- the handler ------------------------------------------------------------------------------

async def create(ctx, request) -> Response | StreamingResponse:
    """OpenAI's Responses API, stateless: the whole conversation comes in `input`."""
    v = read(request.json())
    run = await chat.start(ctx, request, request_of(v))
    reply = Reply(v)
    if v["stream"]:
        return StreamingResponse(events(run, reply), b"text/event-stream")
    (message,) = await run.result()
    return json_response(response_of(message, run.usage(), reply))
