"""The JSON field checks (server/http/validate.py) at their edges: the functions (what each
returns when a field is absent or null, which types each refuses), then the field specs (each
check, its message, its schema). Every bound is tried on both sides (the last value accepted,
the first refused), and every refusal is a 400 naming the field and its problem."""
import math

import pytest

from stackd.http import validate
from stackd.http import validate as v
from stackd.http.errors import ApiError, ErrorKind


def refusal(check, body, field="f", **options) -> ApiError:
    with pytest.raises(ApiError) as caught:
        check(body, field, **options)
    error = caught.value
    assert error.kind is ErrorKind.INVALID_REQUEST and error.kind.status == 400
    assert error.param == field and f"'{field}'" in error.message
    return error


# ---- string ------------------------------------------------------------------------------------

def test_a_required_string_that_is_absent_is_refused_as_required():
    assert "is required" in refusal(validate.string, {}).message


def test_an_optional_string_absent_or_null_gives_its_default():
    assert validate.string({}, "f", required=False) is None
    assert validate.string({}, "f", required=False, default="d") == "d"
    assert validate.string({"f": None}, "f", required=False, default="d") == "d"


def test_a_required_string_that_is_null_is_refused_as_not_a_string():
    assert "must be a string, not null" in refusal(validate.string, {"f": None}).message


@pytest.mark.parametrize("value, named", [(True, "boolean"), (1, "integer"), (1.5, "number"),
                                          ([], "array"), ({}, "object"), ((1,), "tuple")])
def test_a_string_of_another_type_is_refused_naming_that_type(value, named):
    assert f"must be a string, not {named}" in refusal(validate.string, {"f": value}).message


def test_an_empty_string_is_refused_unless_allowed():
    assert "must not be empty" in refusal(validate.string, {"f": ""}).message
    assert validate.string({"f": ""}, "f", allow_empty=True) == ""


def test_the_default_string_length_limit_is_4096_inclusive():
    assert validate.string({"f": "x" * 4096}, "f") == "x" * 4096
    error = refusal(validate.string, {"f": "x" * 4097})
    assert "longer than 4096 characters" in error.message


def test_a_string_is_returned_as_given():
    assert validate.string({"f": "héllo"}, "f", max_len=5) == "héllo"


# ---- integer -----------------------------------------------------------------------------------

def test_an_absent_or_null_integer_gives_its_default():
    assert validate.integer({}, "f", lo=0, hi=9) is None
    assert validate.integer({}, "f", lo=0, hi=9, default=3) == 3
    assert validate.integer({"f": None}, "f", lo=0, hi=9, default=3) == 3


def test_a_required_integer_that_is_absent_or_null_is_refused():
    assert "is required" in refusal(validate.integer, {}, lo=0, hi=9, required=True).message
    assert "is required" in refusal(validate.integer, {"f": None}, lo=0, hi=9, required=True).message


@pytest.mark.parametrize("value, named", [(True, "boolean"), (False, "boolean"), (1.0, "number"),
                                          ("1", "string"), ([1], "array")])
def test_an_integer_of_another_type_is_refused_naming_that_type(value, named):
    error = refusal(validate.integer, {"f": value}, lo=0, hi=9)
    assert f"must be an integer, not {named}" in error.message


@pytest.mark.parametrize("check, lo, hi, outside", [
    (validate.integer, -3, 7, (-4, 8)),
    (validate.number, -0.5, 0.5, (-0.5001, 0.5001, float("nan"))),     # NaN is outside too
])
def test_bounds_are_inclusive_and_named(check, lo, hi, outside):
    assert check({"f": lo}, "f", lo=lo, hi=hi) == lo
    assert check({"f": hi}, "f", lo=lo, hi=hi) == hi
    for value in outside:
        error = refusal(check, {"f": value}, lo=lo, hi=hi)
        assert f"must be between {lo} and {hi}, got {value}" in error.message


# ---- number ------------------------------------------------------------------------------------

def test_an_absent_or_null_number_gives_its_default():
    assert validate.number({}, "f", lo=0, hi=1) is None
    assert validate.number({"f": None}, "f", lo=0, hi=1, default=0.5) == 0.5


