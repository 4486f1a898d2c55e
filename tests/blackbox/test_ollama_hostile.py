"""Hostile requests on the Ollama port of the real daemon with the real models: every field of
each route replaced by values of the wrong type, out of range, huge or strange; malformed,
oversized and NDJSON bodies; unknown options; enormous num_ctx and num_predict; keep_alive out
of range. Every answer is a 2xx or a 4xx in Ollama's shape (a JSON object whose `error` is a
string), never a 5xx or a hang, and the daemon answers a plain request afterwards."""
from __future__ import annotations

import json

import orjson
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
VALUES = [None, True, -1, 0, 3.5, 1e308, 2 ** 70, "", "\u202e\u0000\ufeff", "𝕏" * 2000, [], [1, "a"],
          {}, {"a": {"b": []}}]
OPTIONS = {"temperature": 0, "num_predict": 2}
BODIES = {
    "/api/chat": {"model": CHAT, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                  "options": OPTIONS},
    "/api/generate": {"model": CHAT, "prompt": "hi", "stream": False, "options": OPTIONS},
    "/api/embed": {"model": EMBED, "input": "hi"},
    "/api/embeddings": {"model": EMBED, "prompt": "hi"},
    "/api/show": {"model": CHAT},
    "/api/pull": {"model": "tiny", "stream": False},          # no registry configured: a 400 at best
    "/api/copy": {"source": CHAT, "destination": "hostile-copy"},
    "/api/create": {"model": "hostile-made", "from": CHAT, "stream": False},
}
FIELDS = {
    "/api/chat": ["model", "messages", "tools", "format", "options", "stream", "keep_alive", "think"],
    "/api/generate": ["model", "prompt", "suffix", "system", "raw", "format", "options", "stream",
                      "keep_alive", "images", "context", "template", "think"],
    "/api/embed": ["model", "input", "truncate", "dimensions", "options", "keep_alive"],
    "/api/embeddings": ["model", "prompt", "options", "keep_alive"],
    "/api/show": ["model"],
    "/api/pull": ["model", "stream", "insecure"],
    "/api/copy": ["source", "destination"],
    "/api/create": ["model", "from", "files", "quantize", "template", "system", "parameters", "messages",
                    "adapters", "stream"],
}
OPTION_NAMES = ["temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "num_ctx", "stop",
                "repeat_penalty", "presence_penalty", "frequency_penalty", "num_keep", "repeat_last_n",
                "mirostat", "num_thread"]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("ollama-hostile") / "data"),
                    "[rate_limits]\ninference = 0\ncluster = 0\n[engine]\nslots = 4\nmax_queue = 8\n"
                    "context_length = 512\n", models=True, ollama=True)
    yield daemon
    daemon.stop()


def ask(node, path, body, method="POST", headers=None):
    if isinstance(body, dict):             # json: orjson refuses integers past 64 bits
        body = json.dumps(body).encode()
    return node.request(method, path, port="ollama", key=node.admin_key, body=body, headers=headers)


def assert_answered(status, body, what):
    """2xx, or a 4xx whose body is Ollama's error shape (NDJSON: each line a JSON object)."""
    assert status < 500, (what, status, body)
    if status >= 400:
        assert isinstance(body, dict) and isinstance(body.get("error"), (str, dict)), (what, body)
        if status != 413:                      # the HTTP layer's own refusal keeps the spec's shape
            assert isinstance(body["error"], str), (what, body)
    elif isinstance(body, bytes) and body:
        for line in body.splitlines():
            assert isinstance(orjson.loads(line), dict), (what, line)


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_field_with_hostile_values(node, path):
    for field in FIELDS[path]:
        for value in VALUES:
            status, _, body = ask(node, path, {**BODIES[path], field: value})
            assert_answered(status, body, (path, field, value))


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
def test_every_option_with_hostile_values(node, path):
    for name in OPTION_NAMES:
        for value in VALUES:
            status, _, body = ask(node, path, {**BODIES[path], "options": {**OPTIONS, name: value}})
            assert_answered(status, body, (path, name, value))


