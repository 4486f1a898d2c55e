"""POST /api/chat: Ollama's chat, parsed into the typed chat request and its typed output
rendered as Ollama's objects: NDJSON lines while it grows (`stream` is Ollama's default), one
object when `stream` is false, the last one `done` with the engine's timings.

Ollama's shapes: a message is {role, content, thinking?, tool_calls?, tool_name?, images?};
a tool call is {function: {name, arguments}} with the arguments an object, not a JSON string
(OpenAI's), both ways. Tool calls arrive whole (Ollama sends each once it is parsed), the text
and thinking as they grow.
"""
from __future__ import annotations

import contextlib
import time

import orjson

from ...errors import DomainError
from ...http.errors import ApiError, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...serving.output import ARGUMENTS, REASONING, TEXT, TOOL
from ...serving.request import ChatRequest
from ..errors import answer_of
from ..inference import chat as openai_chat
from ..inference import tools as tools_params
from . import loading, names, options as opts, timing
from .errors import error_line
from .timing import head

ROLES = ("system", "user", "assistant", "tool")
NDJSON = b"application/x-ndjson"
# the fields whose 400s are raised once the model is known, in Ollama's names
FIELD_NAMES = {"top_k": "options.top_k", "response_format": "format", "tool_choice": "tools"}


def line(obj) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_APPEND_NEWLINE)


def no_images(value, where: str) -> None:
    if value:
        raise invalid(f"'{where}' is not supported: no model stackd serves takes images", where)


def arguments_text(value, where: str) -> str:
    """A call's arguments as the template takes them (a JSON string): Ollama writes an object."""
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    if isinstance(value, str):
        return value
    raise invalid(f"'{where}' must be an object", where)


def messages_of(body: dict) -> list[dict]:
    raw = body.get("messages")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid("'messages' must be an array of messages", "messages")
    if len(raw) > openai_chat.MAX_MESSAGES:
        raise invalid(f"'messages' holds more than {openai_chat.MAX_MESSAGES} messages", "messages")
    out = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"'{where}' must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise invalid(f"'{where}.role' must be one of {', '.join(ROLES)}", f"{where}.role")
        content = message.get("content")
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise invalid(f"'{where}.content' must be a string", f"{where}.content")
        no_images(message.get("images"), f"{where}.images")
        entry = {"role": role, "content": content}
        thinking = message.get("thinking")
        if thinking:
            if not isinstance(thinking, str):
                raise invalid(f"'{where}.thinking' must be a string", f"{where}.thinking")
            entry["reasoning_content"] = thinking
        tool_name = message.get("tool_name")
        if tool_name is not None:
            if not isinstance(tool_name, str) or len(tool_name) > 256:
                raise invalid(f"'{where}.tool_name' must be a string of at most 256 characters",
                              f"{where}.tool_name")
            entry["name"] = tool_name
        calls = message.get("tool_calls")
        if calls:
            entry["tool_calls"] = calls_of(calls, where, role)
        out.append(entry)
    return out


def calls_of(calls, where: str, role: str) -> list[dict]:
    if role != "assistant":
        raise invalid(f"'{where}.tool_calls' belong to an assistant turn", f"{where}.tool_calls")
    if not isinstance(calls, list) or len(calls) > tools_params.MAX_TOOLS:
        raise invalid(f"'{where}.tool_calls' must be an array of at most {tools_params.MAX_TOOLS} calls",
                      f"{where}.tool_calls")
    out = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}].function"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(f"'{at}' must be an object with a 'name'", at)
        out.append({"id": str(call.get("id") or ""), "type": "function", "function": {
            "name": function["name"][:256],
            "arguments": arguments_text(function.get("arguments") or {}, f"{at}.arguments")}})
    return out


def tools_of(body: dict):
    """Ollama's tools are OpenAI's function tools; the model may call several at once."""
    tools = body.get("tools")
    if not tools:
        return None
    return tools_params.read({"tools": tools, "parallel_tool_calls": True})


