"""The authenticated relay in front of a ggml RPC server, and the leader's dialer to it.

ggml's RPC server executes whatever a client sends (llama.cpp calls it "fragile and
insecure"): its port is root-equivalent. So it listens on 127.0.0.1 only, and other nodes
reach it through a relay that first proves the client holds the cluster secret:

    relay  -> client   MAGIC + nonce (32 random bytes, fresh per connection)
    client -> relay    HMAC-SHA256(secret, LABEL + nonce + placement id)
    relay  -> client   OK, then raw bytes both ways between the client and the RPC server

A wrong or missing proof closes the connection before a single byte reaches the RPC server;
a captured proof is worth nothing on another connection (another nonce). The relay runs in
the RPC server's child process and the dialer in the engine worker, each in threads, so RPC
traffic never waits on the daemon's event loop.

The dialer listens on 127.0.0.1 (an ephemeral port) for llama.cpp's RPC client, and for each
connection it accepts dials the remote relay, proves the secret, then pipes. When the remote
side drops a live connection the peer is gone: `on_lost` says so at once, before llama.cpp's
own read fails (which aborts the process without a word). A relay that is there but frozen
(its process stopped, its node hung: the kernel still acknowledges what is sent, so no TCP
timeout fires and llama.cpp would wait forever) is found by probing: every PROBE_INTERVAL
the dialer opens a connection and waits for the relay's greeting; none within PROBE_TIMEOUT
is a lost peer too. The probe never proves the secret, so it never reaches the RPC server
(which serves one client at a time).

After the handshake, bytes flow through `splice` when the caller gives one: the engine's native
pump (`stackd._engine.splice`, native/splice.cpp: one C++ thread per direction, off the GIL),
which the RPC server child and the engine worker pass (`native_splice()` in their layers; this
module, a neutral helper, imports nothing of the engine). Without it, Python threads copy (the
reference the bench compares with: bench/rpc_split.py).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time

MAGIC = b"stackd-rpc-relay/1\n"
LABEL = b"stackd rpc relay\0"
NONCE_BYTES = 32
OK = b"\x01"
HANDSHAKE_TIMEOUT = 5.0      # seconds a client gets to prove itself; a dialer to connect
CHUNK = 1 << 18
USER_TIMEOUT_MS = 3000       # unacknowledged data for this long: the link is down (TCP_USER_TIMEOUT)
PROBE_INTERVAL = 1.0         # seconds between the dialer's checks that its relay still greets
PROBE_TIMEOUT = 3.0          # a relay that does not greet a new connection this long is frozen


class RelayError(ConnectionError):
    """The relay cannot be reached, or refused the proof."""


def proof(secret: bytes, nonce: bytes, placement_id: str) -> bytes:
    return hmac.new(secret, LABEL + nonce + placement_id.encode(), hashlib.sha256).digest()


def tune(sock: socket.socket) -> None:
    """RPC messages are small and latency-bound: no Nagle delay; a dead link is noticed."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


def recv_exactly(sock: socket.socket, n: int, error: type[Exception] | None = None) -> bytes:
    """n bytes of a handshake; a connection that closes first raises `error` (RelayError)."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise (error or RelayError)("the connection closed during the handshake")
        data += chunk
    return bytes(data)


def close_quietly(sock: socket.socket) -> None:
    """Shut both ways and close; a socket already gone is no error."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def pipe(a: socket.socket, b: socket.socket, on_b_closed=None, splice=None) -> None:
    """Copy bytes both ways until either side closes, then close both. `on_b_closed` is
    called if `b` is the side that ended first. `splice(fd_a, fd_b)`: a native pump that does
    the copying (returns a tuple whose first item is 1 when b's side ended first)."""
    if splice is not None:
        try:
            b_first = splice(a.fileno(), b.fileno())[0] == 1
        finally:
            close_quietly(a)
            close_quietly(b)
        if b_first and on_b_closed is not None:
            on_b_closed()
        return
    done = threading.Event()

    def copy(src, dst, is_b):
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            while True:
                n = src.recv_into(buf)
                if n == 0:
                    break
                dst.sendall(view[:n])
        except OSError:
            pass
        first = not done.is_set()
        done.set()
        if first:
            if is_b and on_b_closed is not None:
                on_b_closed()
            close_quietly(a)
            close_quietly(b)

    threading.Thread(target=copy, args=(b, a, True), daemon=True).start()
    copy(a, b, False)


# ---- the relay (in the RPC server's child process) ---------------------------------------------

