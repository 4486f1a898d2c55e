"""The raw requests the clients that speak only Ollama's API send, recorded from their sources,
against the daemon's Ollama port:
- Home Assistant's Ollama integration (homeassistant/components/ollama/entity.py,
  _async_handle_chat_log; the defaults of homeassistant/components/ollama/const.py): /api/chat streamed with tools, keep_alive -1,
  options {num_ctx: 8192}, think false; a tool result as a `tool` turn of JSON content.
- Continue's Ollama provider (core/llm/llms/Ollama.ts): POST /api/show {"name"} whose
  `parameters` lines it parses; /api/generate and /api/chat with its model-file options
  (num_predict, stop, num_ctx, num_thread, ...) and keep_alive 1800; tools only unstreamed.
- VS Code Copilot Chat's Ollama provider (src/extension/byok/vscode-node/ollamaProvider.ts):
  /api/version (at least 0.6.4), /api/tags, /api/show {"model"} for model_info's
  general.basename and <arch>.context_length and `capabilities`, then chat through the OpenAI
  API on the same port (/v1/chat/completions)."""
import re

import orjson
import pytest

from testing.daemon import Daemon
from tests.clients.tools import ADD

from .conftest import CHAT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    config = ("[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 2048\n")
    daemon = Daemon(str(tmp_path_factory.mktemp("ollama-shapes") / "data"), config, models=True, ollama=True)
    yield daemon
    daemon.stop()


def post(daemon, path, body):
    return daemon.request("POST", path, port="ollama", key=daemon.admin_key, body=body)


def lines(raw: bytes) -> list[dict]:
    return [orjson.loads(line) for line in raw.splitlines() if line.strip()]


def test_home_assistants_conversation_turns(daemon):
    messages = [{"role": "system", "content": "You are a voice assistant for Home Assistant."},
                {"role": "user", "content": "Add 2 and 3."}]
    body = {"model": CHAT, "messages": messages, "tools": [ADD], "stream": True, "keep_alive": -1,
            "options": {"num_ctx": 8192}, "think": False}
    status, headers, raw = post(daemon, "/api/chat", body)
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    parts = lines(raw)
    assert parts[-1]["done"] is True and parts[-1]["done_reason"] in ("stop", "length")
    assert all(p["message"]["role"] == "assistant" for p in parts)
    calls = [c for p in parts for c in p["message"].get("tool_calls") or []]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls or [
        {"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
    result = {"role": "tool", "content": orjson.dumps({"data": {"result": 5}, "error": None}).decode()}
    status, _, raw = post(daemon, "/api/chat", {**body, "messages": [*messages, assistant, result],
                                                 "options": {"num_ctx": 8192, "num_predict": 32}})
    assert status == 200 and lines(raw)[-1]["done"] is True


def test_continues_show_generate_and_chat(daemon):
    status, _, shown = post(daemon, "/api/show", {"name": CHAT})
    assert status == 200
    for line in shown["parameters"].split("\n"):          # Continue's own parse: a line it cannot read throws
        assert re.match(r'^(\S+)\s+((?:".*")|\S+)$', line), line
    options = {"temperature": 0.01, "top_p": 0.95, "top_k": 40, "num_predict": 16, "stop": ["\n\n", "```"],
               "num_ctx": 2048, "num_thread": 2, "min_p": 0.05}
    status, _, raw = post(daemon, "/api/generate", {"model": CHAT, "prompt": "def add(a, b):", "options": options,
                                                    "keep_alive": 1800, "stream": True})
    assert status == 200 and lines(raw)[-1]["done"] is True
    status, _, answer = post(daemon, "/api/chat", {"model": CHAT, "options": options, "keep_alive": 1800,
                                                   "stream": False, "tools": [ADD],
                                                   "messages": [{"role": "user", "content": "Add 2 and 3."}]})
    assert status == 200 and answer["done"] is True
    for call in answer["message"].get("tool_calls") or []:  # Continue JSON.stringify()s the object
        assert isinstance(call["function"]["arguments"], dict)


def test_copilots_model_discovery_then_openai_chat_on_the_same_port(daemon):
    status, _, version = daemon.request("GET", "/api/version", port="ollama")
    assert status == 200 and tuple(map(int, version["version"].split("."))) >= (0, 6, 4)
    status, _, tags = daemon.request("GET", "/api/tags", port="ollama", key=daemon.admin_key)
    models = [m["model"] for m in tags["models"]]
    assert CHAT in models                     # the name it will send to /v1/chat/completions
    for model in models:
        status, _, info = post(daemon, "/api/show", {"model": model})
        assert status == 200 and info["model_info"]["general.basename"]
        arch = info["model_info"]["general.architecture"]
        assert info["model_info"][f"{arch}.context_length"] > 0 and isinstance(info["capabilities"], list)
    status, _, answer = post(daemon, "/v1/chat/completions", {
        "model": CHAT, "max_tokens": 8,
        "messages": [{"role": "user", "content": "Say hello."}]})
    assert status == 200 and answer["choices"][0]["message"]["content"]
