"""The grammar budget at each of its edges: a schema exactly at a limit converts, one past it is
a 400 on 'response_format' that names the limit, its value and its setting."""
import pytest

from stackd.http.errors import ApiError, ErrorKind

from tests.answers import raises_http
from stackd.chat import grammar, limits
from stackd.chat.grammar import check_grammar, expanded_bytes, json_schema_grammar, nesting

SMALL = limits.InferenceLimits(schema_max_depth=4, schema_max_nodes=6, grammar_max_repeat=5,
                               grammar_max_enum=3, grammar_max_rules=40, grammar_max_bytes=4000)


def refusal(schema, limit=SMALL) -> ApiError:
    with raises_http() as caught:
        json_schema_grammar(schema, limit)
    error = caught.value
    assert error.kind is ErrorKind.INVALID_REQUEST and error.param == "response_format"
    return error


def over_budget(schema, setting, limit=SMALL) -> str:
    message = refusal(schema, limit).message
    assert message.startswith("the JSON schema in 'response_format' is too large: ")
    value = getattr(limit, setting)
    assert f"(the limit is {value}, setting inference.limits.{setting})" in message
    return message


def nested_arrays(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def test_the_limits_given_are_the_limits_used():
    json_schema_grammar({"type": "string", "maxLength": 6})        # the default budget allows it
    over_budget({"type": "string", "maxLength": 6}, "grammar_max_repeat")


def test_without_limits_the_configured_ones_apply(monkeypatch):
    monkeypatch.setattr(limits, "current", SMALL)
    with raises_http() as caught:
        json_schema_grammar({"type": "string", "maxLength": 6})
    assert "grammar_max_repeat" in caught.value.message


@pytest.mark.parametrize("keyword", ["maxLength", "minLength", "maxItems", "minItems",
                                     "maxProperties", "minProperties", "maxContains", "minContains"])
def test_every_repetition_keyword_counts_up_to_its_limit(keyword):
    kind = "string" if "Length" in keyword else "object" if "Properties" in keyword else "array"
    json_schema_grammar({"type": kind, keyword: 5}, SMALL)
    json_schema_grammar({"type": kind, keyword: 0}, SMALL)
    message = over_budget({"type": kind, keyword: 6}, "grammar_max_repeat")
    assert f"'{keyword}' is 6" in message


@pytest.mark.parametrize("value", [True, "5", None, [5]])
def test_a_repetition_count_must_be_a_number(value):
    message = refusal({"type": "string", "maxLength": value}).message
    assert message == "'maxLength' in the JSON schema must be a number"


def test_a_repetition_count_must_not_be_negative():
    assert refusal({"type": "string", "minLength": -1}).message == \
        "'minLength' in the JSON schema must not be negative"


def test_an_enum_counts_up_to_its_limit():
    json_schema_grammar({"enum": ["a", "b", "c"]}, SMALL)
    message = over_budget({"enum": ["a", "b", "c", "d"]}, "grammar_max_enum")
    assert "an enum has 4 values" in message


@pytest.mark.parametrize("pattern", ["^a{5}$", "^a{0,5}$", "^a{5,}$", "^a{ 2 , 5 }$"])
def test_pattern_quantifiers_up_to_the_limit_convert(pattern):
    json_schema_grammar({"type": "string", "pattern": pattern}, SMALL)


@pytest.mark.parametrize("pattern, value", [("^a{6}$", 6), ("^a{1,6}$", 6), ("^a{6,}$", 6),
                                            ("^a{ 7 , 9 }$", 7)])
def test_pattern_quantifiers_past_the_limit_are_refused(pattern, value):
    message = over_budget({"type": "string", "pattern": pattern}, "grammar_max_repeat")
    assert f"a pattern repeats {value} times" in message


@pytest.mark.parametrize("ref", ["https://example.com/s.json", "s.json#/a", 5])
def test_only_local_references_are_allowed(ref):
    message = refusal({"$ref": ref}).message
    assert message == "only local '$ref' references ('#/...') are allowed in the JSON schema"


def test_a_local_reference_converts():
    gbnf = json_schema_grammar({"$defs": {"b": {"type": "boolean"}}, "$ref": "#/$defs/b"}, SMALL)
    assert "true" in gbnf


def test_depth_counts_the_root_as_level_one():
    json_schema_grammar(nested_arrays(4), SMALL)
    message = over_budget(nested_arrays(5), "schema_max_depth")
    assert "nested deeper than 4 levels" in message


def test_lists_count_as_levels_and_as_nodes():
    # root object, its anyOf list and the two schemas in it: 4 nodes on 3 levels
    json_schema_grammar({"anyOf": [{"type": "string"}, {"type": "null"}]}, SMALL)
    deep = {"anyOf": [{"anyOf": [{"type": "string"}]}]}           # dict, list, dict, list, dict
    over_budget(deep, "schema_max_depth")


def test_node_count_up_to_its_limit():
    six = {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "boolean"},
                     {"type": "integer"}]}                          # 1 + list + 4 = 6 nodes
    json_schema_grammar(six, SMALL)
    seven = {"anyOf": [*six["anyOf"], {"type": "number"}]}
    message = over_budget(seven, "schema_max_nodes")
    assert "more than 6 objects and arrays" in message


