"""What one client's Ollama fields do to another's request, with an ordinary inference key:
`keep_alive: 0` unloads the model only once nobody uses it, and a larger `num_ctx` loads it
again only once its requests have ended (Ollama's scheduler waits for a runner's requests too);
neither cuts a stream short. Unloading at once stays model management (`/api/delete`)."""
import http.client
import json
import threading
import time

import pytest

from testing.daemon import CLIENT_TIMEOUT, Daemon, create_key

pytestmark = pytest.mark.slow

CHAT = "smollm2-135m-instruct"
CONTEXT = 1024
POLL_DEADLINE = 120.0     # seconds a state may take to come on a loaded machine


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    config = ("[rate_limits]\ninference = 0\ncluster = 0\n"
              f"[engine]\nslots = 2\ncontext_length = {CONTEXT}\n"
              "[models]\npreload = [\"smollm2-135m-instruct\"]\nkeep_alive = -1\n")
    data_dir = tmp_path_factory.mktemp("sharing") / "data"
    data_dir.mkdir(mode=0o700)
    key = create_key(str(data_dir), "client", "inference")     # before the start: no sweep to wait for
    made = Daemon(str(data_dir), config, models=True, ollama=True)
    made.inference_key = key
    yield made
    made.stop()


def post(daemon, path: str, body: dict):
    return daemon.request("POST", path, port="ollama", key=daemon.inference_key, body=body)


def loaded(daemon) -> dict:
    _, _, body = daemon.request("GET", "/api/ps", port="ollama", key=daemon.inference_key)
    return {m["model"]: m for m in body["models"]}


class Stream:
    """A long streamed generation on its own connection, read to its end in a thread."""

    def __init__(self, daemon):
        self.lines: list[dict] = []
        self.conn = http.client.HTTPConnection("127.0.0.1", daemon.ollama_port, timeout=CLIENT_TIMEOUT)
        # raw counting: a continuation the model carries on past 300 tokens (no end of turn)
        self.conn.request("POST", "/api/generate", json.dumps({
            "model": CHAT, "prompt": ", ".join(str(i) for i in range(1, 40)) + ",", "raw": True,
            "options": {"num_predict": 300, "temperature": 0}}).encode(),
            {"Authorization": f"Bearer {daemon.inference_key}", "Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        self.lines.append(json.loads(self.response.readline()))          # it holds the model now
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self):
        for raw in iter(self.response.readline, b""):     # NDJSON lines, the chunking undone
            if raw.strip():
                self.lines.append(json.loads(raw))

    def end(self) -> dict:
        self.thread.join(CLIENT_TIMEOUT)
        self.conn.close()
        return self.lines[-1]


def poll(what):
    end = time.monotonic() + POLL_DEADLINE
    while not what():
        assert time.monotonic() < end, "the state never came"
        time.sleep(0.2)


def test_keep_alive_zero_unloads_once_the_other_request_ends(daemon):
    post(daemon, "/api/generate", {"model": CHAT, "prompt": ""})            # loaded
    stream = Stream(daemon)
    status, _, body = post(daemon, "/api/generate", {"model": CHAT, "prompt": "", "keep_alive": 0})
    assert status == 200 and body["done_reason"] == "unload"
    last = stream.end()                            # in use: it stayed while the stream ran, to its end
    assert last["done"] is True and last["done_reason"] == "length" and last["eval_count"] == 300, last
    poll(lambda: CHAT not in loaded(daemon))       # and goes once nobody uses it


def test_a_larger_num_ctx_waits_for_the_other_request_then_loads_again(daemon):
    post(daemon, "/api/generate", {"model": CHAT, "prompt": ""})
    before = loaded(daemon)[CHAT]["context_length"]
    stream = Stream(daemon)
    status, _, body = post(daemon, "/api/chat", {"model": CHAT, "stream": False,
                                                  "messages": [{"role": "user", "content": "Hi."}],
                                                  "options": {"num_predict": 2, "num_ctx": before * 2}})
    assert status == 200 and body["done"] is True, body
    last = stream.end()                            # the stream ended first, whole
    assert last["done"] is True and last["done_reason"] == "length" and last["eval_count"] == 300, last
    assert loaded(daemon)[CHAT]["context_length"] == before * 2
