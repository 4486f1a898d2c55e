"""Tool calling for templates that do not describe tools: the generic JSON form.

A chat template that never mentions `tools` (the default SmolLM2's) cannot show the model the
tools, nor render an assistant turn that called one. As llama-server does for such templates,
the conversation is rewritten before the (sandboxed) template renders it:

* the tools, with an example call, go into the system message, which also asks for JSON;
* an assistant turn's `tool_calls` become its content, `{"tool_calls": [...], "content": ...}`;
* a `tool` turn becomes a user turn `{"tool_response": {"tool", "content", "tool_call_id"}}`.

The answer is forced into JSON by a grammar built from the tools' schemas (through the same
schema budget as `response_format`): `{"tool_call": {"name", "arguments"}}`, with
`parallel_tool_calls` `{"tool_calls": [...]}`, and under `tool_choice: auto` also
`{"response": "..."}`. The output is read back by `GenericParser`, which also reads it while
it is being generated, so that a stream carries the call's name and then its arguments as they
come. The arguments are the model's own text of the JSON object (a valid JSON text: the grammar
saw to it), so the streamed fragments and the whole answer are the same bytes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import invalid
from . import grammar as _grammar
from . import limits as _limits

SYSTEM_JSON = ("Respond in JSON format, either with `tool_call` (a request to call tools) or with "
               "`response` reply to the user's request")
SYSTEM_JSON_REQUIRED = "Respond in JSON format with `tool_call` (a request to call tools)"
SYSTEM_JSON_PARALLEL = ("Respond in JSON format, either with `tool_calls` (a request to call "
                        "tools) or with `response` reply to the user's request")
SYSTEM_JSON_PARALLEL_REQUIRED = "Respond in JSON format with `tool_calls` (a request to call tools)"
NO_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict

    def as_openai(self) -> dict:
        function = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolRequest:
    """What a request asks of tools: `choice` is "auto", "required" or "none"; `named` the one
    function a named choice forces (choice "required")."""
    tools: tuple[Tool, ...]
    choice: str
    named: str | None = None
    parallel: bool = False

    @property
    def active(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    def offered(self) -> tuple[Tool, ...]:
        """The tools the answer may call."""
        if self.named is not None:
            return tuple(t for t in self.tools if t.name == self.named)
        return self.tools


# ---- the generic form's prompt -------------------------------------------------------------

def _example(request: ToolRequest) -> str:
    call = {"name": "tool_name", "arguments": {"arg1": "some_value"}}
    if request.parallel:
        return json.dumps({"tool_calls": [call]}, indent=2)
    return json.dumps({"tool_call": call}, indent=2)


def system_text(request: ToolRequest) -> str:
    tools = [t.as_openai() for t in request.offered()]
    if request.parallel:
        ask = SYSTEM_JSON_PARALLEL_REQUIRED if request.choice == "required" else SYSTEM_JSON_PARALLEL
    else:
        ask = SYSTEM_JSON_REQUIRED if request.choice == "required" else SYSTEM_JSON
    return ("You can call any of the following tools to satisfy the user's requests: "
            f"{json.dumps(tools, indent=2, ensure_ascii=False)}\n\nExample tool call syntax:\n\n"
            f"{_example(request)}\n\n{ask}")


def _arguments_value(text: str):
    """A call's arguments as the turn shows them: the object, when the string is JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def polyfill_turns(messages: list[dict]) -> list[dict]:
    """Tool-call and tool-result turns as plain turns the template can render."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if message["role"] == "assistant" and calls:
            body = {"tool_calls": [{"name": c["function"]["name"],
                                    "arguments": _arguments_value(c["function"]["arguments"]),
                                    "id": c.get("id", "")} for c in calls]}
            if message.get("content"):
                body["content"] = message["content"]
            out.append({"role": "assistant", "content": json.dumps(body, indent=2, ensure_ascii=False)})
        elif message["role"] == "tool":
            response = {"tool": message.get("name", ""), "content": message["content"],
                        "tool_call_id": message.get("tool_call_id", "")}
            out.append({"role": "user",
                        "content": json.dumps({"tool_response": response}, indent=2, ensure_ascii=False)})
        else:
            out.append(message)
    return out


def generic_messages(messages: list[dict], request: ToolRequest | None) -> list[dict]:
    """The conversation the template renders under the generic form."""
    out = polyfill_turns(messages)
    if request is None or not request.active:
        return out
    text = system_text(request)
    if out and out[0]["role"] == "system":
        return [{**out[0], "content": f"{out[0]['content']}\n\n{text}"}, *out[1:]]
    return [{"role": "system", "content": text}, *out]


# ---- the generic form's grammar ------------------------------------------------------------

def _call_schema(tool: Tool) -> dict:
    schema = {"type": "object",
              "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
              "required": ["name", "arguments"]}
    if tool.description:
        schema["description"] = tool.description
    return schema


def generic_schema(request: ToolRequest) -> dict:
    calls = [_call_schema(t) for t in request.offered()]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if request.parallel:
        answer = {"type": "object", "required": ["tool_calls"],
                  "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}}}
    else:
        answer = {"type": "object", "required": ["tool_call"], "properties": {"tool_call": one}}
    if request.choice == "required":
        return answer
    reply = {"type": "object", "required": ["response"], "properties": {"response": {"type": "string"}}}
    return {"anyOf": [answer, reply]}


def generic_grammar(request: ToolRequest, limit: _limits.InferenceLimits | None = None) -> str:
    return _grammar.json_schema_grammar(generic_schema(request), limit, param="tools")


# ---- reading the answer back ---------------------------------------------------------------

@dataclass
class Call:
    name: str
    arguments: str
    id: str = ""


@dataclass
class Message:
    """An answer read so far: content, reasoning, and the calls whose names are complete."""
    content: str = ""
    reasoning: str = ""
    calls: list[Call] = field(default_factory=list)


class _Incomplete(Exception):
    """The text ends here."""


class _Scanner:
    """A forward reader of one JSON text that may stop anywhere (the grammar made it valid)."""

    __slots__ = ("text", "i")

    def __init__(self, text: str):
        self.text, self.i = text, 0

    def space(self) -> None:
        text, i = self.text, self.i
        while i < len(text) and text[i] in " \t\n\r":
            i += 1
        self.i = i
        if i >= len(text):
            raise _Incomplete

    def expect(self, ch: str) -> None:
        self.space()
        if self.text[self.i] != ch:
            raise ValueError(f"expected {ch!r} at {self.i}")
        self.i += 1

    def peek(self) -> str:
        self.space()
        return self.text[self.i]

    def string(self, sink: list | None = None) -> str:
        """A string's value; with `sink`, what is decoded so far is kept there if it ends early."""
        self.expect('"')
        text, start = self.text, self.i
        i = start
        while True:
            if i >= len(text):
                if sink is not None:
                    sink.append(_decode_partial(text[start:]))
                raise _Incomplete
            ch = text[i]
            if ch == "\\":
                i += 2
            elif ch == '"':
                self.i = i + 1
                return json.loads(text[start - 1:i + 1])
            else:
                i += 1

    def value_text(self, sink: list | None = None) -> str:
        """The raw text of one value (any depth, no recursion); with `sink`, the partial text."""
        self.space()
        text, start = self.text, self.i
        depth, i, in_string = 0, start, False
        while i < len(text):
            ch = text[i]
            if in_string:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_string = False
                    if depth == 0:
                        self.i = i + 1
                        return text[start:i + 1]
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    self.i = i + 1
                    return text[start:i + 1]
            elif depth == 0 and ch in ",} \t\n\r" and i > start:
                self.i = i
                return text[start:i]
            i += 1
        if sink is not None:
            sink.append(text[start:])
        raise _Incomplete


