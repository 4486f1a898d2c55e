"""The JSON field checks at their edges: what each returns when a field is absent or null,
which types each refuses, and that every refusal is a 400 naming the field and its problem."""
import pytest

from stackd.http import validate
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
