"""The mesh: one TCP link between every two engine workers of a tensor-parallel placement, and
the all-reduce over it.

Node i listens (`listen`), dials every node of a lower index and accepts every node of a higher
one; each link proves the cluster secret both ways first (frames.py). Links are persistent (one
handshake per placement, not per step) and tuned for small messages: TCP_NODELAY (no Nagle
delay on a 2 KiB frame) and TCP_USER_TIMEOUT (a peer that stops acknowledging is a dead link).

`allreduce(step, partial)`: send this node's partial sum to every peer, receive every peer's,
then add them in node order (node 0's + node 1's + ...), the same additions in the same order
on every node, so every node holds bit-identical sums whatever order the frames came in. It
has a deadline: a peer that sends nothing (frozen, its link cut) fails the exchange when it
passes, never a wait forever. A frame that is not what was awaited (frames.check_header,
check_tag), a peer that closes, or one past the deadline closes that peer's link only: the
exchange's I/O with the other peers is finished first, so their links stay in step, then
ExchangeError names the peers lost. What the placement does then (node loss: end the streams
with 503, place the model again) is its caller's.
"""
from __future__ import annotations

import hmac
import os
import select
import socket
import threading
import time

import numpy as np

from ...system.relay import close_quietly, recv_exactly, tune
from . import frames
from .frames import FrameError

CONNECT_TIMEOUT = 10.0        # seconds for the whole mesh to form (every dial, every handshake)
HANDSHAKE_TIMEOUT = 5.0       # a connection that has not proven itself by then is dropped
EXCHANGE_DEADLINE = 2.0       # seconds one all-reduce may take, by default


class ExchangeError(ConnectionError):
    """An exchange failed; `lost` names the peers whose links it closed."""

    def __init__(self, message: str, lost: set[int]):
        super().__init__(message)
        self.lost = lost


