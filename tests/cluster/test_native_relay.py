"""The relay's native byte pump (stackd._engine.splice, native/splice.cpp) between real sockets:
a dialer and a relay, both pumping natively after the handshake, carry large messages both ways
intact; a remote that goes away is reported by the dialer (on_lost); a side that closes ends
the other. A client without the cluster secret still gets nothing through (the handshake is
Python's, before any pumping)."""
from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from stackd._engine import splice
from stackd.system import relay

SECRET = os.urandom(32)


def listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    return sock


def echo_server(sock: socket.socket, stop_after: int | None = None) -> None:
    """Sends back what it receives, until the client closes (or after `stop_after` bytes: then
    it closes the connection itself)."""
    def serve():
        conn, _ = sock.accept()
        seen = 0
        with conn:
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    return
                seen += len(data)
                conn.sendall(data)
                if stop_after is not None and seen >= stop_after:
                    return
    threading.Thread(target=serve, daemon=True).start()


@pytest.fixture
def chain():
    """A dialer -> relay -> upstream chain, pumping natively; yields (dialer, upstream, lost)."""
    upstream = listener()
    public = listener()
    lost: list[str] = []
    r = relay.Relay(public, upstream.getsockname()[1], SECRET, "p1", splice=splice)
    threading.Thread(target=r.serve_forever, daemon=True).start()
    dialer = relay.Dialer("127.0.0.1", public.getsockname()[1], SECRET, "p1", on_lost=lost.append, splice=splice)
    threading.Thread(target=dialer._accept, daemon=True).start()
    yield dialer, upstream, lost
    dialer.listener.close()
    public.close()
    upstream.close()


def recv_n(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "closed early"
        data += chunk
    return bytes(data)


def test_messages_cross_the_native_pump_intact_both_ways(chain):
    dialer, upstream, lost = chain
    echo_server(upstream)
    with socket.create_connection(("127.0.0.1", dialer.port), timeout=30) as client:
        for size in (1, 9, 40_000, 3 * 1024 * 1024 + 17):        # a command .. a step's logits
            message = os.urandom(size)
            client.sendall(message)
            assert hashlib.sha256(recv_n(client, size)).digest() == hashlib.sha256(message).digest()
    assert lost == []                       # the client closed first: not a lost peer


def test_small_messages_come_back_exactly(chain):
    dialer, upstream, lost = chain
    echo_server(upstream)
    with socket.create_connection(("127.0.0.1", dialer.port), timeout=30) as client:
        for n in range(50):
            message = bytes([n]) * (n + 1) + b"end"
            client.sendall(message)
            assert recv_n(client, len(message)) == message


def test_a_remote_that_closes_is_a_lost_peer_and_ends_the_client_s_connection(chain):
    dialer, upstream, lost = chain
    echo_server(upstream, stop_after=5)
    with socket.create_connection(("127.0.0.1", dialer.port), timeout=30) as client:
        client.sendall(b"hello")
        assert recv_n(client, 5) == b"hello"
        client.settimeout(30)
        assert client.recv(10) == b""       # the server closed: so does the chain
    for _ in range(300):
        if lost:
            break
        threading.Event().wait(0.01)
    assert lost == ["127.0.0.1:%d" % dialer.remote[1]]


def test_without_the_secret_nothing_reaches_the_pumped_upstream(chain):
    dialer, upstream, _ = chain
    with pytest.raises(relay.RelayError):
        relay.dial(*dialer.remote, b"wrong" * 8, "p1")
    upstream.settimeout(0.5)
    with pytest.raises(socket.timeout):
        upstream.accept()


def test_splice_reports_which_side_ended_and_the_bytes():
    a1, a2 = socket.socketpair()
    b1, b2 = socket.socketpair()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", splice(a2.fileno(), b1.fileno())))
    t.start()
    a1.sendall(b"x" * 1000)
    assert recv_n(b2, 1000) == b"x" * 1000
    b2.sendall(b"yy")
    assert recv_n(a1, 2) == b"yy"
    b2.close()                              # b's side ends first
    t.join(30)
    assert out["r"] == (1, 1000, 2)
    for s in (a1, a2, b1):
        s.close()
