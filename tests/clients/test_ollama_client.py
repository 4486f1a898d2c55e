"""Ollama's API through the official `ollama` Python client (the version Home Assistant's
integration pins), unchanged, against the real daemon's Ollama port and its default models:
list, show, ps, chat streamed and whole, tools and the tool-result turn, format from a pydantic
model, generate with system and with suffix, embed, pull from a real registry, copy, create,
delete, and errors as the client's own ResponseError. The same keys as port 8080."""
import hashlib
import json
import time

import ollama
import pydantic
import pytest

from stackd.store.store import ModelStore
from testing.daemon import Daemon, create_key
from testing.registry_server import MEDIA_MODEL, RegistryServer
from tests.blackbox.test_infill import FIM_MODEL, with_fim_tokens
from tests.clients.tools import ADD, arguments_of
from tests.store.tiny import write_tiny

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
HELLO = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0, "num_predict": 24}


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = RegistryServer(str(tmp_path_factory.mktemp("registry"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, registry):
    config = (f"[models]\nregistry = \"{registry.url}\"\n[rate_limits]\ninference = 0\ncluster = 0\n"
              "[engine]\nslots = 4\ncontext_length = 2048\n")
    data_dir = tmp_path_factory.mktemp("ollama") / "data"
    data_dir.mkdir(mode=0o700)
    fim_file = with_fim_tokens(str(tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"))
    ModelStore(str(data_dir)).import_file(FIM_MODEL, fim_file, source="local")
    daemon = Daemon(str(data_dir), config, models=True, ollama=True)
    yield daemon
    daemon.stop()


def client_of(daemon, key) -> ollama.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return ollama.Client(host=f"http://127.0.0.1:{daemon.ollama_port}", headers=headers, timeout=600)


@pytest.fixture(scope="module")
def client(daemon):
    return client_of(daemon, daemon.admin_key)


def test_the_port_says_it_is_running_and_a_version_copilot_accepts(daemon):
    status, _, body = daemon.request("GET", "/", port="ollama")
    assert status == 200 and body == b"Ollama is running"
    status, _, body = daemon.request("GET", "/api/version", port="ollama")
    major, minor, patch = (int(part) for part in body["version"].split("."))
    assert status == 200 and (major, minor, patch) >= (0, 6, 4)


def test_list_show_ps(client):
    names = [m.model for m in client.list().models]
    assert CHAT in names and EMBED in names
    shown = client.show(CHAT)
    assert shown.details.format == "gguf" and shown.details.family == "llama"
    assert "completion" in shown.capabilities and "embedding" not in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama" and shown.template
    assert client.show(EMBED).capabilities == ["embedding"]
    loaded = {m.model: m for m in client.ps().models}
    assert CHAT in loaded and loaded[CHAT].size > 0
    assert loaded[CHAT].expires_at is not None


def test_chat_whole_and_streamed(client):
    whole = client.chat(model=CHAT, messages=HELLO, options=GREEDY, stream=False)
    assert whole.done and whole.message.role == "assistant" and whole.message.content
    assert whole.done_reason in ("stop", "length")
    assert whole.eval_count > 0 and whole.prompt_eval_count > 0
    assert whole.total_duration >= whole.eval_duration > 0 and whole.prompt_eval_duration > 0
    parts = list(client.chat(model=CHAT, messages=HELLO, options=GREEDY, stream=True))
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content   # greedy: the same text
    assert parts[-1].eval_count == whole.eval_count


def test_names_as_ollama_writes_them(client):
    for name in (CHAT, CHAT + ":latest", "library/" + CHAT):
        assert client.chat(model=name, messages=HELLO, options={"num_predict": 2}, stream=False).done


def test_tools_and_the_tool_result_turn(client):
    question = [{"role": "user", "content": "What is 2 plus 3? Use the add tool."}]
    reply = client.chat(model=CHAT, messages=question, tools=[ADD], options={"temperature": 0}, stream=False)
    calls = reply.message.tool_calls or []
    for call in calls:                      # arguments as objects, matching the tool's schema
        assert call.function.name == "add" and isinstance(call.function.arguments, dict)
        arguments_of("add", call.function.arguments)
    turn = reply.message if calls else {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
    answer = client.chat(model=CHAT, messages=[*question, turn, {"role": "tool", "content": "5", "tool_name": "add"}],
                         tools=[ADD], options={"temperature": 0, "num_predict": 48}, stream=False)
    assert answer.done and (answer.message.content or answer.message.tool_calls)


def test_streamed_tool_calls_arrive_whole(client):
    question = [{"role": "user", "content": "Add 2 and 3 with the add tool."}]
    parts = list(client.chat(model=CHAT, messages=question, tools=[ADD], options={"temperature": 0}, stream=True))
    for part in parts:
        for call in part.message.tool_calls or []:
            arguments_of(call.function.name, call.function.arguments)
    assert parts[-1].done


class City(pydantic.BaseModel):
    name: str
    country: str


def test_format_from_a_pydantic_model(client):
    reply = client.chat(model=CHAT, messages=[{"role": "user", "content": "Name a city in France."}],
                        format=City.model_json_schema(), options={"temperature": 0, "num_predict": 64},
                        stream=False)
    City.model_validate_json(reply.message.content)
    json_reply = client.generate(model=CHAT, prompt="A JSON object with a key 'a'.", format="json",
                                 options={"temperature": 0, "num_predict": 32}, stream=False)
    assert json_reply.response.lstrip().startswith("{")          # the grammar's: JSON from the start
    if json_reply.done_reason == "stop":                          # (a small model may nest past 32 tokens)
        json.loads(json_reply.response)


def test_generate_with_system_and_with_suffix(client):
    reply = client.generate(model=CHAT, system="Answer in one word.", prompt="What colour is the sky?",
                            options=GREEDY, stream=False)
    assert reply.done and reply.response and reply.eval_count > 0
    streamed = list(client.generate(model=CHAT, system="Answer in one word.", prompt="What colour is the sky?",
                                    options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == reply.response
    filled = client.generate(model=FIM_MODEL, prompt="def add(a, b):\n    return ", suffix="\n",
                             options={"temperature": 0, "num_predict": 8}, stream=False)
    assert filled.done and filled.eval_count > 0
    assert "insert" in client.show(FIM_MODEL).capabilities and "insert" not in client.show(CHAT).capabilities
    with pytest.raises(ollama.ResponseError) as no_fim:         # SmolLM2 itself has no FIM tokens
        client.generate(model=CHAT, prompt="def add(a, b):\n    return ", suffix="\n", stream=False)
    assert no_fim.value.status_code == 400 and "suffix" in no_fim.value.error
    raw = client.generate(model=CHAT, prompt="Once upon a time", raw=True, options={"num_predict": 4}, stream=False)
    assert raw.done and raw.eval_count > 0


def test_an_empty_prompt_loads_and_keep_alive_zero_unloads(client):
    loaded = client.generate(model=CHAT, prompt="")
    assert loaded.done and loaded.done_reason == "load"
    unloaded = client.generate(model=CHAT, prompt="", keep_alive=0)
    assert unloaded.done_reason == "unload"
    assert CHAT not in [m.model for m in client.ps().models]
    assert client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2}, stream=False).done   # on demand


def test_embed(client):
    one = client.embed(model=EMBED, input="hello world")
    [vector] = one.embeddings
    assert len(vector) == 384 and abs(sum(x * x for x in vector) - 1.0) < 1e-3    # normalized
    two = client.embed(model=EMBED, input=["hello world", "goodbye"])
    assert len(two.embeddings) == 2 and two.embeddings[0] == pytest.approx(vector, abs=1e-3)
    legacy = client.embeddings(model=EMBED, prompt="hello world")
    assert len(legacy.embedding) == 384


def test_pull_copy_create_delete(client, registry, tmp_path, daemon):
    data = open(write_tiny(tmp_path / "tiny.gguf"), "rb").read()
    registry.push_model("library/tiny", "latest", [(MEDIA_MODEL, data)])
    progress = list(client.pull("tiny", stream=True))
    assert progress[-1].status == "success" and any(p.digest for p in progress)
    assert "tiny:latest" in [m.model for m in client.list().models]      # pulled: Ollama's own name
    host = registry.url.split("://", 1)[1].rstrip("/")
    for name in ("tiny", "tiny:latest", "library/tiny", f"{host}/library/tiny:latest"):   # Ollama's spellings
        assert client.show(name).details.format == "gguf"
    assert client.copy("tiny", "tiny-copy").status == "success"
    assert client.show("tiny-copy").details.family == "llama"
    assert client.create(model="tiny-again", from_="tiny").status == "success"
    other = open(write_tiny(tmp_path / "other.gguf", rows=32), "rb").read()
    path = tmp_path / "other.gguf"
    digest = client.create_blob(path)
    assert digest == "sha256:" + hashlib.sha256(other).hexdigest()
    assert client.create(model="from-blob", files={"other.gguf": digest}).status == "success"
    assert client.show("from-blob").details.format == "gguf"
    for name in ("tiny-copy", "tiny-again", "from-blob", "tiny"):
        assert client.delete(name).status == "success"
    names = [m.model for m in client.list().models]
    assert not {"tiny:latest", "tiny-copy", "tiny-again", "from-blob"} & set(names)


def test_errors_are_the_clients_response_error(client, daemon):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="no-such-model", messages=HELLO, stream=False)
    assert missing.value.status_code == 404 and "not found" in missing.value.error
    with pytest.raises(ollama.ResponseError) as streamed:
        list(client.chat(model="no-such-model", messages=HELLO, stream=True))
    assert streamed.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as option:
        client.chat(model=CHAT, messages=HELLO, options={"mirostat": 2}, stream=False)
    assert option.value.status_code == 400 and "options.mirostat" in option.value.error
    with pytest.raises(ollama.ResponseError) as images:
        client.chat(model=CHAT, messages=[{"role": "user", "content": "?", "images": ["aGk="]}], stream=False)
    assert images.value.status_code == 400 and "images" in images.value.error
    with pytest.raises(ollama.ResponseError) as kind:
        client.embed(model=CHAT, input="hello")
    assert kind.value.status_code == 400


def test_the_same_keys_as_port_8080(daemon):
    with pytest.raises(ollama.ResponseError) as anonymous:
        client_of(daemon, None).list()
    assert anonymous.value.status_code == 401 and isinstance(anonymous.value.error, str)
    inference = create_key(daemon.data_dir, "ollama-inference", "inference")
    reader = client_of(daemon, inference)
    deadline = time.monotonic() + 60          # the daemon picks new keys up on its sweep
    while True:
        try:
            assert reader.chat(model=CHAT, messages=HELLO, options={"num_predict": 2}, stream=False).done
            break
        except ollama.ResponseError as exc:
            if exc.status_code != 401 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with pytest.raises(ollama.ResponseError) as refused:
        reader.delete(CHAT)
    assert refused.value.status_code == 403


def test_num_ctx_loads_the_model_with_that_context_and_keep_alive_sets_its_expiry(client):
    def loaded():
        return {m.model: m for m in client.ps().models}[CHAT]

    client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2}, stream=False)
    before = loaded().context_length
    larger = before * 2
    assert client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2, "num_ctx": larger}, stream=False).done
    assert loaded().context_length == larger                  # loaded again with it, as Ollama does
    client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2, "num_ctx": before}, stream=False)
    assert loaded().context_length == larger                  # less: served as it is
    assert loaded().expires_at.year >= 2300                   # this daemon keeps models for ever...
    client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2}, keep_alive="10m", stream=False)
    assert loaded().expires_at.year < 2300                    # ...until a request's keep_alive says
    client.chat(model=CHAT, messages=HELLO, options={"num_predict": 2}, keep_alive=-1, stream=False)
    assert loaded().expires_at.year >= 2300
