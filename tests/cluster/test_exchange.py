"""The tensor split's exchange (server/engine/exchange/): a mesh of real loopback sockets
between nodes (threads of this process, each with its own sockets), the all-reduce's sums, the
secret at both ends of the handshake, and what a bad frame, a silent peer and a closed one do."""
from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest

from stackd.engine.exchange import ExchangeError, Mesh, frames, listen

SECRET = os.urandom(32)
HIDDEN = 576                           # SmolLM2's hidden size: one token's partial sum


def mesh_of(n: int, mesh_id: str = "placement-1", secret: bytes = SECRET, **kwargs) -> list[Mesh]:
    listeners = [listen() for _ in range(n)]
    meshes = [Mesh(i, [sock.getsockname() for sock in listeners], secret, mesh_id, listeners[i], **kwargs)
              for i in range(n)]
    each(meshes, lambda m: m.connect())
    return meshes


def each(meshes, fn) -> list:
    """fn(mesh) on every node at once (a thread each); their results, or the exceptions."""
    out = [None] * len(meshes)

    def run(i):
        try:
            out[i] = fn(meshes[i])
        except Exception as exc:       # noqa: BLE001 - the test looks at what each node raised
            out[i] = exc
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(meshes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "an exchange waited past its deadline"
    return out


@pytest.fixture
def closing():
    opened = []
    yield opened.append
    for thing in opened:
        for mesh in thing if isinstance(thing, list) else [thing]:
            mesh.close()


# ---- the sums ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3])
def test_every_node_holds_the_same_sum_bit_for_bit_added_in_node_order(closing, n):
    meshes = mesh_of(n)
    closing(meshes)
    rng = np.random.default_rng(n)
    for step in range(20):
        shape = (HIDDEN,) if step % 2 else (1 + step % 5, HIDDEN)        # a token, or a batch's rows
        parts = [(rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4)).astype(np.float32) for _ in range(n)]
        sums = each(meshes, lambda m: m.allreduce(step, parts[m.index]))
        want = parts[0].astype(np.float64)                                # partials add as float64
        for p in parts[1:]:
            want += p
        for got in sums:
            assert isinstance(got, np.ndarray) and got.shape == shape and got.tobytes() == want.tobytes()
    assert all(m.exchanges == 20 and not m.lost for m in meshes)


def test_vectors_larger_than_the_sockets_buffers_cross_without_a_deadlock(closing):
    meshes = mesh_of(3)
    closing(meshes)
    parts = [np.full(1 << 20, i + 1, dtype=np.float32) for i in range(3)]     # 4 MiB each way
    for got in each(meshes, lambda m: m.allreduce(0, parts[m.index], deadline=60)):
        assert isinstance(got, np.ndarray) and np.all(got == 6.0)


# ---- the secret ---------------------------------------------------------------------------------

def test_a_peer_without_the_secret_gets_nothing_and_the_mesh_forms_all_the_same(closing):
    listeners = [listen(), listen()]
    addresses = [sock.getsockname() for sock in listeners]
    node0 = Mesh(0, addresses, SECRET, "p", listeners[0])
    closing(node0)
    forming = threading.Thread(target=node0.connect)
    forming.start()
    intruder = socket.create_connection(addresses[0], timeout=30)
    greeting = intruder.recv(len(frames.HELLO) + frames.NONCE_BYTES, socket.MSG_WAITALL)
    assert greeting.startswith(frames.HELLO)
    intruder.sendall(frames.PROOF.pack(1) + os.urandom(frames.NONCE_BYTES) + os.urandom(frames.MAC_BYTES))
    assert intruder.recv(4096) == b""                  # closed, without a word more
    intruder.close()
    node1 = Mesh(1, addresses, SECRET, "p", listeners[1])
    closing(node1)
    node1.connect()
    forming.join(30)
    assert sorted(node0.links) == [1] and node0.refused == 1
    sums = each([node0, node1], lambda m: m.allreduce(0, np.ones(HIDDEN, dtype=np.float32)))
    assert all(np.all(s == 2.0) for s in sums)


def test_another_secret_or_another_placement_forms_no_link(closing):
    for secret, mesh_id in ((os.urandom(32), "p"), (SECRET, "another placement")):
        listeners = [listen(), listen()]
        addresses = [sock.getsockname() for sock in listeners]
        node0 = Mesh(0, addresses, SECRET, "p", listeners[0])
        node1 = Mesh(1, addresses, secret, mesh_id, listeners[1])
        closing([node0, node1])
        results = each([node0, node1], lambda m: m.connect(timeout=1.0))
        assert all(isinstance(r, ExchangeError) for r in results)
        deadline = time.monotonic() + 30                # a refusal is counted in its greeting's thread
        while not node0.refused and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not node0.links and not node1.links and node0.refused >= 1


