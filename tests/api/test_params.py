"""OpenAI generation parameters through `params.parse`, field by field: the default a request
that leaves it out gets, both sides of each bound (the last value accepted and the first
refused), wrong types, and the 400 naming the parameter."""
import pytest
from llama_cpp.llama_grammar import JSON_GBNF

from stackd.api.inference import params
from stackd.http.errors import ApiError, ErrorKind

from tests.answers import raises_http

VOCAB = 1000


def chat(**fields) -> params.GenerationParams:
    return params.parse({"messages": [], **fields}, n_vocab=VOCAB, chat=True)


def completion(**fields) -> params.GenerationParams:
    return params.parse({"prompt": "", **fields}, n_vocab=VOCAB, chat=False)


def refused(parse=chat, **fields) -> ApiError:
    with raises_http() as caught:
        parse(**fields)
    error = caught.value
    assert error.kind is ErrorKind.INVALID_REQUEST and error.kind.status == 400
    return error


def test_a_bare_chat_request_gets_the_documented_defaults():
    g = chat()
    s = g.sampling
    assert (g.max_tokens, g.stop, g.n, g.stream, g.include_usage) == (None, [], 1, False, False)
    assert (g.seed, g.logprobs, g.top_logprobs, g.grammar) == (None, False, 0, "")
    floats = pytest.approx                          # the engine keeps them as float32
    assert (s.temperature, s.top_p, s.top_k, s.min_p) == floats((0.8, 0.95, 40, 0.05))
    assert (s.presence_penalty, s.frequency_penalty, s.repeat_penalty) == (0.0, 0.0, 1.0)
    assert (s.logit_bias, s.min_tokens, s.ignore_eos, s.grammar) == ([], 0, False, "")
    assert (s.logprobs, s.n_top_logprobs) == (False, 0)
    assert s.seed == 0xFFFFFFFF                     # llama.cpp's "random"


def test_a_bare_completion_gets_openais_16_tokens():
    assert completion().max_tokens == 16
    assert completion(max_tokens=3).max_tokens == 3
    assert completion().logprobs is False and completion().top_logprobs == 0


# ---- token counts ------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_fields_at_their_bounds(field):
    assert chat(**{field: 1}).max_tokens == 1
    assert chat(**{field: 1 << 20}).max_tokens == 1 << 20
    for value in (0, (1 << 20) + 1):
        assert refused(**{field: value}).param == field


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat(max_completion_tokens=5, max_tokens=9).max_tokens == 5
    assert completion(max_completion_tokens=5).max_tokens == 5


def test_min_tokens_at_its_bounds():
    assert chat(min_tokens=0).sampling.min_tokens == 0
    assert chat(min_tokens=1 << 20).sampling.min_tokens == 1 << 20
    for value in (-1, (1 << 20) + 1):
        assert refused(min_tokens=value).param == "min_tokens"


def test_n_default_and_bounds():
    assert chat().n == 1
    assert chat(n=16).n == 16 and chat(n=1).n == 1
    error = refused(n=17)
    assert error.param == "n" and "between 1 and 16" in error.message


@pytest.mark.parametrize("value", [True, False, 0, 17, -1, 1.5, "2"])
def test_n_out_of_range_or_of_the_wrong_type(value):
    assert refused(n=value).param == "n"


def test_a_completions_max_tokens_runs_from_0():
    # 0 is the prompt scored alone (with echo; completions.py refuses it without)
    assert completion(max_tokens=0).max_tokens == 0
    assert completion(max_tokens=1 << 20).max_tokens == 1 << 20
    for value in (-1, (1 << 20) + 1):
        assert refused(completion, max_tokens=value).param == "max_tokens"


# ---- streaming ---------------------------------------------------------------------------------