def test_a_number_may_be_an_integer_and_comes_back_as_a_float():
    value = validate.number({"f": 1}, "f", lo=0, hi=1)
    assert value == 1.0 and isinstance(value, float)


@pytest.mark.parametrize("value, named", [(True, "boolean"), ("0.5", "string")])
def test_a_number_of_another_type_is_refused_naming_that_type(value, named):
    error = refusal(validate.number, {"f": value}, lo=0, hi=1)
    assert f"must be a number, not {named}" in error.message


# ---- boolean and object ------------------------------------------------------------------------

def test_an_absent_or_null_boolean_gives_its_default():
    assert validate.boolean({}, "f") is False
    assert validate.boolean({"f": None}, "f") is False
    assert validate.boolean({}, "f", default=True) is True


def test_a_boolean_is_returned_as_given():
    assert validate.boolean({"f": True}, "f") is True
    assert validate.boolean({"f": False}, "f", default=True) is False


@pytest.mark.parametrize("value, named", [(1, "integer"), (0, "integer"), ("true", "string")])
def test_a_boolean_of_another_type_is_refused(value, named):
    assert f"must be a boolean, not {named}" in refusal(validate.boolean, {"f": value}).message


def test_an_object_absent_or_null_gives_its_default_and_is_returned_as_given():
    assert validate.obj({}, "f") is None
    assert validate.obj({"f": None}, "f", default={"d": 1}) == {"d": 1}
    given = {"a": 1}
    assert validate.obj({"f": given}, "f") is given


@pytest.mark.parametrize("value, named", [([], "array"), ("{}", "string"), (1, "integer")])
def test_an_object_of_another_type_is_refused(value, named):
    assert f"must be an object, not {named}" in refusal(validate.obj, {"f": value}).message


# ---- the field specs --------------------------------------------------------------------------


def error_of(spec, body):
    with pytest.raises(ApiError) as err:
        spec.read(body)
    assert err.value.kind.status == 400
    return err.value


def test_integer_bounds_are_inclusive_and_booleans_are_not_integers():
    spec = v.Integer("n", lo=1, hi=16, default=1)
    assert spec.read({}) == 1 and spec.read({"n": None}) == 1
    assert spec.read({"n": 1}) == 1 and spec.read({"n": 16}) == 16
    assert error_of(spec, {"n": 17}).message == "'n' must be between 1 and 16, got 17"
    assert error_of(spec, {"n": 0}).param == "n"
    assert error_of(spec, {"n": True}).message == "'n' must be an integer, not boolean"
    assert error_of(spec, {"n": 1.0}).message == "'n' must be an integer, not number"
    assert v.Integer("k", lo=0).schema() == {"type": "integer", "minimum": 0}


def test_number_rejects_nan_and_out_of_range():
    spec = v.Number("t", lo=0.0, hi=2.0)
    assert spec.read({"t": 2}) == 2.0 and isinstance(spec.read({"t": 2}), float)
    assert "between 0.0 and 2.0" in error_of(spec, {"t": -0.01}).message
    assert error_of(spec, {"t": math.nan}).param == "t"
    assert error_of(spec, {"t": False}).message == "'t' must be a number, not boolean"


def test_string_length_edge_and_empty_and_null():
    spec = v.String("model", required=True, max_len=3)
    assert spec.read({"model": "abc"}) == "abc"
    assert error_of(spec, {"model": "abcd"}).message == "'model' is longer than 3 characters"
    assert error_of(spec, {"model": ""}).message == "'model' must not be empty"
    assert error_of(spec, {}).message == "'model' is required"
    assert error_of(spec, {"model": None}).message == "'model' must be a string, not null"
    assert v.String("u", max_len=3).read({"u": None}) is None


def test_choices():
    spec = v.String("encoding_format", choices=("float", "base64"), default="float")
    assert spec.read({}) == "float" and spec.read({"encoding_format": "base64"}) == "base64"
    assert error_of(spec, {"encoding_format": "hex"}).message == \
        "'encoding_format' must be 'float' or 'base64'"
    assert spec.schema_in_object()["enum"] == ["float", "base64", None]


def test_boolean():
    spec = v.Boolean("stream")
    assert spec.read({}) is False and spec.read({"stream": True}) is True
    assert error_of(spec, {"stream": 1}).message == "'stream' must be a boolean, not integer"


