"""What the dialects built on chat (OpenAI Responses, Anthropic messages) share.

Each parses its body into the typed request (serving/request.py ChatRequest, naming its own
fields for the checks made once the model is known) and starts a chat.ChatRun; its typed output
(serving/output.py: steps as content blocks, whole messages) each dialect words in its own
objects and events. Also here: a tagged union spec (content blocks, input items), named
server-sent events, and a named tool choice's check.
"""
from __future__ import annotations

import orjson

from ...http import validate as V
from ...http.errors import invalid
from ...serving.output import new_id  # noqa: F401  (the dialects' ids: msg_..., resp_..., toolu_...)

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


def named_sse(event: str, obj) -> bytes:
    """A server-sent event with its name (Responses and Anthropic both name each event)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def check_named_tool(name: str, tools, field: str) -> None:
    """A choice that names a tool (chat.tools.Tool) must name one of them."""
    if name not in {tool.name for tool in tools}:
        raise invalid(f"'{field}' names the tool {name!r}, which is not among 'tools'", field)
