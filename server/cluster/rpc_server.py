"""ggml RPC server children: one per placement, each with its authenticated relay.

ggml's RPC server serves one client at a time and fixes its thread count when it starts, so
every placement of a model on this node gets a child process of its own:

    python -m stackd.cluster.rpc_server --host H --port P --threads T --cache-dir D \
        --placement-id X [--kernels MODE] [--kv-commit lazy|eager] [--direct]   (the cluster secret as one hex line on stdin)

The child runs ggml's server on 127.0.0.1:<free port> (never any other address) and, unless
`--direct`, the relay (server/system/relay.py) on H:P, both in threads. It prints
`ready <public port> <loopback port>` once both accept connections. `--direct` (a leader's own
RPC server, which its worker reaches on loopback) runs no relay. `--kernels` is the node's
engine.kernels (auto | off, or a path name): unless off, the child serves our kernels' served
device (kernels/README.md, "Served over RPC"), so that its layers compute as the leader's
engine computes its own: the same arithmetic, so a split gives one node's greedy text.
`--kv-commit` is engine.kv_commit: the KV cache of the layers a child holds is committed as the
engine's own is (accel.commit_on_write).

`RpcServers` is the daemon's side: it starts children on ports from `cluster.rpc_port` upward,
stops them, lists them, and restarts none on its own (a restarted server under a live client
only aborts the client).
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .. import PACKAGE

log = logging.getLogger("stackd.cluster")

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT = 60.0
PORT_SPAN = 1000                       # ports tried from cluster.rpc_port upward
SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class RpcServerError(RuntimeError):
    """A child that could not start (no free port, a bad request, the server failed)."""


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_accepting(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def native_splice():
    """The relay's native byte pump (native/splice.cpp); None (Python threads copy) when
    STACKD_RELAY=python, which bench/rpc_split.py sets to measure the difference."""
    if os.environ.get("STACKD_RELAY") == "python":
        return None
    from .._engine import splice
    return splice


# ---- the child ----------------------------------------------------------------------------------

def child_main(argv: list[str]) -> int:
    args = argparse.ArgumentParser(prog="stackd.cluster.rpc_server")
    args.add_argument("--host", default="127.0.0.1")
    args.add_argument("--port", type=int, default=0)
    args.add_argument("--threads", type=int, default=1)
    args.add_argument("--cache-dir", default="")
    args.add_argument("--placement-id", required=True)
    args.add_argument("--parent", type=int, default=0)
    args.add_argument("--direct", action="store_true")
    args.add_argument("--kernels", default="off")
    args.add_argument("--batch-invariant", action="store_true")
    args.add_argument("--kv-commit", choices=("lazy", "eager"), default="lazy")
    opts = args.parse_args(argv)
    if opts.parent:
        from ..system.process import die_with_parent
        die_with_parent(opts.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    secret = bytes.fromhex(sys.stdin.readline().strip() or "")
    if not opts.direct and not secret:
        print("failed: the relay needs the cluster secret", flush=True)
        return 2
    relay_listener = None
    if not opts.direct:
        relay_listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        relay_listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            relay_listener.bind((opts.host, opts.port))
        except OSError as exc:
            print(f"failed: cannot bind {opts.host}:{opts.port}: {exc.strerror}", flush=True)
            return 3
        relay_listener.listen(8)

    # ggml prints to stdout from C; the daemon reads only our first line.
    report = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    from .._engine import rpc_serve
    from ..engine import accel

    try:
        accel.commit_on_write(opts.kv_commit)
        accel.register(opts.kernels, opts.batch_invariant)   # after _engine: one ggml (accel.py)
    except ValueError as exc:
        report.write(f"failed: {exc}\n")
        report.flush()
        return 2
    device = accel.rpc_device()
    upstream = free_loopback_port()

    def serve():
        try:
            rpc_serve(f"127.0.0.1:{upstream}", opts.cache_dir, opts.threads, device)
        finally:
            os._exit(4)                      # the server never returns unless it failed
    threading.Thread(target=serve, daemon=True, name="ggml rpc server").start()
    if not wait_accepting(upstream, START_TIMEOUT):
        report.write("failed: the RPC server did not start\n")
        report.flush()
        return 4
    public = upstream
    if relay_listener is not None:
        from ..system.relay import Relay
        public = relay_listener.getsockname()[1]
        relay = Relay(relay_listener, upstream, secret, opts.placement_id, splice=native_splice())
        threading.Thread(target=relay.serve_forever, daemon=True, name="rpc relay").start()
    report.write(f"ready {public} {upstream}\n")
    report.close()
    threading.Event().wait()             # the threads serve until the daemon stops us
    return 0


# ---- the daemon's side ---------------------------------------------------------------------------

@dataclass
class RpcChild:
    placement_id: str
    leader_id: str
    threads: int
    port: int                 # what a client dials: the relay's (or, direct, the server's) port
    upstream_port: int        # the ggml server on 127.0.0.1
    direct: bool
    proc: subprocess.Popen = field(repr=False)
    started_at: float = field(default_factory=time.time)
    asked_at: float = field(default_factory=time.monotonic)   # when its rpc/start came in

    @property
    def state(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "running"
        return f"exited ({code})" if code >= 0 else f"killed by signal {-code}"

    def describe(self) -> dict:
        return {"placement_id": self.placement_id, "leader_id": self.leader_id, "port": self.port,
                "threads": self.threads, "state": self.state, "pid": self.proc.pid,
                "started_at": int(self.started_at)}


class RpcServers:
    """This node's RPC server children, by placement id."""

    def __init__(self, loop, data_dir: str, host: str, first_port: int, secret: bytes | None,
                 kernels: str = "off", batch_invariant: bool = False, kv_commit: str = "lazy"):
        self.loop = loop
        self.kernels = kernels               # engine.kernels: the children compute as the engine does
        self.batch_invariant = batch_invariant   # engine.batch_invariant, likewise
        self.kv_commit = kv_commit           # engine.kv_commit, likewise
        self.data_dir = data_dir
        self.host = host
        self.first_port = first_port
        self.secret = secret
        self.children: dict[str, RpcChild] = {}
        self._lock = asyncio.Lock()

    def listing(self) -> list[dict]:
        return [child.describe() for child in self.children.values()]

    async def start(self, placement_id: str, threads: int, leader_id: str, direct: bool = False) -> RpcChild:
        """A new child for this placement (an old one under that id is stopped first)."""
        if not SAFE_ID.match(placement_id) or not SAFE_ID.match(leader_id):
            raise RpcServerError("placement_id and leader_id must be 1-128 characters of A-Z a-z 0-9 . _ -")
        if not direct and not self.secret:
            raise RpcServerError("this node has no cluster secret: its RPC relay would be open")
        asked_at = time.monotonic()
        async with self._lock:
            await self._stop_locked(placement_id)
            cache_dir = os.path.join(self.data_dir, "rpc-cache", leader_id)
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
            for port in self._candidate_ports(direct):
                child = await self._spawn(placement_id, leader_id, threads, port, cache_dir, direct)
                if child is not None:
                    child.asked_at = asked_at
                    self.children[placement_id] = child
                    return child
        raise RpcServerError(f"no free port for an RPC server from {self.first_port} upward")

    def _candidate_ports(self, direct: bool):
        if direct:
            yield 0                           # no public port: the server's own loopback port
            return
        taken = {child.port for child in self.children.values()}
        for port in range(self.first_port, self.first_port + PORT_SPAN):
            if port not in taken:
                yield port

    async def _spawn(self, placement_id, leader_id, threads, port, cache_dir, direct) -> RpcChild | None:
        cmd = [sys.executable, "-m", f"{PACKAGE}.cluster.rpc_server", "--host", self.host, "--port", str(port),
               "--threads", str(max(1, threads)), "--cache-dir", cache_dir,
               "--placement-id", placement_id, "--parent", str(os.getpid()), "--kernels", self.kernels,
               "--kv-commit", self.kv_commit]
        if direct:
            cmd.append("--direct")
        if self.batch_invariant:
            cmd.append("--batch-invariant")
        env = {**os.environ, "GGML_NO_BACKTRACE": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                stderr=subprocess.DEVNULL)

        def handshake() -> str:
            proc.stdin.write(((self.secret or b"").hex() + "\n").encode())
            proc.stdin.close()
            return proc.stdout.readline().decode(errors="replace").strip()
        try:
            line = await asyncio.wait_for(self.loop.run_in_executor(None, handshake), START_TIMEOUT)
        except (asyncio.TimeoutError, OSError):
            line = ""
        proc.stdout.close()
        if line.startswith("ready "):
            public, upstream = (int(x) for x in line.split()[1:3])
            return RpcChild(placement_id, leader_id, threads, public, upstream, direct, proc)
        _stop_process(proc)
        if line.startswith("failed: cannot bind"):
            return None                       # taken: the caller tries the next port
        raise RpcServerError(f"the RPC server child failed to start: {line or 'no answer'}")

    async def stop(self, placement_id: str) -> bool:
        async with self._lock:
            return await self._stop_locked(placement_id)

    async def _stop_locked(self, placement_id: str) -> bool:
        child = self.children.pop(placement_id, None)
        if child is None:
            return False
        await self.loop.run_in_executor(None, _stop_process, child.proc)
        return True

    def keep_only(self, listed: set[str], asked_before: float) -> None:
        """The leader holds only the `listed` placements here: a child asked for before
        `asked_before` (so that the leader's list was made after it claimed the placement) and
        not listed missed its rpc/stop (the leader could not reach us then): it stops now.
        Children asked for later may be too new for the list: the next heartbeat judges them."""
        for child in list(self.children.values()):
            if child.placement_id not in listed and child.asked_at < asked_before:
                log.warning("cluster: the leader no longer holds placement %s: its RPC server stops",
                            child.placement_id)
                del self.children[child.placement_id]
                self.loop.run_in_executor(None, _stop_process, child.proc)

    def stop_all(self) -> None:
        """Fenced, or shutting down: every child goes now (a half-done client is dropped)."""
        for child in self.children.values():
            _stop_process(child.proc, grace=0)
        self.children.clear()


def _stop_process(proc: subprocess.Popen, grace: float = 2.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            pass
        proc.kill()
    proc.wait()


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