def _decode_partial(raw: str) -> str:
    """The decoded text of an unfinished JSON string body, up to its last complete escape."""
    cut = len(raw)
    backslash = raw.rfind("\\", max(0, cut - 6))
    if backslash >= 0:
        # an escape near the end may be incomplete: \, \u, \u12 ...; drop it until it is whole
        run = len(raw[:backslash]) - len(raw[:backslash].rstrip("\\"))
        if run % 2 == 0:
            whole = 2 if raw[backslash + 1:backslash + 2] not in ("u", "") else 6
            if cut - backslash < whole:
                cut = backslash
    try:
        return json.loads('"' + raw[:cut] + '"')
    except ValueError:
        return ""


def _read_call(s: _Scanner, calls: list[Call], partial_args: list) -> None:
    s.expect("{")
    name = None
    while True:
        key = s.string()
        s.expect(":")
        if key == "name":
            name = s.string()
        elif key == "arguments":
            if name is None:
                raise ValueError("arguments before name")
            sink: list = []
            try:
                raw = s.value_text(sink)
            except _Incomplete:
                calls.append(Call(name, sink[0] if sink else ""))
                partial_args.append(True)
                raise
            calls.append(Call(name, raw))
        else:
            s.value_text()
        if s.peek() == ",":
            s.i += 1
            continue
        s.expect("}")
        return


def parse_generic(text: str) -> tuple[Message, bool]:
    """The answer in `text` (maybe unfinished) and whether it was complete. The grammar keeps a
    generated answer in this form; text that is not (none is expected) is returned as content,
    never an error: a parse failure must not turn a finished generation into a 500."""
    try:
        return _parse_generic(text)
    except ValueError:
        message = Message()
        message.content = text
        return message, True


def _parse_generic(text: str) -> tuple[Message, bool]:
    message = Message()
    s = _Scanner(text)
    partial_args: list = []
    try:
        s.expect("{")
        key = s.string()
        s.expect(":")
        if key == "response":
            sink: list = []
            try:
                message.content = s.string(sink)
            except _Incomplete:
                message.content = sink[0] if sink else ""
                raise
        elif key == "tool_call":
            _read_call(s, message.calls, partial_args)
        elif key == "tool_calls":
            s.expect("[")
            while True:
                _read_call(s, message.calls, partial_args)
                if s.peek() == ",":
                    s.i += 1
                    continue
                s.expect("]")
                break
        else:
            raise ValueError(f"unexpected key {key!r}")
        s.expect("}")
        return message, True
    except _Incomplete:
        return message, False