class Relay:
    """Accepts on a public port; lets through to 127.0.0.1:upstream_port only clients that
    prove the secret for this placement."""

    def __init__(self, listener: socket.socket, upstream_port: int, secret: bytes, placement_id: str,
                 splice=None):
        self.listener = listener
        self.upstream_port = upstream_port
        self.secret = secret
        self.placement_id = placement_id
        self.splice = splice

    def serve_forever(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn: socket.socket) -> None:
        try:
            tune(conn)
            conn.settimeout(HANDSHAKE_TIMEOUT)
            nonce = os.urandom(NONCE_BYTES)
            conn.sendall(MAGIC + nonce)
            answer = recv_exactly(conn, hashlib.sha256().digest_size)
            if not hmac.compare_digest(answer, proof(self.secret, nonce, self.placement_id)):
                raise RelayError("wrong proof")
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=HANDSHAKE_TIMEOUT)
        except (OSError, RelayError):
            close_quietly(conn)
            return
        tune(upstream)
        conn.settimeout(None)
        upstream.settimeout(None)
        try:
            conn.sendall(OK)
        except OSError:
            close_quietly(conn)
            close_quietly(upstream)
            return
        pipe(conn, upstream, splice=self.splice)


# ---- the dialer (in the leader's engine worker) -------------------------------------------------

def dial(host: str, port: int, secret: bytes, placement_id: str) -> socket.socket:
    """A connection to a remote relay that has accepted our proof."""
    try:
        sock = socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT)
    except OSError as exc:
        raise RelayError(f"cannot reach the RPC relay at {host}:{port}: {exc.strerror or exc}") from None
    try:
        tune(sock)
        hello = recv_exactly(sock, len(MAGIC) + NONCE_BYTES)
        if not hello.startswith(MAGIC):
            raise RelayError(f"{host}:{port} is not a stackd RPC relay")
        sock.sendall(proof(secret, hello[len(MAGIC):], placement_id))
        if recv_exactly(sock, 1) != OK:
            raise RelayError(f"the RPC relay at {host}:{port} refused")
    except RelayError as exc:
        sock.close()
        raise RelayError(f"the RPC relay at {host}:{port} refused the handshake ({exc})") from None
    except OSError as exc:
        sock.close()
        raise RelayError(f"the RPC relay at {host}:{port} failed: {exc.strerror or exc}") from None
    sock.settimeout(None)
    return sock


class Dialer:
    """127.0.0.1:<ephemeral> for llama.cpp, each connection carried to a remote relay."""

    def __init__(self, host: str, port: int, secret: bytes, placement_id: str, on_lost=None, splice=None):
        self.remote = (host, port)
        self.splice = splice
        self.secret = secret
        self.placement_id = placement_id
        self.on_lost = on_lost
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def probe(self) -> None:
        """Raise RelayError unless the remote relay answers and accepts us (ggml's RPC client
        aborts the process on an endpoint it cannot reach)."""
        close_quietly(dial(*self.remote, self.secret, self.placement_id))

    def start(self) -> "Dialer":
        threading.Thread(target=self._accept, daemon=True, name=f"dialer {self.remote}").start()
        threading.Thread(target=self._watch, daemon=True, name=f"dialer probe {self.remote}").start()
        return self

    def _watch(self) -> None:
        while True:
            time.sleep(PROBE_INTERVAL)
            if not greets(*self.remote, PROBE_TIMEOUT):
                self._lost()
                return

    def _accept(self) -> None:
        while True:
            try:
                local, _ = self.listener.accept()
            except OSError:                  # the listener is closed: the dialer is done
                return
            threading.Thread(target=self._carry, args=(local,), daemon=True).start()

    def _carry(self, local: socket.socket) -> None:
        tune(local)
        try:
            remote = dial(*self.remote, self.secret, self.placement_id)
        except RelayError:
            close_quietly(local)
            self._lost()
            return
        pipe(local, remote, on_b_closed=self._lost, splice=self.splice)

    def _lost(self) -> None:
        if self.on_lost is not None:
            self.on_lost("%s:%d" % self.remote)


def greets(host: str, port: int, timeout: float) -> bool:
    """Whether the relay accepts a connection and greets it within `timeout` seconds (each of
    connecting and reading). The connection closes before any proof: the relay drops it."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return recv_exactly(sock, len(MAGIC)) == MAGIC
    except (OSError, RelayError):
        return False


def dial_direct(host: str, port: int) -> None:
    """Check that an RPC server reached without a relay (a leader's own, on loopback) answers."""
    try:
        close_quietly(socket.create_connection((host, port), timeout=HANDSHAKE_TIMEOUT))
    except OSError as exc:
        raise RelayError(f"cannot reach the RPC server at {host}:{port}: {exc.strerror or exc}") from None
