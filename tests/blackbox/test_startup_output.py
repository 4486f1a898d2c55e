"""What a user reads: a real daemon's start-up output, line by line as the README shows it, nothing
from libraries at INFO, and an access log of one JSON line per client request, in which the
embedded console's polls of its own node do not appear unless they fail."""
import io
import json
import re
import time

import orjson
import pytest

from stackd.http.access_log import AccessLog
from testing.daemon import Daemon

pytestmark = pytest.mark.slow

# The README's start-up lines ("Quick start"), in order, on stdout.
README_LINES = [
    r"stackd: loaded chat model smollm2-135m-instruct \(context 2048, 16 slots\)",
    r"stackd: loaded embedding model all-minilm-l6-v2 \(context 512, 16 slots\)",
    r"stackd: node node-[0-9a-f]{12} data dir \S+",
    r"stackd: first start: admin API key written to \S+/admin\.key",
    r"stackd: inference listening on http://127\.0\.0\.1:\d+",
    r"stackd: cluster listening on http://127\.0\.0\.1:\d+",
    r"stackd: first start: console admin password written to \S+/console-admin\.password",
    r"stackd: console listening on http://127\.0\.0\.1:\d+",
]


def polls_seen(daemon) -> int:
    """Answered GET /v1/health requests, from the node's own counters."""
    _, _, text = daemon.request("GET", "/metrics", key=daemon.admin_key)
    found = re.findall(rb'stackd_http_requests_total\{app="cluster",route="GET /v1/health",status="200"\} (\d+)',
                       text)
    return int(found[0]) if found else 0


def test_the_start_up_output_and_the_access_log(tmp_path):
    daemon = Daemon(str(tmp_path / "data"), "[console]\ndevice_check_interval = 0.2\n", models=True,
                    console=True, start_timeout=300.0)
    try:
        assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200   # one client request
        for _ in range(3000):                        # until the console has polled its node a few times
            if polls_seen(daemon) >= 4:
                break
            time.sleep(0.05)
        assert polls_seen(daemon) >= 4
    finally:
        assert daemon.stop() == 0
    for _ in range(600):                          # the threads that drain its pipes reach their end
        if daemon.stdout and daemon.stdout[-1] == "stackd: stopped\n":
            break
        time.sleep(0.05)
    stdout = [line.rstrip("\n") for line in daemon.stdout]
    assert len(stdout) == len(README_LINES) + 2, stdout
    for line, pattern in zip(stdout, README_LINES):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert stdout[-2:] == ["stackd: shutting down (grace 30 s)", "stackd: stopped"]

    logged = [json.loads(line) for line in daemon.stderr]        # nothing but JSON lines: no library INFO
    client = [(entry["method"], entry["path"], entry["key"]) for entry in logged]
    health_by_admin = ("GET", "/v1/health", "admin")
    assert health_by_admin in client and all(key != "console" for _, _, key in client), client
    assert client.count(health_by_admin) == 1
    assert all(key == "admin" for _, _, key in client)          # the client's requests, one line each


def test_the_consoles_own_requests_are_logged_when_they_fail():
    stream = io.BytesIO()
    log = AccessLog(stream, quiet_keys=frozenset({"console"}))
    for status in (200, 304, 399, 400, 503):
        log.write("GET", "/v1/health", status, 10, 0.001, b"id", "console", "127.0.0.1:1")
    log.write("GET", "/v1/health", 200, 10, 0.001, b"id", "admin", "127.0.0.1:1")
    log.write("GET", "/v1/health", 200, 10, 0.001, b"id", None, "127.0.0.1:1")
    log.drain()
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(entry["status"], entry["key"]) for entry in lines] == [(400, "console"), (503, "console"),
                                                                    (200, "admin"), (200, None)]