def refuse_logprobs(body: dict) -> None:
    if body.get("logprobs") or body.get("top_logprobs"):
        raise invalid("'logprobs' is not supported on this port: /v1/chat/completions answers them",
                      "logprobs")


def request_of(body: dict, model_id: str, options: opts.Options) -> ChatRequest:
    refuse_logprobs(body)
    messages = messages_of(body)
    if not messages:
        raise invalid("'messages' is required: at least one message (an empty list only loads the "
                      "model, which this request does not)", "messages")
    gen = opts.generation(options, opts.grammar_of(body), opts.stream_of(body))
    return ChatRequest(model_id, messages, gen, tools_of(body), opts.effort_of(body), dict(FIELD_NAMES))


# ---- the answer -------------------------------------------------------------------------------

def tool_call(name: str, arguments: str) -> dict:
    """Ollama's call: its arguments an object (a model's text that is not one is kept whole)."""
    try:
        value = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        value = {"arguments": arguments}
    if not isinstance(value, dict):
        value = {"arguments": value}
    return {"function": {"name": name, "arguments": value}}


async def whole(run, model_name: str, started: int, load_ns: int) -> dict:
    (message,) = await run.result()
    reply = {"role": "assistant", "content": message.content or ""}
    if message.reasoning:
        reply["thinking"] = message.reasoning
    if message.calls:
        reply["tool_calls"] = [tool_call(c.name, c.arguments) for c in message.calls]
    return {**head(model_name), "message": reply, "done": True, "done_reason": timing.done_reason(message.finish),
            **timing.final_fields(run.choices[0], started, load_ns)}


async def lines(run, model_name: str, started: int, load_ns: int):
    """The answer as it grows; a failure after the first line is the stream's last line."""
    calls: dict[int, list] = {}              # call index -> [name, arguments so far]
    finish = None
    try:
        async with contextlib.aclosing(run.steps()) as steps:
            async for step in steps:
                if step.index != 0:
                    continue
                for piece in step.pieces:
                    if piece.kind == TEXT and piece.text:
                        yield line({**head(model_name), "message": {"role": "assistant", "content": piece.text},
                                    "done": False})
                    elif piece.kind == REASONING and piece.text:
                        yield line({**head(model_name), "message": {"role": "assistant", "content": "",
                                                                    "thinking": piece.text}, "done": False})
                    elif piece.kind == TOOL:
                        calls[piece.call] = [piece.name, ""]
                    elif piece.kind == ARGUMENTS and piece.call in calls:
                        calls[piece.call][1] += piece.text
                if step.finish is not None:
                    finish = step.finish
        if calls:
            yield line({**head(model_name), "message": {"role": "assistant", "content": "", "tool_calls": [
                tool_call(name, arguments) for name, arguments in calls.values()]}, "done": False})
        yield line({**head(model_name), "message": {"role": "assistant", "content": ""}, "done": True,
                    "done_reason": timing.done_reason(finish),
                    **timing.final_fields(run.choices[0], started, load_ns)})
    except (ApiError, DomainError) as exc:
        yield line(error_line(answer_of(exc)))


async def chat(ctx, request) -> Response | StreamingResponse:
    started = time.monotonic_ns()
    body = request.json()
    model_id = loading.resolve(ctx, body)
    options = opts.read_options(body)
    keep_alive = opts.keep_alive_of(body)
    if not body.get("messages"):             # Ollama's way to load (or, keep_alive 0, unload) a model
        done = await loading.load_only(ctx, model_id, options.get("num_ctx"), keep_alive, started)
        return json_response({**head(names.shown(model_id)), "message": {"role": "assistant", "content": ""},
                              **done})
    chat_request = request_of(body, model_id, options)
    got = await loading.model_for(ctx, model_id, "chat", options.get("num_ctx"), keep_alive)
    opts.apply_window(chat_request.gen, options, got.model.context_length)
    run = await openai_chat.start(ctx, request, chat_request)
    model_name = names.shown(model_id)
    if chat_request.gen.stream:
        return StreamingResponse(lines(run, model_name, started, got.load_ns), NDJSON)
    return json_response(await whole(run, model_name, started, got.load_ns))
