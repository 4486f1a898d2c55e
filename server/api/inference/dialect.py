"""What the dialects built on chat (OpenAI Responses, Anthropic messages) share.

Both translate their body into a chat body, start a chat.ChatRun, and translate its answer or
its chunks back. What comes back is read here as a list of content blocks (reasoning, text,
tool calls), whole (`blocks_of`, from a chat.completion) or as it grows (`block_events`, from
chat.completion.chunk objects); each dialect words the blocks in its own objects and events.
Also here: a tagged union spec (content blocks, input items), named server-sent events, and
errors of the chat body reworded with the dialect's own field names.
"""
from __future__ import annotations

import contextlib
import os

import orjson

from ...http import validate as V
from ...http.errors import ApiError, invalid
from . import chat

REASONING, TEXT, TOOL = "reasoning", "text", "tool"
MAX_TOOLS = 128
MAX_TOKENS = 1 << 20        # max_tokens, max_output_tokens: as chat's max_tokens


class Tagged(V.Spec):
    """An object that is one of several, told apart by its `tag` field ("type"). `untagged`:
    the kind of an object that has no tag (Responses' bare {role, content} messages)."""

    __slots__ = ("tag", "kinds", "untagged", "what")
    json_type = "object"
    article = "an"

    def __init__(self, name: str = "", kinds: dict | None = None, *, tag: str = "type",
                 untagged: str | None = None, what: str = "", **kw):
        super().__init__(name, **kw)
        self.tag = tag
        self.kinds = kinds or {}
        self.untagged = untagged
        self.what = what or "kind"

    def check(self, value, path):
        if type(value) is not dict:
            raise self.wrong_type(value, path)
        kind = value.get(self.tag, self.untagged)
        spec = self.kinds.get(kind) if type(kind) is str else None
        if spec is None:
            where = V.path_text((path, self.tag))
            raise invalid(f"'{where}' must be {_either(self.kinds)} (unsupported {self.what}: "
                          f"{kind!r})", where)
        return spec.check(value, path)

    def kind_of(self, value: dict) -> str:
        return value.get(self.tag, self.untagged)

    def _schema(self) -> dict:
        return {"anyOf": [spec.schema() for spec in self.kinds.values()]}


def _either(choices) -> str:
    quoted = [f"'{c}'" for c in choices]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def tag(value: str, required: bool = True) -> V.Const:
    return V.Const("type", value, required=required)


def text_of(content, joiner: str = "") -> str:
    """A string, or text parts ({"text": ...}) joined."""
    if isinstance(content, str):
        return content
    return joiner.join(part.get("text", "") for part in content)


# ---- errors of the chat body, in the dialect's words ------------------------------------------

def renamed(exc: ApiError, names: dict[str, str]) -> ApiError:
    """`exc` (raised by chat.start for the chat body built from the dialect's body) with its
    field named as the client sent it: `names` maps a chat field to the dialect's. A field
    whose structure differs (messages) is named without the part inside it."""
    param = exc.param
    if not param:
        return exc
    head = param.split("[", 1)[0].split(".", 1)[0]
    new = names.get(head)
    if new is None:
        return exc
    message = exc.message.replace(f"'{param}'", f"'{new}'").replace(f"'{head}'", f"'{new}'")
    if head == "messages" and message == exc.message:
        message = f"{message} (in '{new}')"
    return ApiError(exc.kind, message, param=new, headers=exc.headers)


async def start(ctx, request, body: dict, names: dict[str, str]) -> chat.ChatRun:
    """chat.start for a chat body translated from a dialect's: its 400s name the dialect's
    fields (`names`, as for renamed)."""
    try:
        return await chat.start(ctx, request, body)
    except ApiError as exc:
        raise renamed(exc, names) from None


def new_id(prefix: str) -> str:
    """An id as the dialect spells them: msg_..., resp_..., toolu_..."""
    return f"{prefix}_{os.urandom(12).hex()}"


