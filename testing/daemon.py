"""Start the real daemon as a subprocess on free ports and talk HTTP to it. Every harness that
starts a `stackd` process (this one, console_embedded.py, cluster_nodes.py) starts it with
`start_process`: the installed package's CLI, its "<app> listening on" lines read for its ports,
its output drained by threads from then on."""
from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import orjson

# A client that waits this long has met a hang, not a slow machine: CI runs on 2 busy cores.
CLIENT_TIMEOUT = 300
LISTENING = re.compile(r"(inference|cluster|console|ollama) listening on http://(?:\[[^\]]*\]|[^:/]+):(\d+)")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the checkout, above testing/


def stackd_command(*args: str, python: str | None = None, injected: dict | None = None) -> list[str]:
    """The stackd CLI as this interpreter (or `python`: another checkout's, for A/B benches) runs
    it (the installed package, from any folder). `injected` ({"loopback_peers": "f1=512",
    "worker_crash_file": path, ...}: testing/serve.py's FLAGS): the daemon started through
    `python -m testing.serve`, which hands them to its composition root (run it with
    child_env's environment, which finds this package)."""
    from testing import serve
    flags = serve.flags(injected or {})
    if not flags:                        # nothing injected: the product's own entry point
        return [python or sys.executable, "-m", "stackd", *args]
    return [python or sys.executable, "-m", "testing.serve", *flags, *args]


def child_env(env: dict) -> dict:
    """`env` with this checkout's root on PYTHONPATH: a child run as `-m testing.serve` finds
    the test support from any folder (the installed package is found as always)."""
    paths = [ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (another process may take it before the caller binds)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def drain(stream, sink: list[str]) -> None:
    for line in stream:
        sink.append(line)


def start_process(command: list[str], env: dict, stdout: list[str], stderr: list[str], *,
                  until: set[str], timeout: float = 120.0) -> tuple[subprocess.Popen, dict[str, int]]:
    """Start `command` and read its output until each app in `until` ("inference", "cluster",
    "console") says where it listens; from then on threads drain its lines into `stdout` and
    `stderr` (lists that may hold an earlier run's already). -> (the process, app -> port)."""
    if "testing.serve" in command:
        env = child_env(env)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    threading.Thread(target=drain, args=(proc.stderr, stderr), daemon=True).start()
    ports: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        stdout.append(line)
        found = LISTENING.search(line)
        if found:
            ports[found.group(1)] = int(found.group(2))
        if until <= ports.keys():
            break
        assert time.monotonic() < deadline, "daemon did not start"
    else:
        raise AssertionError(f"daemon exited: {''.join(stdout)} {''.join(stderr)}")
    threading.Thread(target=drain, args=(proc.stdout, stdout), daemon=True).start()
    return proc, ports


def cli(*args: str, data_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run(stackd_command(*args, "--data-dir", data_dir),
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT)


def create_key(data_dir: str, name: str, permissions: str) -> str:
    done = cli("keys", "create", "--name", name, "--permissions", permissions, data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def http_request(host: str, port: int, method: str, path: str, *, key: str | None = None,
                 body=None, headers: dict | None = None):
    """One request on its own connection -> (status, headers dict with lower-case names,
    parsed JSON or raw bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT)
    try:
        return exchange(conn, method, path, key=key, body=body, headers=headers)
    finally:
        conn.close()


def exchange(conn: http.client.HTTPConnection, method: str, path: str, *, key: str | None = None,
             body=None, headers: dict | None = None):
    """One request on `conn` (a bearer `key`, a JSON or raw `body`) -> (status, headers dict with
    lower-case names, parsed JSON or raw bytes)."""
    sent = dict(headers or {})
    if key is not None:
        sent["Authorization"] = f"Bearer {key}"
    payload = None
    if body is not None:
        payload = body if isinstance(body, bytes) else orjson.dumps(body)
        sent.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=payload, headers=sent)
    response = conn.getresponse()
    raw = response.read()
    got = {k.lower(): v for k, v in response.getheaders()}
    if got.get("content-type", "").startswith("application/json"):
        return response.status, got, orjson.loads(raw)
    return response.status, got, raw


NO_MODELS = "[models]\npreload = []\n"


class Daemon:
    """`models=False` starts without loading any model (fast, for the HTTP-layer tests);
    `console=True` serves the embedded console too (`serve --console`, on a free port);
    `injected`: faults and simulated peers (stackd_command)."""

    def __init__(self, data_dir: str, config: str = "", env: dict | None = None, models: bool = False,
                 console: bool = False, start_timeout: float = 120.0, python: str | None = None,
                 injected: dict | None = None, ollama: bool = False):
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        if not models and "[models]" not in config:
            config = NO_MODELS + config
        if config:
            with open(os.path.join(data_dir, "config.toml"), "w") as f:
                f.write(config)
        command = stackd_command("serve", "--data-dir", data_dir, "--inference-port", "0", "--cluster-port", "0",
                                 python=python, injected=injected)
        apps = {"inference", "cluster"}
        if console:
            command += ["--console", "--console-port", "0"]
            apps.add("console")
        if ollama:                       # Ollama's API on a free port (serve --ollama)
            command += ["--ollama", "--ollama-port", "0"]
            apps.add("ollama")
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        env = dict(env or {})
        if "keep_alive" not in config:
            # models.keep_alive's 5 minutes would make a test's outcome depend on how fast the
            # machine runs it (a model unloaded under a slow test): they stay unless a test says
            env.setdefault("STACKD_MODELS_KEEP_ALIVE", "-1")
        self.proc, self.ports = start_process(command, {**os.environ, **env}, self.stdout, self.stderr,
                                              until=apps, timeout=start_timeout)
        self.inference_port, self.cluster_port = self.ports["inference"], self.ports["cluster"]
        self.ollama_port = self.ports.get("ollama")
        key_file = os.path.join(data_dir, "admin.key")
        self.admin_key = open(key_file).read().strip() if os.path.exists(key_file) else None

    def openai_client(self, asynchronous: bool = False):
        """The official openai SDK's client on this daemon, with its admin key. No retries (one would
        hide a failed first answer) and a timeout no slow CI run reaches."""
        import openai
        kind = openai.AsyncOpenAI if asynchronous else openai.OpenAI
        return kind(base_url=f"http://127.0.0.1:{self.inference_port}/v1", api_key=self.admin_key,
                    max_retries=0, timeout=CLIENT_TIMEOUT)

    def request(self, method: str, path: str, *, port: str = "cluster", key: str | None = None,
                body=None, headers: dict | None = None):
        """-> (status, headers dict with lower-case names, parsed JSON or raw bytes)."""
        return http_request("127.0.0.1", getattr(self, f"{port}_port"), method, path, key=key,
                            body=body, headers=headers)

    def metric(self, name: str) -> float:
        """A /metrics series summed over its labels (0 when absent), read with the admin key."""
        status, _, text = self.request("GET", "/metrics", key=self.admin_key)
        assert status == 200, status
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
                   if line.startswith(name + "{") or line.startswith(name + " "))

    def raw(self, data: bytes, port: str = "cluster", wait: float = 30.0) -> bytes:
        """Send raw bytes; return everything the server sends until it closes or goes quiet."""
        sock = socket.create_connection(("127.0.0.1", getattr(self, f"{port}_port")), timeout=wait)
        try:
            sock.sendall(data)
            chunks = []
            while True:
                try:
                    chunk = sock.recv(65536)
                except socket.timeout:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            sock.close()

    def stop(self, signum=signal.SIGTERM, timeout: float = 40.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.proc.wait(timeout=timeout)