def test_stream_options_need_stream_and_carry_include_usage():
    g = chat(stream=True, stream_options={"include_usage": True})
    assert g.stream is True and g.include_usage is True
    assert chat(stream=True, stream_options={}).include_usage is False
    assert chat(stream=True).include_usage is False
    error = refused(stream_options={"include_usage": True})
    assert error.param == "stream_options"
    assert error.message == "'stream_options' is only allowed with 'stream': true"
    assert refused(stream=True, stream_options={"include_usage": 1}).param == "include_usage"


# ---- log probabilities -------------------------------------------------------------------------

def test_chat_logprobs_and_top_logprobs():
    g = chat(logprobs=True, top_logprobs=20)
    assert (g.logprobs, g.top_logprobs) == (True, 20)
    assert (g.sampling.logprobs, g.sampling.n_top_logprobs) == (True, 20)
    assert chat(logprobs=True).top_logprobs == 0
    assert chat(logprobs=False, top_logprobs=0).top_logprobs == 0
    assert refused(logprobs=True, top_logprobs=21).param == "top_logprobs"
    assert refused(logprobs=True, top_logprobs=-1).param == "top_logprobs"
    error = refused(top_logprobs=2)
    assert error.param == "top_logprobs"
    assert error.message == "'top_logprobs' requires 'logprobs': true"
    assert refused(logprobs=1).param == "logprobs"


def test_completion_logprobs_is_a_count_from_0_to_5():
    g = completion(logprobs=5)
    assert (g.logprobs, g.top_logprobs, g.sampling.n_top_logprobs) == (True, 5, 5)
    g = completion(logprobs=0)
    assert (g.logprobs, g.top_logprobs, g.sampling.logprobs) == (True, 0, True)
    for value in (-1, 6, True):
        assert refused(completion, logprobs=value).param == "logprobs"


# ---- sampling ranges ---------------------------------------------------------------------------

@pytest.mark.parametrize("field, lo, hi", [
    ("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0), ("min_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0),
    ("repeat_penalty", 0.01, 10.0),
])
def test_each_sampling_number_at_both_bounds(field, lo, hi):
    assert getattr(chat(**{field: lo}).sampling, field) == pytest.approx(lo)
    assert getattr(chat(**{field: hi}).sampling, field) == pytest.approx(hi)
    for value in (lo - 0.001, hi + 0.001):
        error = refused(**{field: value})
        assert error.param == field and f"'{field}'" in error.message


@pytest.mark.parametrize("value", [float("nan"), float("inf"), True, "1"])
def test_a_sampling_number_refuses_nan_infinity_and_other_types(value):
    assert refused(temperature=value).param == "temperature"


def test_top_k_runs_from_0_to_the_vocabulary_size():
    assert chat(top_k=0).sampling.top_k == 0
    assert chat(top_k=VOCAB).sampling.top_k == VOCAB
    assert refused(top_k=VOCAB + 1).param == "top_k"
    assert refused(top_k=-1).param == "top_k"


def test_ignore_eos_is_a_boolean():
    assert chat(ignore_eos=True).sampling.ignore_eos is True
    assert refused(ignore_eos="yes").param == "ignore_eos"


def test_user_is_an_optional_string_of_at_most_512():
    chat(user="")
    chat(user="u" * 512)
    chat(user=None)
    assert refused(user="u" * 513).param == "user"
    assert refused(user=5).param == "user"


# ---- seeds -------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, seed32", [(7, 7), (0, 0), ((1 << 32) + 5, 5), (-1, 0xFFFFFFFE),
                                          (0xFFFFFFFE, 0xFFFFFFFE), (-(2 ** 63), 0),
                                          (2 ** 63 - 1, 0xFFFFFFFE)])
def test_a_seed_becomes_32_bits_never_llama_cpps_random(seed, seed32):
    g = chat(seed=seed)
    assert g.seed == seed and g.sampling.seed == seed32


def test_seeds_outside_64_bits_are_refused():
    for seed in (2 ** 63, -(2 ** 63) - 1):
        assert refused(seed=seed).param == "seed"