def named_sse(event: str, obj) -> bytes:
    """A server-sent event with its name (Responses and Anthropic both name each event)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


# ---- the chat answer as blocks -----------------------------------------------------------------

class Block:
    """One piece of the answer: reasoning, text, or one tool call (`id`, `name`; its text is
    the arguments, a JSON string). `index`: its position among the answer's blocks."""

    __slots__ = ("kind", "index", "id", "name", "parts")

    def __init__(self, kind: str, index: int, id: str = "", name: str = ""):
        self.kind, self.index, self.id, self.name = kind, index, id, name
        self.parts: list[str] = []

    def text(self) -> str:
        return "".join(self.parts)


def blocks_of(answer: dict) -> tuple[list[Block], str | None, dict, str | None]:
    """A chat.completion's first choice as blocks, with its finish_reason, usage and the stop
    string that ended it (None when none did)."""
    choice = answer["choices"][0]
    message = choice["message"]
    blocks: list[Block] = []
    for kind, text in ((REASONING, message.get("reasoning_content")), (TEXT, message.get("content"))):
        if text:
            blocks.append(Block(kind, len(blocks)))
            blocks[-1].parts.append(text)
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        block = Block(TOOL, len(blocks), call.get("id") or new_id("call"), function.get("name", ""))
        block.parts.append(function.get("arguments") or "")
        blocks.append(block)
    return blocks, choice.get("finish_reason"), answer.get("usage") or {}, choice.get("stop_reason")


OPEN, DELTA, CLOSE, END = "open", "delta", "close", "end"


async def block_events(chunks):
    """chat.completion.chunk objects (of a one-choice run that includes usage) as
    (OPEN, block), (DELTA, block, text), (CLOSE, block), and last (END, finish_reason, usage,
    the stop string that ended it or None).
    A block opens when the kind of what arrives changes, and closes when the next one opens."""
    current: Block | None = None
    calls: dict[int, Block] = {}
    count = 0
    reason, usage, stop = None, {}, None
    async with contextlib.aclosing(chunks):     # closing this closes the run's chunks
        async for chunk in chunks:
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk["choices"]:
                delta = choice.get("delta") or {}
                for kind, text in ((REASONING, delta.get("reasoning_content")), (TEXT, delta.get("content"))):
                    if not text:
                        continue
                    if current is None or current.kind != kind:
                        if current is not None:
                            yield CLOSE, current
                        current = Block(kind, count)
                        count += 1
                        yield OPEN, current
                    current.parts.append(text)
                    yield DELTA, current, text
                for call in delta.get("tool_calls") or ():
                    function = call.get("function") or {}
                    block = calls.get(call.get("index", 0))
                    if block is None:
                        if current is not None:
                            yield CLOSE, current
                        block = current = calls[call.get("index", 0)] = Block(
                            TOOL, count, call.get("id") or new_id("call"), function.get("name") or "")
                        count += 1
                        yield OPEN, block
                    fragment = function.get("arguments")
                    if fragment:
                        block.parts.append(fragment)
                        yield DELTA, block, fragment
                if choice.get("finish_reason"):
                    reason, stop = choice["finish_reason"], choice.get("stop_reason")
    if current is not None:
        yield CLOSE, current
    yield END, reason, usage, stop


def chat_tools(functions: list[dict]) -> list[dict]:
    """Function tools as chat takes them: {type: function, function: {name, description,
    parameters, strict}} from the dialect's flat {name, description, <schema>}."""
    return [{"type": "function", "function": {k: v for k, v in f.items() if v is not None}}
            for f in functions]


def tool_names(tools: list[dict] | None) -> set[str]:
    return {tool["function"]["name"] for tool in tools or ()}


def check_named_tool(name: str, tools: list[dict] | None, field: str) -> None:
    if name not in tool_names(tools):
        raise invalid(f"'{field}' names the tool {name!r}, which is not among 'tools'", field)