def test_nested_paths_name_the_field():
    message = v.Object("", v.String("role", required=True, choices=("user",)),
                       v.Integer("weight", lo=0))
    spec = v.Array("messages", message, required=True, min_items=1, max_items=2)
    assert spec.read({"messages": [{"role": "user"}]}) == [{"role": "user"}]
    assert len(spec.read({"messages": [{"role": "user"}] * 2})) == 2          # max_items, inclusive
    assert error_of(spec, {"messages": []}).message == "'messages' must not be empty"
    assert error_of(spec, {"messages": [{"role": "user"}] * 3}).message == \
        "'messages' may hold at most 2 items"
    err = error_of(spec, {"messages": [{"role": "user"}, {"role": "bot"}]})
    assert err.message == "'messages[1].role' must be 'user'" and err.param == "messages[1].role"
    err = error_of(spec, {"messages": [{"role": "user", "weight": -1}]})
    assert err.param == "messages[0].weight"
    assert error_of(spec, {"messages": [{}]}).message == "'messages[0].role' is required"
    assert error_of(spec, {"messages": ["hi"]}).message == "'messages[0]' must be an object, not string"


def test_object_message_replaces_inner_complaints():
    part = v.Object("", v.Const("type", "text", required=True), message="'{field}' is not a text part")
    spec = v.Array("content", part)
    assert error_of(spec, {"content": [{"type": "image"}]}).message == "'content[0]' is not a text part"
    assert error_of(spec, {"content": [3]}).message == "'content[0]' is not a text part"


def test_one_of_shows_the_complaint_of_the_value_s_own_type():
    spec = v.OneOf("stop", v.String(max_len=4), v.Array(items=v.String(max_len=4), max_items=2),
                   message="'{field}' must be a string or strings")
    assert spec.read({"stop": "ab"}) == "ab" and spec.read({"stop": ["a", "b"]}) == ["a", "b"]
    assert error_of(spec, {"stop": ["a", 5]}).message == "'stop[1]' must be a string, not integer"
    assert error_of(spec, {"stop": "abcde"}).message == "'stop' is longer than 4 characters"
    assert error_of(spec, {"stop": 5}).message == "'stop' must be a string or strings"


def test_tokens():
    spec = v.Tokens("input")
    assert spec.read({"input": [0, 5]}) == [0, 5]
    assert spec.read({"input": [0]}) == [0]                   # the least: one token, id 0
    for bad in ([], [1, -1], [1, True], [1.0]):
        assert error_of(spec, {"input": bad}).param == "input"


def test_fields_read_every_spec_in_one_pass_and_fill_defaults():
    specs = [v.Integer("n", lo=1, hi=4, default=1), v.Boolean("stream"),
             v.String("model", required=True)]
    fields = v.Fields(specs)
    assert fields.read({"model": "m", "other": object()}) == {"n": 1, "stream": False, "model": "m"}
    assert error_of(fields, {"n": 2}).message == "'model' is required"
    specs.append(v.Integer("k", lo=0, hi=1))         # read by reference
    assert error_of(fields, {"model": "m", "k": 2}).param == "k"


def test_schemas_of_optional_fields_take_null():
    assert v.Integer("n", lo=1, hi=2).schema_in_object()["type"] == ["integer", "null"]
    assert v.Integer("n", lo=1, hi=2, required=True).schema_in_object()["type"] == "integer"
    assert v.OneOf("s", v.String(), v.Tokens()).schema_in_object()["anyOf"][1] == {"type": "null"}
    body = v.Body(v.String("model", required=True), [v.Boolean("stream")])
    assert body.schema()["required"] == ["model"]
    assert set(body.schema()["properties"]) == {"model", "stream"}


def test_flat_fields_report_their_own_name_as_param():
    spec = v.OneOf("stop", v.String(), v.Array(items=v.String()), flat=True)
    err = error_of(spec, {"stop": ["a", 1]})
    assert err.message == "'stop[1]' must be a string, not integer" and err.param == "stop"
    inner = v.Object("response_format", v.String("type", choices=("text",)), flat=True)
    assert error_of(inner, {"response_format": {"type": "x"}}).param == "response_format"
