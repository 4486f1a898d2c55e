"""Nothing reaches a ggml RPC server through its relay without the cluster secret: no secret,
a wrong secret and a replayed handshake all get the connection closed before a single RPC
byte is exchanged; the right secret gets ggml's HELLO answered."""
from __future__ import annotations

import socket
import struct

import pytest

from stackd.system import relay

from .conftest import SECRET, run

pytestmark = pytest.mark.slow

RPC_CMD_HELLO = 14
CAPS = 24                                           # RPC_CONN_CAPS_SIZE
HELLO = struct.pack("<BQ", RPC_CMD_HELLO, CAPS) + bytes(CAPS)   # command, input size, caps
ANSWER = 8 + 4 + CAPS                               # size, major minor patch pad, caps
RPC_PROTO_MAJOR_VERSION = 7


def rpc_hello(sock: socket.socket, limit: int = ANSWER) -> bytes:
    """Send ggml's HELLO; return what came back until the connection closed or `limit`
    bytes came."""
    sock.settimeout(60)
    data = b""
    try:
        sock.sendall(HELLO)
        while len(data) < limit:
            chunk = sock.recv(limit - len(data))
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data


def greeting(sock: socket.socket) -> bytes:
    return relay.recv_exactly(sock, len(relay.MAGIC) + relay.NONCE_BYTES)


@pytest.fixture
def child(loop, peers):
    return run(loop, peers.start())


def connect(child) -> socket.socket:
    return socket.create_connection(("127.0.0.1", child.port), timeout=30)


def closed_without_rpc(sock: socket.socket) -> bool:
    """The relay closes: whatever we send, nothing more comes back."""
    reply = rpc_hello(sock)
    sock.close()
    return reply == b""


def test_right_secret_gets_an_rpc_exchange(child):
    sock = relay.dial("127.0.0.1", child.port, SECRET, child.placement_id)
    reply = rpc_hello(sock)
    sock.close()
    assert len(reply) == ANSWER and reply[8] == RPC_PROTO_MAJOR_VERSION


def test_no_secret_gets_nothing_through(child):
    sock = connect(child)
    # a plain ggml RPC client: speaks first, never answers the nonce; it reads the relay's
    # greeting and then the connection closes
    reply = rpc_hello(sock, limit=len(relay.MAGIC) + relay.NONCE_BYTES + ANSWER)
    sock.close()
    assert reply.startswith(relay.MAGIC)
    assert len(reply) == len(relay.MAGIC) + relay.NONCE_BYTES


def test_wrong_secret_is_refused(child):
    with pytest.raises(relay.RelayError):
        relay.dial("127.0.0.1", child.port, b"not the secret", child.placement_id)
    sock = connect(child)
    hello = greeting(sock)
    sock.sendall(relay.proof(b"not the secret", hello[len(relay.MAGIC):], child.placement_id))
    assert closed_without_rpc(sock)


def test_another_placement_id_is_refused(child):
    with pytest.raises(relay.RelayError):
        relay.dial("127.0.0.1", child.port, SECRET, "another-placement")


def test_replayed_handshake_is_refused(child):
    """An eavesdropper saw one whole handshake; replaying its proof on a new connection fails
    (the relay sends a fresh nonce each time)."""
    first = connect(child)
    nonce = greeting(first)[len(relay.MAGIC):]
    captured = relay.proof(SECRET, nonce, child.placement_id)
    first.sendall(captured)
    assert relay.recv_exactly(first, 1) == relay.OK
    first.close()
    second = connect(child)
    assert greeting(second)[len(relay.MAGIC):] != nonce
    second.sendall(captured)
    assert closed_without_rpc(second)


def test_silent_client_is_dropped(child):
    """A client that never proves itself is closed after the handshake timeout, and the
    server still serves the next one."""
    sock = connect(child)
    greeting(sock)
    sock.settimeout(relay.HANDSHAKE_TIMEOUT * 6)
    assert sock.recv(1) == b""
    sock.close()
    good = relay.dial("127.0.0.1", child.port, SECRET, child.placement_id)
    assert len(rpc_hello(good)) == ANSWER
    good.close()


def test_rpc_server_listens_on_loopback_only(child):
    """The ggml server's own port answers on 127.0.0.1 and nowhere else."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    listening = [row[1] for row in rows if row[3] == "0A"]          # local address, LISTEN
    port = f"{child.upstream_port:04X}"
    bound = [address for address in listening if address.endswith(":" + port)]
    assert bound == ["0100007F:" + port]                            # 127.0.0.1 only
