"""A real PostgreSQL server for the tests: initdb and pg_ctl into a temp dir, on a free port.

PostgreSQL refuses to run as root, so as root (CI, `make test`) the cluster belongs to the
`postgres` user that Debian's package creates. Where initdb is absent the PostgreSQL
variants are skipped, and the skip says why.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

import asyncpg

SKIP_REASON = "PostgreSQL's initdb is not on PATH (make test-deps installs Debian's postgresql)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _find(tool: str) -> str | None:
    found = shutil.which(tool)
    if found:
        return found
    for version in ("17", "16", "15"):
        path = f"/usr/lib/postgresql/{version}/bin/{tool}"
        if os.path.exists(path):
            return path
    return None


class PostgresServer:
    def __init__(self):
        self.initdb, self.pg_ctl = _find("initdb"), _find("pg_ctl")
        self.available = self.initdb is not None and self.pg_ctl is not None
        self.folder = self.port = None
        self._user = "postgres" if os.geteuid() == 0 else None
        self._n = 0

    def _run(self, *args: str) -> None:
        done = subprocess.run(args, user=self._user, capture_output=True, text=True, timeout=120,
                              cwd=self.folder)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout} {done.stderr}")

    def start(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="stackd-pg-")
        if self._user is not None:
            shutil.chown(self.folder, self._user, self._user)
        self.port = _free_port()
        data = os.path.join(self.folder, "data")
        self._run(self.initdb, "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._run(self.pg_ctl, "-D", data, "-l", os.path.join(self.folder, "log"), "-w",
                  "-t", "120", "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off", "start")

    def stop(self) -> None:
        if self.folder is None:
            return
        try:
            self._run(self.pg_ctl, "-D", os.path.join(self.folder, "data"), "-m", "fast", "-w",
                      "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        self._n += 1
        name = f"console_{os.getpid()}_{self._n}"
        conn = await asyncpg.connect(host="127.0.0.1", port=self.port, user="postgres",
                                     database="postgres")
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"
