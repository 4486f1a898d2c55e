"""Models on demand against the real daemon: a request loads its model; a load that does not fit
unloads the least recently used idle models that are not pinned; requests during a load wait
(or get 503 with Retry-After past models.load_wait); a request for an evicted model loads it
again; an idle model goes after its keep-alive; a load nothing can make room for is a 507 that
names what holds the memory.

The store holds three chat models (the default one and two copies with other chat templates,
so three files) and models.memory_limit_mb is set, from the planner's own estimate, to hold two
of them and not three."""
from __future__ import annotations

import http.client
import json
import math
import os
import threading
import time

import pytest

from stackd.engine.config import EngineConfig
from stackd.runtime.planner import MIB, Planner
from stackd.store.defaults import CHAT_MODEL, import_defaults
from stackd.store.store import ModelStore
from testing.gguf_patch import with_chat_template

pytestmark = pytest.mark.slow

A, B, C = CHAT_MODEL, "chat-b", "chat-c"
CONTEXT, SLOTS = 1024, 1
ENGINE = f"[engine]\nslots = {SLOTS}\ncontext_length = {CONTEXT}\n"
POLL_DEADLINE = 120.0       # seconds a poll may take on a loaded machine before the test fails


@pytest.fixture
def store_dir(tmp_path):
    """A data dir whose store holds A, B and C (and the default embedding model); -> (its path,
    the memory limit in MiB that holds two of the chat models and not three)."""
    data_dir = str(tmp_path / "data")
    store = ModelStore(data_dir)
    import_defaults(store)
    for name in (B, C):
        template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{# " + name + " #}"
        path = with_chat_template(template, str(tmp_path / f"{name}.gguf"))
        store.import_file(name, path, source="test")
    planner = Planner(EngineConfig(slots=SLOTS, context_length=CONTEXT), 0, 0, lambda node: 0)
    need = [sum(planner.estimate(store.get(m), CONTEXT).values()) for m in (A, B, C)]
    limit = math.ceil(max(need[0] + need[1], need[1] + need[2], need[0] + need[2]) / MIB)
    assert limit * MIB < sum(need)                # two fit, three do not
    return data_dir, limit


def start(start_daemon, store_dir, models: str = "", limit: int | None = None, preload: str = "[]"):
    data_dir, two = store_dir
    config = ("[rate_limits]\ninference = 0\ncluster = 0\n" + ENGINE +
              f"[models]\npreload = {preload}\nmemory_reserve_mb = 0\nmemory_limit_mb = {limit or two}\n" + models)
    return start_daemon(config, data_dir=data_dir, models=True)


def states(daemon) -> dict:
    _, _, body = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    return {m["id"]: m for m in body["data"]}


def loaded(daemon) -> set[str]:
    return {m for m, d in states(daemon).items() if d["state"] == "loaded"}


def complete(daemon, model: str, max_tokens: int = 1):
    return daemon.request("POST", "/v1/completions", port="inference", key=daemon.admin_key,
                          body={"model": model, "prompt": "Hello", "max_tokens": max_tokens})


def load(daemon, model: str, **body):
    return daemon.request("POST", "/v1/models/load", key=daemon.admin_key, body={"model": model, **body})


def metric(daemon, name: str, **labels) -> float:
    _, _, text = daemon.request("GET", "/metrics", key=daemon.admin_key)
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in text.decode().splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def poll(what, deadline: float = POLL_DEADLINE):
    """what() until it is truthy; the test fails when the deadline passes first."""
    end = time.monotonic() + deadline
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < end, "the state never came"
        time.sleep(0.2)


def test_a_request_loads_its_model_and_the_least_recently_used_idle_one_goes(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n")
    assert complete(daemon, A)[0] == 200
    assert complete(daemon, B)[0] == 200
    assert loaded(daemon) == {A, B}
    assert complete(daemon, A)[0] == 200          # A used last: B is the least recently used
    status, _, body = complete(daemon, C)
    assert status == 200, body
    assert loaded(daemon) == {A, C}
    assert states(daemon)[B]["state"] == "available"
    assert metric(daemon, "stackd_model_evictions_total", model=B, reason="memory") == 1
    assert metric(daemon, "stackd_model_loads_total", model=C) == 1
    assert metric(daemon, "stackd_model_load_seconds_total", model=C) > 0
    assert complete(daemon, B)[0] == 200          # and back: now A is the least recently used
    assert loaded(daemon) == {B, C}
    assert metric(daemon, "stackd_model_evictions_total", model=A, reason="memory") == 1


def test_a_pinned_model_is_never_evicted(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, f"keep_alive = -1\npinned = [\"{A}\"]\n")
    assert complete(daemon, A)[0] == 200
    assert complete(daemon, B)[0] == 200          # A is the least recently used, but pinned
    assert states(daemon)[A]["pinned"] is True and states(daemon)[B]["pinned"] is False
    assert complete(daemon, C)[0] == 200
    assert loaded(daemon) == {A, C}
    assert metric(daemon, "stackd_model_evictions_total", model=A, reason="memory") == 0


def open_stream(daemon, model: str) -> http.client.HTTPConnection:
    """A streaming completion on `model`, read up to its first token: in flight until closed."""
    conn = http.client.HTTPConnection("127.0.0.1", daemon.inference_port, timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": model, "prompt": "Tell me a long story.", "max_tokens": CONTEXT - 64,
        "ignore_eos": True, "stream": True}).encode(),
        {"Authorization": f"Bearer {daemon.admin_key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    while not response.fp.readline().startswith(b"data: {"):
        pass
    return conn


def test_a_load_waits_for_a_model_in_use_and_evicts_it_once_its_request_ends(start_daemon, store_dir):
    """B is pinned and A streams: C's load waits (C `loading`, A kept); once A's request ends,
    A is the one that goes."""
    daemon = start(start_daemon, store_dir, f"keep_alive = -1\npinned = [\"{B}\"]\n")
    assert load(daemon, B)[0] == 200
    stream = open_stream(daemon, A)
    answer = []
    loading = threading.Thread(target=lambda: answer.append(load(daemon, C)))
    try:
        assert states(daemon)[A]["in_use"] == 1
        loading.start()
        poll(lambda: states(daemon)[C]["state"] == "loading")
        assert loaded(daemon) == {A, B}
    finally:
        stream.close()                            # the client goes: A's request ends
    loading.join()
    status, _, body = answer[0]
    assert status == 200, body
    assert loaded(daemon) == {B, C}
    assert metric(daemon, "stackd_model_evictions_total", model=A, reason="memory") == 1


def test_past_load_wait_a_load_blocked_by_models_in_use_is_503_naming_them(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, f"keep_alive = -1\nload_wait = 0.0\npinned = [\"{B}\"]\n")
    assert load(daemon, B)[0] == 200
    assert load(daemon, A)[0] == 200
    stream = open_stream(daemon, A)
    try:
        status, headers, body = load(daemon, C)
        assert status == 503 and int(headers["retry-after"]) >= 1, body
        message = body["error"]["message"]
        assert f"'{A}'" in message and "in use by 1 request" in message and "models.load_wait" in message
        assert f"'{B}'" in message and "pinned" in message
        assert loaded(daemon) == {A, B} and states(daemon)[C]["state"] == "available"
    finally:
        stream.close()


def test_where_nothing_can_make_room_the_507_names_what_holds_memory(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, f"keep_alive = -1\npinned = [\"{A}\", \"{B}\"]\n")
    assert complete(daemon, A)[0] == 200 and complete(daemon, B)[0] == 200
    status, _, body = complete(daemon, C)
    assert status == 507, body
    message = body["error"]["message"]
    assert body["error"]["type"] == "insufficient_memory_error" and "nothing was changed" in message
    for model in (A, B):
        assert f"'{model}'" in message
    assert message.count("(pinned)") == 2 and "MiB" in message
    assert loaded(daemon) == {A, B} and states(daemon)[C]["state"] == "available"


def test_a_load_that_can_never_fit_is_507_with_nothing_loaded(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, limit=100)
    status, _, body = complete(daemon, A)
    assert status == 507
    assert "no other model is loaded" in body["error"]["message"]
    assert "models.memory_limit_mb" in body["error"]["message"]
    assert states(daemon)[A]["state"] == "available"


def test_a_model_too_large_even_without_the_others_evicts_nothing(start_daemon, store_dir):
    """A limit that holds A alone: B cannot fit even with A gone, so A stays and B is a 507."""
    data_dir, two = store_dir
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n", limit=two // 2 + 1)
    assert complete(daemon, A)[0] == 200
    status, _, body = load(daemon, B, options={"context_length": 8192})
    assert status == 507, body
    assert loaded(daemon) == {A}
    assert metric(daemon, "stackd_model_evictions_total", model=A, reason="memory") == 0


def test_requests_during_a_load_wait_for_it(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n")
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(complete(daemon, A)[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [200] * 4
    assert metric(daemon, "stackd_model_loads_total", model=A) == 1      # one load served them all


def test_past_load_wait_a_request_is_503_with_retry_after_and_the_load_goes_on(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, "keep_alive = -1\nload_wait = 0.0\n")
    status, headers, body = complete(daemon, A)
    assert status == 503, body
    assert int(headers["retry-after"]) >= 1
    assert "being loaded" in body["error"]["message"] and "models.load_wait" in body["error"]["message"]
    poll(lambda: states(daemon)[A]["state"] == "loaded")
    assert complete(daemon, A)[0] == 200


def test_requests_alternating_over_more_models_than_fit_are_all_answered(start_daemon, store_dir):
    """Four clients, each asking for A, B and C in turn: every model is evicted while others
    load and is loaded again while others go, and no request fails."""
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n")
    answers = []

    def client(first: int):
        for i in range(3):
            answers.append(complete(daemon, (A, B, C)[(first + i) % 3])[:3:2])
    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [status for status, _ in answers] == [200] * 12, [body for status, body in answers if status != 200]
    assert len(loaded(daemon)) <= 2


def test_an_idle_model_is_unloaded_after_its_keep_alive(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n")
    status, _, body = load(daemon, A, keep_alive="1s")
    assert status == 200 and body["keep_alive"] == 1.0
    poll(lambda: states(daemon)[A]["state"] == "available")
    assert metric(daemon, "stackd_model_evictions_total", model=A, reason="keep_alive") == 1
    status, _, body = load(daemon, B)             # the setting: never
    assert status == 200 and body["keep_alive"] == -1 and body["expires_at"] is None


def test_an_idle_model_shows_when_it_expires_and_a_request_stops_the_clock(start_daemon, store_dir):
    daemon = start(start_daemon, store_dir, "keep_alive = \"1h\"\n")
    before = time.time()
    status, _, body = load(daemon, A)
    assert status == 200 and body["keep_alive"] == 3600.0
    assert before + 3600 - 1 <= body["expires_at"] <= time.time() + 3600 + 1
    stream = open_stream(daemon, A)
    try:
        assert states(daemon)[A]["expires_at"] is None        # in use: the clock waits
    finally:
        stream.close()
    assert poll(lambda: states(daemon)[A]["expires_at"])     # idle again: it runs


@pytest.mark.parametrize("keep_alive", ["soon", "5x", True, [], "1" * 40])
def test_a_bad_keep_alive_is_a_400(start_daemon, store_dir, keep_alive):
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n")
    status, _, body = load(daemon, A, keep_alive=keep_alive)
    assert status == 400 and body["error"]["param"] == "keep_alive", body
    assert states(daemon)[A]["state"] == "available"


def test_a_model_given_as_a_file_is_pinned(start_daemon, store_dir, tmp_path):
    path = with_chat_template("{{ messages[0]['content'] }}{# file #}", str(tmp_path / "own-model.gguf"))
    daemon = start(start_daemon, store_dir, "keep_alive = -1\n", preload=f"[\"{path}\"]")
    pinned = {m for m, d in states(daemon).items() if d["pinned"]}
    assert pinned == {"own-model"} and loaded(daemon) == {"own-model"}