def listen(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    return sock


class Link:
    """One peer: its socket, the session key, and the buffers of the exchange in progress."""

    __slots__ = ("peer", "sock", "key", "inbox", "filled", "outbox", "sent")

    def __init__(self, peer: int, sock: socket.socket, key: bytes):
        self.peer, self.sock, self.key = peer, sock, key
        self.inbox = bytearray()
        self.filled = 0
        self.outbox = memoryview(b"")
        self.sent = 0


class Mesh:
    """This node's links to its peers; `addresses[i]` is node i's (host, port)."""

    def __init__(self, index: int, addresses: list[tuple[str, int]], secret: bytes, mesh_id: str,
                 listener: socket.socket | None = None, deadline: float = EXCHANGE_DEADLINE,
                 spin_us: float = 0.0):
        if not 0 <= index < len(addresses) or len(addresses) > 1 << 15:
            raise ValueError("a node's index is its place among the mesh's addresses")
        self.index, self.addresses, self.n = index, addresses, len(addresses)
        self.secret, self.mesh_id = secret, mesh_id.encode()
        self.listener = listener
        self.deadline = deadline
        self.spin_us = spin_us                # try the sockets this long before sleeping in poll
        self.links: dict[int, Link] = {}
        self.lost: set[int] = set()
        self.refused = 0                      # connections that did not prove the secret
        self.exchanges = 0
        self.bytes_sent = 0
        self._adding = threading.Lock()

    # ---- forming the mesh ----------------------------------------------------------------------

    def connect(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Dial the lower nodes, accept the higher ones; ExchangeError if some peer is missing
        when `timeout` passes."""
        until = time.monotonic() + timeout
        accepting = None
        if self.index < self.n - 1:
            if self.listener is None:
                raise ValueError("a node with higher peers needs its listener")
            accepting = threading.Thread(target=self._accept_until, args=(until,), daemon=True)
            accepting.start()
        for peer in range(self.index):
            while peer not in self.links:
                try:
                    self._dial(peer, until)
                except (OSError, FrameError) as exc:
                    if time.monotonic() >= until:
                        raise ExchangeError(f"node {peer} could not be reached: {exc}", {peer}) from None
                    time.sleep(0.05)           # not listening yet: try again
        if accepting is not None:
            accepting.join(max(0.0, until - time.monotonic()) + 1.0)
        missing = set(range(self.n)) - set(self.links) - {self.index}
        if missing:
            raise ExchangeError(f"the mesh formed without nodes {sorted(missing)}", missing)

    def _dial(self, peer: int, until: float) -> None:
        sock = socket.create_connection(self.addresses[peer], timeout=max(0.1, min(HANDSHAKE_TIMEOUT,
                                                                                  until - time.monotonic())))
        try:
            hello = recv_exactly(sock, len(frames.HELLO) + frames.NONCE_BYTES, FrameError)
            if not hello.startswith(frames.HELLO):
                raise FrameError("the peer's greeting is not the exchange's")
            nonce_a, nonce_d = hello[len(frames.HELLO):], os.urandom(frames.NONCE_BYTES)
            ctx = frames.context(self.mesh_id, nonce_a, nonce_d, self.index, peer)
            sock.sendall(frames.PROOF.pack(self.index) + nonce_d + frames.mac(self.secret, frames.DIAL, ctx))
            answer = recv_exactly(sock, frames.MAC_BYTES, FrameError)
            if not hmac.compare_digest(answer, frames.mac(self.secret, frames.ACCEPT, ctx)):
                raise FrameError(f"node {peer} does not hold the cluster secret")
        except BaseException:
            sock.close()
            raise
        self._add(peer, sock, frames.session_key(self.secret, ctx))

    def _accept_until(self, until: float) -> None:
        wanted = set(range(self.index + 1, self.n))
        while not wanted <= set(self.links) and time.monotonic() < until:
            self.listener.settimeout(max(0.05, min(0.5, until - time.monotonic())))
            try:
                sock, _ = self.listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            # each greeting in a thread of its own: a peer that connects and says nothing holds
            # up no one else
            threading.Thread(target=self._greet, args=(sock, wanted), daemon=True).start()

    def _greet(self, sock: socket.socket, wanted: set[int]) -> None:
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            nonce_a = os.urandom(frames.NONCE_BYTES)
            sock.sendall(frames.HELLO + nonce_a)
            proof = recv_exactly(sock, frames.PROOF_BYTES, FrameError)
            (peer,) = frames.PROOF.unpack_from(proof)
            nonce_d = proof[frames.PROOF.size:frames.PROOF.size + frames.NONCE_BYTES]
            ctx = frames.context(self.mesh_id, nonce_a, nonce_d, peer, self.index)
            if peer not in wanted or \
                    not hmac.compare_digest(proof[-frames.MAC_BYTES:], frames.mac(self.secret, frames.DIAL, ctx)):
                raise FrameError("a connection that does not prove the cluster secret")
            with self._adding:
                if peer in self.links:
                    raise FrameError(f"node {peer} is linked already")
                sock.sendall(frames.mac(self.secret, frames.ACCEPT, ctx))
                self._add(peer, sock, frames.session_key(self.secret, ctx))
        except (OSError, FrameError):
            self.refused += 1
            sock.close()

    def _add(self, peer: int, sock: socket.socket, key: bytes) -> None:
        tune(sock)
        sock.setblocking(False)
        self.links[peer] = Link(peer, sock, key)

    # ---- the all-reduce ----------------------------------------------------------------------------

    def allreduce(self, step: int, partial: np.ndarray, deadline: float | None = None) -> np.ndarray:
        """The sum over the nodes, in node order, of every node's `partial` (the same shape
        everywhere: a token's vector or a batch's rows) for exchange number `step` (each step
        once, counting up). Partials travel and add as float64, as the kernels' exchange does
        (kernels/src/tp.h: one node's sums up to double rounding); the sum is float64."""
        if self.lost:
            raise ExchangeError(f"the mesh lost nodes {sorted(self.lost)}", set(self.lost))
        mine = np.ascontiguousarray(partial, dtype=np.float64)
        payload = mine.data.cast("B")
        length = payload.nbytes
        size = frames.HEADER_BYTES + length + frames.TAG_BYTES
        for link in self.links.values():
            link.outbox = memoryview(frames.encode(link.key, self.index, step, payload))
            link.sent = 0
            if len(link.inbox) != size:
                link.inbox = bytearray(size)
            link.filled = 0
        failed = self._run(step, length, size, time.monotonic() + (deadline or self.deadline))
        if failed:
            for peer, why in failed.items():
                self._drop(peer)
            raise ExchangeError("exchange %d failed: %s" % (step, "; ".join(
                f"node {peer}: {why}" for peer, why in sorted(failed.items()))), set(failed))
        self.exchanges += 1
        self.bytes_sent += size * len(self.links)
        total = None
        for node in range(self.n):             # node order, on every node alike
            part = mine if node == self.index else np.frombuffer(
                self.links[node].inbox, dtype=np.float64, count=mine.size,
                offset=frames.HEADER_BYTES).reshape(mine.shape)
            if total is None:
                total = part.copy()
            else:
                total += part
        return total

    def _run(self, step: int, length: int, size: int, until: float) -> dict[int, str]:
        """Send and receive until every live link is done or failed, or the deadline passes."""
        failed: dict[int, str] = {}
        spin_until = time.perf_counter() + self.spin_us / 1e6 if self.spin_us else 0.0
        sending = {link.sock.fileno(): link for link in self.links.values()}
        receiving = dict(sending)
        poller = select.poll()
        while sending or receiving:
            progressed = False
            for fd, link in list(sending.items()):
                try:
                    link.sent += link.sock.send(link.outbox[link.sent:])
                except BlockingIOError:
                    continue
                except OSError as exc:
                    failed[link.peer] = f"send: {exc}"
                    sending.pop(fd), receiving.pop(fd, None)
                    continue
                progressed = True
                if link.sent == len(link.outbox):
                    sending.pop(fd)
            for fd, link in list(receiving.items()):
                try:
                    n = link.sock.recv_into(memoryview(link.inbox)[link.filled:])
                except BlockingIOError:
                    continue
                except OSError as exc:
                    n, why = -1, f"receive: {exc}"
                else:
                    why = "the link closed"
                try:
                    if n <= 0:
                        raise FrameError(why)
                    before, link.filled = link.filled, link.filled + n
                    if before < frames.HEADER_BYTES <= link.filled:
                        frames.check_header(link.inbox, link.peer, step, length)
                    if link.filled == size:
                        frames.check_tag(link.key, link.inbox)
                        receiving.pop(fd)
                except FrameError as exc:
                    failed[link.peer] = str(exc)
                    receiving.pop(fd), sending.pop(fd, None)
                progressed = True
            if progressed or not (sending or receiving):
                continue
            if spin_until and time.perf_counter() < spin_until:
                continue                       # spinning: try the sockets again at once
            left = until - time.monotonic()
            if left <= 0:
                for link in {**sending, **receiving}.values():
                    failed[link.peer] = "no frame before the exchange's deadline"
                return failed
            poller = select.poll()
            for fd in receiving:
                poller.register(fd, select.POLLIN)
            for fd in sending:
                poller.register(fd, select.POLLOUT | (select.POLLIN if fd in receiving else 0))
            poller.poll(left * 1000)
        return failed

    def _drop(self, peer: int) -> None:
        link = self.links.pop(peer, None)
        self.lost.add(peer)
        if link is not None:
            close_quietly(link.sock)

    def close(self) -> None:
        for peer in list(self.links):
            close_quietly(self.links.pop(peer).sock)
        if self.listener is not None:
            close_quietly(self.listener)