def test_each_choice_of_a_seeded_request_gets_the_next_seed_and_the_same_sampling():
    g = chat(seed=10, n=3, temperature=0.3, top_p=0.5, top_k=7, min_p=0.2, presence_penalty=1.0,
             frequency_penalty=-1.0, repeat_penalty=1.5, logit_bias={"3": 2}, min_tokens=4,
             ignore_eos=True, logprobs=True, top_logprobs=2,
             response_format={"type": "json_object"})
    assert g.sampling_for_choice(0) is g.sampling
    for index in (1, 2):
        p = g.sampling_for_choice(index)
        assert p is not g.sampling and p.seed == 10 + index
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                     "frequency_penalty", "repeat_penalty", "penalty_last_n", "logit_bias",
                     "grammar", "logprobs", "n_top_logprobs", "min_tokens", "ignore_eos"):
            assert getattr(p, name) == getattr(g.sampling, name), name
    assert g.sampling.seed == 10                    # the first choice's own seed is untouched


def test_a_choice_seed_wraps_to_32_bits_like_the_request_seed():
    g = chat(seed=0xFFFFFFFE, n=2)
    assert g.sampling_for_choice(1).seed == 0xFFFFFFFE   # 0xFFFFFFFF would mean "random"
    assert chat(seed=0xFFFFFFFF, n=2).sampling_for_choice(1).seed == 0


def test_an_unseeded_request_shares_one_sampling_across_choices():
    g = chat(n=3)
    assert g.sampling_for_choice(2) is g.sampling


# ---- stop and logit_bias -----------------------------------------------------------------------

def test_stop_null_string_or_list():
    assert chat(stop=None).stop == []
    assert chat(stop="x").stop == ["x"]
    assert chat(stop=["a", "b"]).stop == ["a", "b"]
    error = refused(stop=("a",))
    assert error.param == "stop" and "at most 4 strings" in error.message
    error = refused(stop=["a", 1])
    assert error.param == "stop"
    assert error.message == "'stop' entries must be non-empty strings of at most 256 characters"


@pytest.mark.parametrize("stop", [{"a": 1}, 5, [1], [""], ["a"] * 5, ["x" * 257], [None], "x" * 257])
def test_bad_stop(stop):
    assert refused(stop=stop).param == "stop"


def test_stop_at_its_limits():
    assert chat(stop=["x" * 256] * 4).stop == ["x" * 256] * 4
    assert chat(stop="x" * 256).stop == ["x" * 256]


def test_logit_bias_keys_are_token_ids_inside_the_vocabulary():
    assert chat(logit_bias={"0": 1, str(VOCAB - 1): -1}).sampling.logit_bias == [
        (0, 1.0), (VOCAB - 1, -1.0)]
    for key in ("-1", str(VOCAB)):
        error = refused(logit_bias={key: 1})
        assert error.param == "logit_bias" and f"0..{VOCAB - 1}" in error.message
    error = refused(logit_bias={"a": 1})
    assert error.param == "logit_bias" and "token ids" in error.message and "'a'" in error.message


def test_logit_bias_values_are_numbers_from_minus_100_to_100():
    bias = chat(logit_bias={"1": 100, "2": -100, "3": 0.5}).sampling.logit_bias
    assert bias == [(1, 100.0), (2, -100.0), (3, 0.5)]
    assert all(isinstance(value, float) for _, value in bias)
    for value in (True, "1", None, 100.01, -100.01):
        error = refused(logit_bias={"1": value})
        assert error.param == "logit_bias"
        assert error.message == "'logit_bias' values must be numbers from -100 to 100"
    error = refused(logit_bias={str(i): 0 for i in range(1025)})
    assert error.param == "logit_bias" and "at most 1024 entries" in error.message
    assert refused(logit_bias=[1]).param == "logit_bias"
    assert len(chat(logit_bias={str(i): 0 for i in range(1000)}).sampling.logit_bias) == 1000


