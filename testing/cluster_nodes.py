"""Clusters of real daemons for the tests: each node a `stackd serve` process with its
own data dir and fixed ports (a restarted leader comes back where its followers look for it),
optionally inside a network namespace. No models are loaded, so a node starts in a second or two."""
from __future__ import annotations

import os
import signal
import time

import orjson

from stackd.cluster import signing
from .daemon import free_port, http_request, stackd_command, start_process

SECRET = "test-cluster-secret-0123456789abcdef"
# Generous: the assertion is that something happens, not how fast (that is the bench's job).
EVENTUAL = 90.0


class Node:
    def __init__(self, data_dir: str, *, role: str = "leader", leader: str = "", secret: str | None = SECRET,
                 host: str = "127.0.0.1", advertise: str = "", reach: str = "127.0.0.1",
                 netns: str | None = None, ports: tuple[int, int] | None = None, env: dict | None = None,
                 injected: dict | None = None):
        self.data_dir = data_dir
        self.reach = reach                        # the address the test process talks to
        self.netns = netns
        self.inference_port, self.cluster_port = ports or (free_port(), free_port())
        self.injected = dict(injected or {})       # faults (testing/daemon.py's stackd_command)
        self.env = {"STACKD_MODELS_PRELOAD": "", "STACKD_CLUSTER_ROLE": role,
                    "STACKD_CLUSTER_LEADER": leader, "STACKD_CLUSTER_ADVERTISE": advertise,
                    "STACKD_HOST": host, "STACKD_HTTP_ACCESS_LOG": "false", **(env or {})}
        if secret is not None:
            self.env["STACKD_CLUSTER_SECRET"] = secret
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.proc = None
        self.start()

    @property
    def cluster_url(self) -> str:
        return f"http://{self.reach}:{self.cluster_port}"

    def start(self) -> None:
        command = stackd_command("serve", "--data-dir", self.data_dir, "--inference-port", str(self.inference_port),
                                 "--cluster-port", str(self.cluster_port), injected=self.injected)
        if self.netns:
            command = ["ip", "netns", "exec", self.netns] + command
        env = {k: v for k, v in os.environ.items() if not k.startswith("STACKD_")}
        self.proc, _ = start_process(command, {**env, **self.env}, self.stdout, self.stderr, until={"cluster"})
        self.node_id = _read_json(os.path.join(self.data_dir, "node.json"))["node_id"]
        self.admin_key = open(os.path.join(self.data_dir, "admin.key")).read().strip()

    def request(self, method: str, path: str, *, port: str = "cluster", key: str | None = "admin",
                body=None, headers: dict | None = None):
        """-> (status, headers with lower-case names, parsed JSON or raw bytes)."""
        return http_request(self.reach, getattr(self, f"{port}_port"), method, path, body=body,
                            headers=headers, key=self.admin_key if key == "admin" else key)

    def get(self, path: str) -> dict:
        status, _, body = self.request("GET", path)
        assert status == 200, (path, status, body)
        return body

    def signed(self, method: str, path: str, body: bytes = b"", *, secret: str = SECRET,
               now: float | None = None, node_id: str = "test-node") -> dict:
        return signing.sign(secret.encode(), method, path, body, now, node_id=node_id)

    def kill(self, signum=signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            self.proc.wait(timeout=60)

    def stop(self) -> int:
        self.kill(signal.SIGTERM)
        return self.proc.returncode

    def log(self) -> str:
        """What the node printed so far, as far as the drain threads have read it: a line the
        node wrote a moment ago may not be here yet (assert presence with logged())."""
        return "".join(self.stdout) + "".join(self.stderr)

    def logged(self, text: str) -> str:
        """Waits until `text` is in the log (the drain threads catch up), else fails."""
        return eventually(lambda: text in self.log() and self.log())


def _read_json(path: str) -> dict:
    with open(path, "rb") as f:
        return orjson.loads(f.read())


def eventually(check, timeout: float = EVENTUAL, every: float = 0.1):
    """Polls check() until it returns something truthy; its last value or exception explains a
    failure."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = check()
            if last:
                return last
        except (AssertionError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {last!r}")
        time.sleep(every)


def statuses(node: Node) -> dict[str, str]:
    """node id -> up/down, as `node`'s /v1/topology says."""
    return {n["id"]: n["status"] for n in node.get("/v1/topology")["nodes"]}
