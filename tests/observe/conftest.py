"""One real daemon with the default models, shared by the observability tests: two slots, so a
third request has to wait for one."""
from __future__ import annotations

import http.client
import re
import socket
import threading
import time

import orjson
import pytest

from testing.daemon import Daemon, create_key

CHAT = "smollm2-135m-instruct"
CONFIG = "[engine]\nslots = 2\ncontext_length = 512\nisolation = \"inline\"\n"


class Client:
    """HTTP to the daemon without a client timeout a slow machine could hit."""

    def __init__(self, daemon: Daemon):
        self.daemon = daemon
        self.key = daemon.admin_key

    def post(self, path: str, body: dict, *, port: str = "inference", key: str | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", getattr(self.daemon, f"{port}_port"))
        conn.request("POST", path, body=orjson.dumps(body),
                     headers={"Authorization": f"Bearer {key or self.key}",
                              "Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        return response.status, orjson.loads(raw)

    def complete(self, **body) -> dict:
        status, answer = self.post("/v1/completions", {"model": CHAT, "temperature": 0, **body})
        assert status == 200, answer
        return answer

    def stream(self, path: str, body: dict) -> list[dict]:
        status, raw = self.post_raw(path, {**body, "stream": True})
        assert status == 200, raw
        chunks = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
        assert chunks[-1] == "[DONE]"
        return [orjson.loads(c) for c in chunks[:-1]]

    def post_raw(self, path: str, body: dict):
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.inference_port)
        conn.request("POST", path, body=orjson.dumps(body),
                     headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        return response.status, raw

    def metrics_text(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.daemon.cluster_port)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.key}"})
        response = conn.getresponse()
        text = response.read().decode()
        conn.close()
        assert response.status == 200
        return text

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics: 'name{labels}' -> value."""
        return parse_prometheus(self.metrics_text())

    def settled(self, deadline: float = 120.0) -> dict[str, float]:
        """/metrics once the engines' series stop moving: workers push their counters once a
        second, so a request that just ended may not be counted yet in the first read."""
        import time
        end = time.monotonic() + deadline
        last = self.metrics()
        while True:
            time.sleep(1.5)
            now = self.metrics()
            engines = lambda m: {k: v for k, v in m.items() if 'model="' in k}   # noqa: E731
            if engines(now) == engines(last) or time.monotonic() > end:
                return now
            last = now

    def open_stream(self, body: dict) -> socket.socket:
        """Start a streaming completion on a raw socket and read until its first token."""
        payload = orjson.dumps({"model": CHAT, "stream": True, **body})
        sock = socket.create_connection(("127.0.0.1", self.daemon.inference_port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + self.key.encode() + b"\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        received = b""
        while received.count(b"data: ") < 1:
            chunk = sock.recv(65536)
            assert chunk, "the stream ended early"
            received += chunk
        return sock


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def parse_prometheus(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.match(line)
        assert found, f"not a Prometheus sample: {line!r}"
        samples[found.group(1)] = float(found.group(2))
    return samples


def series(name: str, model: str = CHAT, **labels) -> str:
    inner = ",".join([f'model="{model}"'] + [f'{k}="{v}"' for k, v in labels.items()])
    return f"{name}{{{inner}}}"


def run_together(*calls):
    """Run callables on threads at once; their results in order (re-raising a failure)."""
    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as exc:       # noqa: BLE001 - handed back to the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    started = Daemon(str(tmp_path_factory.mktemp("observe") / "data"), CONFIG, models=True)
    yield started
    started.stop()


@pytest.fixture(scope="session")
def client(daemon):
    return Client(daemon)


@pytest.fixture(scope="session")
def reader_key(daemon):
    key = create_key(daemon.data_dir, "reader", "cluster:read,inference")
    for _ in range(600):                 # the daemon rereads its key file within half a second
        if daemon.request("GET", "/v1/health", key=key)[0] == 200:
            return key
        time.sleep(0.05)
    raise AssertionError("the new key never took effect")
