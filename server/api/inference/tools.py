"""The tool fields of a chat request (`tools`, `tool_choice`, `parallel_tool_calls`,
`reasoning_effort`), checked. Each choice's answer is read back by serving/reader.py."""
from __future__ import annotations

import re

from ...chat import limits
from ...chat import tools as chat_tools
from ...chat.grammar import check_schema
from ...http import validate as V
from ...http.errors import invalid

MAX_TOOLS = 128
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")

FUNCTION = V.Object(
    "function", V.String("name", required=True, max_len=64,
                         doc="Letters, digits, '_' and '-', at most 64."),
    V.String("description", max_len=None, allow_empty=True),
    V.Object("parameters", doc="A JSON Schema of the arguments (an object)."),
    V.Boolean("strict"))
TOOL = V.Object("", V.String("type", required=True, max_len=64, doc="Only 'function'."), FUNCTION)
TOOLS = V.Array("tools", TOOL, max_items=MAX_TOOLS,
                doc="Functions the model may call; their parameters' schemas share the "
                    "response_format grammar budget.")
NAMED_CHOICE = V.Object("", V.Const("type", "function", required=True),
                        V.Object("function", V.String("name", required=True, max_len=64),
                                 required=True))
TOOL_CHOICE = V.OneOf(
    "tool_choice", V.String(choices=CHOICES), NAMED_CHOICE,
    doc="'none', 'auto' (the default with tools), 'required', or "
        "{type: 'function', function: {name}} to force that function.")
PARALLEL_TOOL_CALLS = V.Boolean("parallel_tool_calls", default=False,
                                doc="Allow several calls in one answer.")
REASONING_EFFORT = V.String(
    "reasoning_effort", choices=("none", "minimal", "low", "medium", "high"),
    doc="For a model whose template thinks: 'none' switches thinking off (the template's "
        "enable_thinking); the others leave it on and bound it (thinking tokens, settings "
        "inference.reasoning_budget.*: minimal 64, low 256, medium 1024 (the default), high "
        "4096): past the budget the template's end-of-thinking tag is forced and the answer "
        "goes on.")
FIELDS = [TOOLS, TOOL_CHOICE, PARALLEL_TOOL_CALLS, REASONING_EFFORT]


def read(body: dict) -> chat_tools.ToolRequest | None:
    """The request's tools, checked; None when it has none."""
    tools = TOOLS.read(body)
    choice = TOOL_CHOICE.read(body)
    parallel = PARALLEL_TOOL_CALLS.read(body)
    if not tools:
        if choice is not None:
            raise invalid("'tool_choice' is only allowed when 'tools' are given", "tool_choice")
        return None
    for i, tool in enumerate(tools):
        if tool["type"] != "function":
            raise invalid(f"'tools[{i}].type' must be 'function', not {tool['type']!r}",
                          f"tools[{i}].type")
        if tool.get("function") is None:
            raise invalid(f"'tools[{i}].function' is required", f"tools[{i}].function")
    out = functions([(t["function"]["name"], t["function"].get("description"), t["function"].get("parameters"))
                     for t in tools], lambda i, part: f"tools[{i}].function.{part}")
    names = {tool.name for tool in out}
    named = None
    if isinstance(choice, dict):
        named = choice["function"]["name"]
        if named not in names:
            raise invalid(f"'tool_choice.function.name' names {named!r}, which is not in 'tools'",
                          "tool_choice")
        choice = "required"
    return chat_tools.ToolRequest(out, choice or "auto", named, parallel)


def functions(entries, where) -> tuple[chat_tools.Tool, ...]:
    """Function tools from (name, description, parameters) as a dialect's body gives them, each
    checked: a name of letters, digits, '_' or '-' (at most 64, OpenAI's rule and Anthropic's),
    no name twice, a schema within the grammar budget. `where(i, part)`: the body's path to
    part "name" or "parameters" of tool i, for the 400s."""
    out, names = [], set()
    for i, (name, description, parameters) in enumerate(entries):
        if not NAME.match(name):
            raise invalid(f"'{where(i, 'name')}' must be letters, digits, '_' or '-' (at most 64)",
                          where(i, "name"))
        if name in names:
            raise invalid(f"'{where(i, 'name')}' repeats the function {name!r}", where(i, "name"))
        names.add(name)
        parameters = parameters or dict(chat_tools.NO_PARAMETERS)
        check_schema(parameters, limits.current, where(i, "parameters"))
        out.append(chat_tools.Tool(name, description or "", parameters))
    return tuple(out)