def test_keywords_are_checked_in_every_nested_schema():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "string", "maxLength": 6}}}}
    over_budget(schema, "grammar_max_repeat", limits.InferenceLimits(grammar_max_repeat=5))


def test_the_converted_grammar_is_measured_in_bytes_and_rules():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5)}}
    gbnf = json_schema_grammar(wide, limits.InferenceLimits())
    size, rules = expanded_bytes(gbnf), gbnf.count("::=")
    assert size > len(gbnf)            # llama.cpp's string rule repeats a hex digit {4} times
    json_schema_grammar(wide, limits.InferenceLimits(grammar_max_bytes=size, grammar_max_rules=rules))
    message = over_budget(wide, "grammar_max_bytes", limits.InferenceLimits(grammar_max_bytes=size - 1))
    assert f"its grammar is {size} bytes with its repetitions written out" in message
    message = over_budget(wide, "grammar_max_rules", limits.InferenceLimits(grammar_max_rules=rules - 1))
    assert f"its grammar has {rules} rules" in message


def test_a_schema_the_converter_cannot_express_is_a_400_with_a_bounded_message():
    assert refusal({"type": "frob"}).message.startswith("unsupported JSON schema: ")
    long = refusal({"$ref": "#/definitions/" + "x" * 400}).message
    assert long.startswith("unsupported JSON schema: ") and len(long) == 25 + 300


def test_repetitions_count_as_written_out():
    assert expanded_bytes('root ::= "a"') == len('root ::= "a"')
    assert expanded_bytes("root ::= char{0,900}") == len("root ::= char{0,900}") + 900 * 8
    assert expanded_bytes("root ::= [0-9a-fA-F]{4}") == len("root ::= [0-9a-fA-F]{4}") + 4 * 11
    assert expanded_bytes("root ::= x{3,}") == len("root ::= x{3,}") + 3 * 8


def test_nesting_counts_groups_outside_literals_and_classes():
    assert nesting('root ::= "a"') == 0
    assert nesting("root ::= (a (b) (c (d)))") == 3
    assert nesting('root ::= "((" ( "x" )') == 1                  # parentheses in a literal
    assert nesting('root ::= "\\"((" (x)') == 1                   # after an escaped quote
    assert nesting("root ::= [(] ([)] x)") == 1                   # parentheses in a class
    assert nesting("root ::= [\\](] (x)") == 1                    # after an escaped bracket
    assert nesting("root ::= (a) (b) ((c))") == 2                 # siblings do not add up


def test_a_grammar_nested_deeper_than_llama_cpp_survives_is_refused():
    limit = limits.InferenceLimits(grammar_max_bytes=1 << 20)
    depth = grammar.MAX_GRAMMAR_NESTING
    check_grammar("root ::= " + "(" * depth + '"a"' + ")" * depth, limit)
    with raises_http() as caught:
        check_grammar("root ::= " + "(" * (depth + 1) + '"a"' + ")" * (depth + 1), limit)
    assert caught.value.param == "response_format"
    assert caught.value.message == (
        f"the JSON schema in 'response_format' is too large: its grammar nests deeper than {depth} "
        f"groups (the limit is {depth}, setting inference.limits.grammar_max_repeat)")


# ---- bounds that match nothing: llama.cpp's parser takes n - m unsigned and never stops --------