def test_unknown_options_are_a_400_naming_them(node):
    for name in ("frobnicate", "mirostat_eta_x", ""):
        status, _, body = ask(node, "/api/chat", {**BODIES["/api/chat"], "options": {name: 1}})
        assert status == 400 and f"options.{name}" in body["error"], body


def test_enormous_num_ctx_and_num_predict(node):
    for options, words in (({"num_ctx": 10 ** 7}, "num_ctx"), ({"num_ctx": 2 ** 40}, "num_ctx"),
                           ({"num_predict": 2 ** 40}, "num_predict"), ({"num_predict": 0}, "num_predict"),
                           ({"num_predict": -3}, "num_predict")):
        for path in ("/api/chat", "/api/generate"):
            status, _, body = ask(node, path, {**BODIES[path], "options": options})
            assert status == 400 and words in body["error"], (options, body)


def test_keep_alive_out_of_range(node):
    for value in ("99999999h", "abc", "5 minutes", 1e300, True, [], "1e400"):
        status, _, body = ask(node, "/api/generate", {**BODIES["/api/generate"], "keep_alive": value})
        assert status == 400 and "keep_alive" in body["error"], (value, body)


def test_malformed_oversized_and_ndjson_bodies(node):
    cases = [b"", b"{", b"[]", b"null", b'"x"', b"{\"model\": 1e999999}", b"[" * 5000 + b"]" * 5000,
             b"{\"model\": \"%s\"}\n{\"model\": \"%s\"}\n" % (CHAT.encode(), CHAT.encode()),
             b"\xff\xfe{}", b"{\"model\": \"" + b"a" * 300 + b"\"}"]
    for path in ("/api/chat", "/api/generate", "/api/embed", "/api/show", "/api/pull", "/api/create",
                 "/api/copy"):
        for raw in cases:
            status, _, body = ask(node, path, raw)
            assert 400 <= status < 500, (path, raw[:40], status, body)
        # a body past http.max_body_bytes is refused from its Content-Length, before it is read
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {node.admin_key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {2 << 20}\r\n\r\n").encode()
        answer = node.raw(head + b"{\"model\": \"", port="ollama", wait=10)
        assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:80])
    status, _, body = ask(node, "/api/delete", b"{", method="DELETE")
    assert status == 400 and isinstance(body["error"], str)


def test_unknown_routes_and_methods_answer_in_ollamas_shape(node):
    for method, path in (("GET", "/api/nothing"), ("GET", "/api/chat"), ("POST", "/api/push")):
        status, _, body = ask(node, path, {"model": CHAT} if method == "POST" else None, method=method)
        assert status in (400, 404, 405) and isinstance(body["error"], str), (method, path, body)


def test_blob_digests_are_checked(node):
    for digest in ("sha256:" + "0" * 63, "sha256:../../etc/passwd", "md5:abc", "sha256:" + "A" * 64):
        status, _, body = ask(node, f"/api/blobs/{digest}", b"data")
        assert status in (400, 404), (digest, body)
    status, _, body = ask(node, "/api/blobs/sha256:" + "0" * 64, b"not these bytes")
    assert status == 400 and "sha256" in body["error"]


def test_delete_with_hostile_names_removes_nothing(node):
    for value in VALUES:
        status, _, body = ask(node, "/api/delete", {"model": value}, method="DELETE")
        assert_answered(status, body, ("delete", value))
        assert status != 200, value
    status, _, tags = node.request("GET", "/api/tags", port="ollama", key=node.admin_key)
    assert CHAT in [m["model"] for m in tags["models"]]


def test_the_daemon_still_answers(node):
    status, _, body = ask(node, "/api/chat", BODIES["/api/chat"])
    assert status == 200 and body["done"] is True
