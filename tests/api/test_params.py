"""Request parameters at their edges: each bound, type and limit, both sides of it."""
import pytest

from stackd.http import validate
from stackd.http.errors import ApiError

from tests.answers import raises_http
from stackd.api.inference import params

VOCAB = 49152


def parse(**fields):
    return params.parse({"messages": [], **fields}, n_vocab=VOCAB, chat=True)


def refused(**fields) -> ApiError:
    with raises_http() as caught:
        parse(**fields)
    assert caught.value.kind.status == 400
    return caught.value


@pytest.mark.parametrize("value", [True, False, 0, 17, -1, 1.5, "2"])
def test_n_out_of_range_or_of_the_wrong_type(value):
    assert refused(n=value).param == "n"


@pytest.mark.parametrize("value", [1, 16])
def test_n_at_its_bounds(value):
    assert parse(n=value).n == value


def test_temperature_bounds():
    assert parse(temperature=0).sampling.temperature == 0.0
    assert parse(temperature=2).sampling.temperature == 2.0
    refused(temperature=-0.0001)
    refused(temperature=2.0001)
    refused(temperature=float("nan"))
    refused(temperature=True)


@pytest.mark.parametrize("stop", [{"a": 1}, 5, [1], [""], ["a"] * 5, ["x" * 257], [None]])
def test_bad_stop(stop):
    assert refused(stop=stop).param == "stop"


def test_stop_at_its_limits():
    assert parse(stop=["x" * 256] * 4).stop == ["x" * 256] * 4
    assert parse(stop="end").stop == ["end"]


def test_string_length_is_inclusive():
    assert validate.string({"f": "x" * 8}, "f", max_len=8) == "x" * 8
    with raises_http():
        validate.string({"f": "x" * 9}, "f", max_len=8)


def test_integer_refuses_booleans_and_floats():
    for value in (True, 1.0):
        with raises_http():
            validate.integer({"f": value}, "f", lo=0, hi=10)
    assert validate.integer({"f": 10}, "f", lo=0, hi=10) == 10


def test_logit_bias_edges():
    assert len(parse(logit_bias={str(i): 1 for i in range(1024)}).sampling.logit_bias) == 1024
    refused(logit_bias={str(i): 1 for i in range(1025)})
    refused(logit_bias={str(VOCAB): 1})
    refused(logit_bias={"0": 100.5})
    assert parse(logit_bias={"0": -100}).sampling.logit_bias == [(0, -100.0)]


def test_max_tokens_edges():
    assert parse(max_tokens=1).max_tokens == 1
    assert parse(max_tokens=1 << 20).max_tokens == 1 << 20
    refused(max_tokens=0)
    refused(max_tokens=(1 << 20) + 1)


def json_schema(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"schema": schema}}


@pytest.mark.parametrize("schema, needle", [
    ({"type": "string", "maxLength": 20000}, "grammar_max_repeat"),
    ({"type": "array", "minItems": 5000000}, "grammar_max_repeat"),
    ({"type": "string", "pattern": "^a{1001}$"}, "grammar_max_repeat"),
    ({"enum": list(range(257))}, "grammar_max_enum"),
    ({"$ref": "https://example.com/schema.json"}, "local '$ref'"),
    ({"type": "string", "maxLength": -1}, "negative"),
])
def test_schemas_over_the_grammar_budget_are_refused_naming_it(schema, needle):
    error = refused(response_format=json_schema(schema))
    assert error.param == "response_format" and needle in error.message


def test_schema_budget_edges():
    parse(response_format=json_schema({"type": "string", "maxLength": 1000}))
    parse(response_format=json_schema({"enum": list(range(256))}))
    nested = {"type": "string"}
    for _ in range(30):
        nested = {"type": "array", "items": nested}
    parse(response_format=json_schema(nested))
    for _ in range(3):
        nested = {"type": "array", "items": nested}
    assert "schema_max_depth" in refused(response_format=json_schema(nested)).message


def test_the_grammar_size_after_conversion_is_bounded():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 900}
                                             for i in range(20)}}
    assert "grammar_max_bytes" in refused(response_format=json_schema(wide)).message