def test_a_dialer_refuses_a_listener_that_cannot_prove_the_secret(closing):
    fake = listen()
    seen = []

    def impostor():
        conn, _ = fake.accept()
        conn.sendall(frames.HELLO + os.urandom(frames.NONCE_BYTES))
        seen.append(conn.recv(frames.PROOF_BYTES, socket.MSG_WAITALL))
        conn.sendall(os.urandom(frames.MAC_BYTES))      # a proof it cannot make
        conn.settimeout(30)
        seen.append(conn.recv(4096))                   # what the dialer sends next: nothing
        conn.close()
    thread = threading.Thread(target=impostor)
    thread.start()
    node1 = Mesh(1, [fake.getsockname(), ("127.0.0.1", 1)], SECRET, "p")
    closing(node1)
    with pytest.raises(ExchangeError):
        node1.connect(timeout=1.0)
    thread.join(30)
    fake.close()
    assert len(seen[0]) == frames.PROOF_BYTES and seen[1] == b""


# ---- bad frames, silence, a closed peer ---------------------------------------------------------

def dial_as(address, index: int, acceptor: int, mesh_id: bytes = b"p") -> tuple[socket.socket, bytes]:
    """A peer that holds the secret (and may then misbehave): the dialer's handshake by hand."""
    sock = socket.create_connection(address, timeout=30)
    nonce_a = sock.recv(len(frames.HELLO) + frames.NONCE_BYTES, socket.MSG_WAITALL)[len(frames.HELLO):]
    nonce_d = os.urandom(frames.NONCE_BYTES)
    ctx = frames.context(mesh_id, nonce_a, nonce_d, index, acceptor)
    sock.sendall(frames.PROOF.pack(index) + nonce_d + frames.mac(SECRET, frames.DIAL, ctx))
    assert sock.recv(frames.MAC_BYTES, socket.MSG_WAITALL) == frames.mac(SECRET, frames.ACCEPT, ctx)
    return sock, frames.session_key(SECRET, ctx)


def good(key: bytes, sender: int, step: int) -> bytes:
    return frames.encode(key, sender, step, np.ones(HIDDEN).tobytes())


def bad_frames():
    payload = np.ones(HIDDEN).tobytes()
    return {
        "wrong step": lambda key: frames.encode(key, 2, 7, payload),
        "wrong length": lambda key: frames.encode(key, 2, 0, payload[:-4]),
        "wrong sender": lambda key: frames.encode(key, 1, 0, payload),
        "wrong signature": lambda key: frames.encode(os.urandom(32), 2, 0, payload),
        "flipped byte": lambda key: (lambda f: f[:100] + bytes([f[100] ^ 1]) + f[101:])(frames.encode(key, 2, 0, payload)),
        "bad magic": lambda key: b"XXXX" + frames.encode(key, 2, 0, payload)[4:],
        "cut short": lambda key: frames.encode(key, 2, 0, payload)[:50],
    }


@pytest.mark.parametrize("kind", list(bad_frames()))
def test_a_bad_frame_closes_that_link_only(closing, kind):
    """Nodes 0 and 1 real, node 2 a peer with the secret that sends node 0 a bad frame (and
    node 1 a good one): node 0's exchange fails naming node 2 alone, its link to node 2 is
    closed, its link to node 1 stays; node 1's exchange completes."""
    listeners = [listen(), listen(), listen()]
    addresses = [sock.getsockname() for sock in listeners]
    meshes = [Mesh(i, addresses, SECRET, "p", listeners[i], deadline=10.0) for i in range(2)]
    closing(meshes)
    forming = [threading.Thread(target=m.connect) for m in meshes]
    for t in forming:
        t.start()
    evil = {acceptor: dial_as(addresses[acceptor], 2, acceptor) for acceptor in (0, 1)}
    for t in forming:
        t.join(30)
    evil[0][0].sendall(bad_frames()[kind](evil[0][1]))
    evil[1][0].sendall(good(evil[1][1], 2, 0))
    results = each(meshes, lambda m: m.allreduce(0, np.ones(HIDDEN, dtype=np.float32)))
    assert isinstance(results[0], ExchangeError) and results[0].lost == {2}
    assert isinstance(results[1], np.ndarray) and np.all(results[1] == 3.0)
    assert sorted(meshes[0].links) == [1] and meshes[0].lost == {2}
    evil[0][0].settimeout(30)
    received = b""
    while chunk := evil[0][0].recv(65536):             # what node 0 sent it, then its close
        received += chunk
    assert len(received) <= frames.HEADER_BYTES + HIDDEN * 8 + frames.TAG_BYTES
    with pytest.raises(ExchangeError):                 # no sum without every node
        meshes[0].allreduce(1, np.ones(HIDDEN, dtype=np.float32))
    for sock, _ in evil.values():
        sock.close()


def test_a_silent_peer_fails_the_exchange_at_its_deadline(closing):
    meshes = mesh_of(2, deadline=0.5)
    closing(meshes)
    result = each(meshes[:1], lambda m: m.allreduce(0, np.ones(HIDDEN, dtype=np.float32)))[0]
    assert isinstance(result, ExchangeError) and result.lost == {1} and "deadline" in str(result)


def test_a_peer_that_closes_fails_the_exchange(closing):
    meshes = mesh_of(3)
    closing(meshes)
    meshes[2].close()
    results = each(meshes[:2], lambda m: m.allreduce(0, np.ones(HIDDEN, dtype=np.float32)))
    assert all(isinstance(r, ExchangeError) and r.lost == {2} for r in results)