@pytest.mark.parametrize("schema, needle", [
    ({"type": "string", "minLength": 5, "maxLength": 2}, "'minLength' is 5 and 'maxLength' is 2"),
    ({"type": "array", "items": {"type": "integer"}, "minItems": 4, "maxItems": 2}, "'minItems' is 4"),
    ({"type": "object", "minProperties": 2, "maxProperties": 1}, "'minProperties' is 2"),
    ({"type": "string", "pattern": "^b{3,1}$"}, "at least 3 and at most 1 times"),
    ({"type": "string", "pattern": "^(ab){5, 2}$"}, "at least 5 and at most 2 times"),
    ({"type": "string", "pattern": "^[5-1]$"}, "character range 5-1 ends before it begins"),
    ({"type": "string", "pattern": "^x[^z-a]+$"}, "character range z-a ends before it begins"),
    ({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 2}, "no integer lies within"),
    ({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4}, "no integer lies within"),
    ({"type": "number", "minimum": 3, "exclusiveMaximum": 3}, "no number lies within"),
    ({"type": "number", "minimum": 5, "maximum": 2}, "no number lies within"),
])
def test_bounds_that_match_nothing_are_refused(schema, needle):
    message = refusal(schema, limits.InferenceLimits()).message
    assert "can match nothing" in message or "repeats an item" in message
    assert needle in message


@pytest.mark.parametrize("schema", [
    {"type": "string", "minLength": 2, "maxLength": 2},          # equal bounds: exactly n
    {"type": "integer", "minimum": 2, "maximum": 2},
    {"type": "integer", "minimum": 2, "exclusiveMaximum": 3},       # 2 lies between
    {"type": "number", "minimum": 3, "maximum": 3},
    {"type": "string", "pattern": "^b{1,3}$"},
    {"enum": ["a{3,1}"]},                                         # braces in a literal are text
    {"type": "string", "pattern": "^[a\\-0][-z][z-][\\d-a]\\[9-0\\]$"},   # dashes that are not ranges
    {"const": "[x{9,2}]"},
])
def test_bounds_at_their_edge_and_braces_in_literals_convert(schema):
    json_schema_grammar(schema, limits.InferenceLimits())


def test_a_grammar_with_reversed_bounds_is_refused_whatever_made_it():
    """The check on the grammar itself (tool-call grammars come from other converters)."""
    assert grammar.reversed_bounds('root ::= "a{3,1}" [b{3,1}] c{1,3}') is None
    assert grammar.reversed_bounds("root ::= item{3,1}") == (3, 1)
    with raises_http() as caught:
        check_grammar("root ::= item{3, 1}\nitem ::= \"x\"", limits.InferenceLimits(), "tools")
    assert caught.value.param == "tools" and "at least 3 and at most 1" in caught.value.message


# ---- repetitions inside repetitions: one parse stack per way to split a run ------------------

@pytest.mark.parametrize("pattern, product", [
    ("^((a{0,30}){0,30}){0,30}$", 27000),
    ("^(a{0,200}){0,200}$", 40000),
    ("^(?:a{0,10}){0,11}$", 110),            # one past the limit
    ("^(a{0,101}|b){1}$", 101),
])
def test_nested_repetitions_past_the_limit_are_refused(pattern, product):
    assert grammar.nested_repeat(pattern) == product
    message = refusal({"type": "string", "pattern": pattern}, limits.InferenceLimits()).message
    assert f"nests repetitions {product} times over" in message and "is 100, fixed" in message


@pytest.mark.parametrize("pattern, product", [
    ("^a{0,900}$", 1),                                # one level: one parse stack
    ("^(ab){0,30}$", 1),
    ("^(?:a{0,10}){0,10}$", 100),                    # at the limit
    ("^(\\d{1,3}\\.){3}\\d{1,3}$", 9),                  # an IPv4 address
    ("^[\\w.-]+@([\\w-]+\\.)+[\\w-]{2,4}$", 1),          # loops count 1
    ("^[(]{3}(x{5}){2}$", 10),                       # a bracket in a class opens no group
])
def test_nested_repetitions_within_the_limit_convert(pattern, product):
    assert grammar.nested_repeat(pattern) == product
    json_schema_grammar({"type": "string", "pattern": pattern}, limits.InferenceLimits())
