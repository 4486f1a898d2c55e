"""The tool fields' limits at their edges (api/inference/tools.py)."""
import pytest

from stackd.api.inference import tools
from stackd.http.errors import ApiError
from stackd.errors import DomainError


def function(name, parameters=None):
    out = {"type": "function", "function": {"name": name}}
    if parameters is not None:
        out["function"]["parameters"] = parameters
    return out


def refusal(body) -> str:
    with pytest.raises((ApiError, DomainError)) as refused:
        tools.read(body)
    return refused.value.param


def test_at_most_max_tools():
    assert len(tools.read({"tools": [function(f"f{i}") for i in range(tools.MAX_TOOLS)]}).tools) == tools.MAX_TOOLS
    assert refusal({"tools": [function(f"f{i}") for i in range(tools.MAX_TOOLS + 1)]}) == "tools"


def test_names_up_to_64_characters():
    assert tools.read({"tools": [function("a" * 64)]}).tools[0].name == "a" * 64
    assert refusal({"tools": [function("a" * 65)]}) == "tools[0].function.name"


def test_parameters_schema_depth_limit_names_the_function():
    deep = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"x": deep}}
    assert refusal({"tools": [function("ok"), function("f", deep)]}) == "tools[1].function.parameters"


def test_named_choice_becomes_required_of_that_function():
    request = tools.read({"tools": [function("a"), function("b")],
                          "tool_choice": {"type": "function", "function": {"name": "b"}}})
    assert request.choice == "required" and [t.name for t in request.offered()] == ["b"]


def test_none_and_no_tools():
    assert tools.read({}) is None
    assert not tools.read({"tools": [function("a")], "tool_choice": "none"}).active
    assert refusal({"tool_choice": "none"}) == "tool_choice"
