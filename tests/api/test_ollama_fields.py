"""Ollama's names and generation fields, read into the store's ids and the typed request: each
option applied, accepted or refused with a 400 naming it; keep_alive and format as Ollama's
clients write them (no daemon: the pure parts of server/api/ollama)."""
import pytest

from stackd.api.ollama import names, options
from stackd.http.errors import ApiError
from stackd.system.durations import NEVER


class Store:
    def __init__(self, *ids):
        self.ids = set(ids)

    def get(self, model_id):
        return object() if model_id in self.ids else None


@pytest.mark.parametrize("written, stored", [
    ("smollm2-135m-instruct", "smollm2-135m-instruct"), ("smollm2-135m-instruct:latest", "smollm2-135m-instruct"),
    ("library/smollm2-135m-instruct", "smollm2-135m-instruct"), ("qwen2.5:0.5b", "qwen2.5:0.5b"),
    ("library/qwen2.5:0.5b", "qwen2.5:0.5b"), ("tiny", "tiny:latest"), ("Tiny:Latest", "tiny:latest")])
def test_names_as_ollama_writes_them_find_the_stored_model(written, stored):
    store = Store("smollm2-135m-instruct", "qwen2.5:0.5b", "tiny:latest")
    assert names.store_id(store, written) == stored


def test_the_configured_registrys_host_is_left_out_and_another_is_kept():
    store = Store("qwen2.5:0.5b", "hf.co/user/repo:q4")
    assert names.store_id(store, "registry.example:5000/library/qwen2.5:0.5b",
                          registry_host="registry.example:5000") == "qwen2.5:0.5b"
    assert names.store_id(store, "hf.co/user/repo:q4", registry_host="registry.example:5000") == "hf.co/user/repo:q4"
    with pytest.raises(Exception):             # another registry's model is not this one's
        names.store_id(store, "other.example/library/qwen2.5:0.5b", registry_host="registry.example:5000")


@pytest.mark.parametrize("written", ["missing", "", "../../etc/passwd", "a" * 300, None, 3])
def test_a_name_that_is_not_stored_is_a_4xx(written):
    with pytest.raises(Exception) as refused:
        names.store_id(Store("tiny:latest"), written)
    assert getattr(refused.value, "code", None) is not None or isinstance(refused.value, ApiError)


def test_listed_names_are_the_store_ids():
    assert names.shown("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert names.shown("ns/model:q4") == "ns/model:q4"
    assert names.new_id("library/mine:latest", "model") == "mine"


def test_options_applied_into_the_typed_request():
    read = options.read_options({"options": {"temperature": 0, "top_k": 5, "top_p": 0.5, "min_p": 0.1,
                                             "seed": 7, "num_predict": 12, "stop": ["\n"], "repeat_penalty": 1.1,
                                             "presence_penalty": 0.5, "frequency_penalty": 0.25, "num_keep": 4,
                                             "num_thread": 8, "mirostat": 0}})
    gen = options.generation(read, "", False)
    s = gen.sampling
    assert (s.temperature, s.top_k, s.top_p, s.repeat_penalty) == (0.0, 5, 0.5, pytest.approx(1.1))
    assert gen.max_tokens == 12 and gen.stop == ["\n"] and gen.seed == 7 and not gen.stream
    assert options.generation(options.read_options({"options": {"num_predict": -1}}), "", True).max_tokens is None
    assert options.generation(options.read_options({"options": {"stop": "\n\n"}}), "", True).stop == ["\n\n"]


@pytest.mark.parametrize("option, value", [("mirostat", 2), ("tfs_z", 0.5), ("typical_p", 0.9), ("frobnicate", 1),
                                           ("num_predict", 0), ("num_ctx", 0), ("temperature", "hot"),
                                           ("stop", 3), ("stop", [""]), ("seed", 2 ** 70), ("top_k", True)])
def test_options_refused_name_the_option(option, value):
    with pytest.raises(ApiError) as refused:
        options.read_options({"options": {option: value}})
    assert refused.value.kind.status == 400 and f"options.{option}" in refused.value.message


@pytest.mark.parametrize("value, seconds", [("5m", 300.0), (0, 0.0), ("1h30m", 5400.0), (-1, NEVER), ("-1m", NEVER),
                                            (90, 90.0), (None, None)])
def test_keep_alive_as_ollama_parses_it(value, seconds):
    assert options.keep_alive_of({"keep_alive": value}) == seconds


@pytest.mark.parametrize("value", ["forever", True, [], "99999999h", 1e300])
def test_keep_alive_out_of_range_is_a_400(value):
    with pytest.raises(ApiError) as refused:
        options.keep_alive_of({"keep_alive": value})
    assert "keep_alive" in refused.value.message


def test_format_and_think():
    assert options.grammar_of({}) == "" and options.grammar_of({"format": ""}) == ""
    assert options.grammar_of({"format": "json"})
    assert options.grammar_of({"format": {"type": "object", "properties": {"a": {"type": "string"}}}})
    for bad in ("yaml", 3, ["json"]):
        with pytest.raises(ApiError):
            options.grammar_of({"format": bad})
    assert options.effort_of({"think": False}) == "none" and options.effort_of({"think": True}) is None
    assert options.effort_of({"think": "high"}) == "high"
    with pytest.raises(ApiError):
        options.effort_of({"think": "max"})
