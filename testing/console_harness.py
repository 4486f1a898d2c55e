"""The console and a fake node served on one uvloop loop in a background thread.

Tests speak plain HTTP to it from the test thread (http.client), the way a client would, and
reach into the loop (`run`) only to arrange what HTTP cannot (an expired row, a gate).
"""
from __future__ import annotations

import asyncio
import http.client
import os
import threading

import orjson
import uvloop

from stackd.api.console import app as console_app
from stackd.console.service import Console, ConsoleSettings
from stackd.http.access_log import AccessLog
from stackd.http.limits import Limits
from stackd.http.server import HttpServer
from stackd.observe.metrics import Metrics

from .daemon import exchange
from .fake_node import FakeNode


class Harness:
    def __init__(self, data_dir: str, database_url: str = "", **settings):
        self.data_dir = data_dir
        self.database_url = database_url
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.http = self.run(self._server())
        self.node = FakeNode(os.path.join(data_dir, "node"))
        self.node_port = self.run(self.http.listen(self.node.app, "127.0.0.1", 0))
        self.node_url = f"http://127.0.0.1:{self.node_port}"
        key_file = os.path.join(data_dir, "coordinator.key")
        with open(key_file, "w") as f:
            f.write(self.node.key)
        # every test logs in from 127.0.0.1: only the throttle's own test keeps a low limit
        settings.setdefault("login_rate_limit", 100_000)
        self.settings = ConsoleSettings(data_dir, database_url, coordinator=self.node_url,
                                        coordinator_key_file=key_file, **settings)
        self.console = None
        self.start_console()

    async def _server(self) -> HttpServer:
        # keep-alive outlives the tests' pauses, so a connection's cache is what gets tested
        return HttpServer(asyncio.get_running_loop(), Limits(keepalive_timeout=60), Metrics(),
                          AccessLog(enabled=False))

    def run(self, coroutine, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def call_soon(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def start_console(self) -> None:
        self.console = Console(self.settings)
        self.port = self.run(console_app.start(self.http, self.console, "127.0.0.1", 0, 1 << 20))
        with open(os.path.join(self.data_dir, "console-admin.password")) as f:
            self.admin_password = f.read().strip()

    def stop_console(self) -> None:
        """Close the console's listener and database (the fake node keeps serving). On the
        loop's own thread: uvloop's transports must never be touched from another one."""
        async def stop():
            listener = self.http.listeners.pop()
            listener.close()
            for connection in [c for c in self.http.connections if c.app.name == "console"]:
                connection.close()
            await self.console.close()
        self.run(stop())

    def close(self) -> None:
        self.run(self.http.shutdown(1.0))
        self.run(self.console.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)
        self.loop.close()

    # ---- HTTP from the test thread --------------------------------------------------------------

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def call(self, method: str, path: str, token: str | None = None, body=None,
             conn: http.client.HTTPConnection | None = None, headers: dict | None = None):
        """-> (status, headers with lower-case names, JSON body or raw bytes)."""
        own = conn is None
        conn = conn or self.connect()
        try:
            return exchange(conn, method, path, key=token, body=body, headers=headers)
        finally:
            if own:
                conn.close()

    def login(self, username: str, password: str) -> dict:
        status, _, body = self.call("POST", "/api/auth/login",
                                    body={"username": username, "password": password})
        assert status == 200, body
        return body

    def admin_token(self) -> str:
        return self.login("admin", self.admin_password)["access_token"]

    def add_user(self, username: str, level: str | None, password: str = "password-123") -> dict:
        """Sign up; then approve with `level` (None: leave pending; "rejected": reject)."""
        status, _, profile = self.call("POST", "/api/auth/signup",
                                       body={"username": username, "password": password})
        assert status == 201, profile
        if level is not None:
            admin = self.admin_token()
            if level == "rejected":
                status, _, profile = self.call("POST", f"/api/admin/users/{profile['id']}/reject",
                                               admin, {"reason": "not on the team"})
            else:
                status, _, profile = self.call("POST", f"/api/admin/users/{profile['id']}/approve",
                                               admin, {"level": level})
            assert status == 200, profile
        return profile

    def add_device(self, name: str) -> dict:
        status, _, device = self.call("POST", "/api/devices", self.admin_token(), {
            "name": name, "inference_url": self.node_url, "cluster_url": self.node_url,
            "api_key": self.node.key})
        assert status == 201, device
        return device