def test_logit_bias_holds_1024_entries_at_most():
    # a vocabulary larger than the bound, so that the count, not the ids, is what refuses
    big = {str(i): 1 for i in range(1025)}
    wide = params.parse({"messages": [], "logit_bias": dict(list(big.items())[:1024])},
                        n_vocab=49152, chat=True)
    assert len(wide.sampling.logit_bias) == 1024
    with raises_http() as caught:
        params.parse({"messages": [], "logit_bias": big}, n_vocab=49152, chat=True)
    assert caught.value.param == "logit_bias" and "at most 1024 entries" in caught.value.message


# ---- response_format ---------------------------------------------------------------------------

@pytest.mark.parametrize("response_format", [None, {}, {"type": None}, {"type": "text"}])
def test_plain_text_response_formats_have_no_grammar(response_format):
    g = chat(response_format=response_format)
    assert g.grammar == "" and g.sampling.grammar == ""


def test_json_object_uses_the_json_grammar():
    g = chat(response_format={"type": "json_object"})
    assert g.grammar == JSON_GBNF and g.sampling.grammar == JSON_GBNF


def test_a_json_schema_becomes_its_grammar():
    g = chat(response_format={"type": "json_schema",
                              "json_schema": {"schema": {"type": "boolean"}}})
    assert "true" in g.grammar and "false" in g.grammar and g.sampling.grammar == g.grammar


@pytest.mark.parametrize("response_format, needle", [
    ({"type": "xml"}, "'text', 'json_object' or 'json_schema'"),
    ({"type": "json_schema"}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": "x"}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {}}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be a JSON Schema object"),
    ("json", "must be an object, not string"),
])
def test_bad_response_formats_are_refused_naming_the_parameter(response_format, needle):
    error = refused(response_format=response_format)
    assert error.param == "response_format" and needle in error.message
    assert error.message.startswith("'response_format") and error.message.endswith(needle)


# ---- best_of and suffix (completions) ------------------------------------------------------

def test_best_of_at_n_and_above_sets_the_candidates():
    assert completion().candidates == 1 and completion(n=3).candidates == 3
    assert completion(n=3, best_of=3).candidates == 3
    g = completion(n=2, best_of=16)                  # MAX_N, its bound
    assert g.candidates == 16 and g.n == 2
    assert g.sampling.logprobs and not g.logprobs    # ranked by logprobs the client did not ask for


def test_best_of_below_n_over_its_bound_or_streamed_is_refused():
    assert refused(completion, n=3, best_of=2).param == "best_of"
    assert refused(completion, best_of=17).param == "best_of"
    assert refused(completion, best_of=0).param == "best_of"
    assert refused(completion, best_of=2, stream=True).param == "best_of"
    assert completion(n=2, best_of=2, stream=True).candidates == 2   # equal to n streams


def test_best_of_is_not_a_chat_field():
    assert chat(best_of=4).candidates == 1


def test_a_suffix_is_text_or_null():
    # a non-empty suffix is fill-in-the-middle (tests/blackbox/test_infill.py): a model without
    # FIM tokens refuses it there, naming the field
    assert completion(suffix="").n == 1 and completion(suffix=None).n == 1
    assert completion(suffix=" world").n == 1
    assert refused(completion, suffix=3).param == "suffix"


# ---- the grammar budget of a JSON schema -------------------------------------------------------

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
    chat(response_format=json_schema({"type": "string", "maxLength": 1000}))
    assert "grammar_max_repeat" in refused(
        response_format=json_schema({"type": "string", "maxLength": 1001})).message
    chat(response_format=json_schema({"enum": list(range(256))}))
    nested = {"type": "string"}
    for _ in range(31):                              # 32 levels: schema_max_depth itself
        nested = {"type": "array", "items": nested}
    chat(response_format=json_schema(nested))
    nested = {"type": "array", "items": nested}      # 33
    assert "schema_max_depth" in refused(response_format=json_schema(nested)).message


def test_the_grammar_size_after_conversion_is_bounded():
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 900}
                                             for i in range(20)}}
    assert "grammar_max_bytes" in refused(response_format=json_schema(wide)).message
