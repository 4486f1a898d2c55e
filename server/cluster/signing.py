"""Node-to-node requests are signed with the cluster secret (HMAC-SHA256).

What is signed, one field a line: the method, the path (with its query, if any), the SHA-256 of
the body, the sender's timestamp (milliseconds since the epoch), a random nonce and the
sender's node id. A request is accepted when its signature matches, its timestamp lies within
REPLAY_WINDOW seconds of the receiver's clock (either side: the nodes' clocks must agree within
that), and its nonce was not seen before within that window (`ReplayCache`): a captured request
is worthless a few seconds later and cannot be sent twice even within them.

Answers are signed too (`sign_answer`), over the request's nonce, the status and the body's
digest, so that a node on the path cannot forge what the leader tells a follower.

The secret never leaves this module's callers: it is not logged and not in any answer.
"""
from __future__ import annotations

import hashlib
import heapq
import hmac
import secrets
import time

REPLAY_WINDOW = 5.0                 # seconds either side of the receiver's clock
MAX_REMEMBERED = 200_000            # nonces kept at most (a node heartbeats once a second)

NODE = "x-stackd-node"
TIMESTAMP = "x-stackd-timestamp"
NONCE = "x-stackd-nonce"
SIGNATURE = "x-stackd-signature"
HEADERS = (NODE, TIMESTAMP, NONCE, SIGNATURE)
_NONCE_CHARS = frozenset("0123456789abcdef")


class SignatureError(Exception):
    """Why a signed request is refused; the message is safe to send back."""


def _mac(secret: bytes, *fields: str) -> str:
    return hmac.new(secret, "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def _digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign(secret: bytes, method: str, path: str, body: bytes, now: float | None = None,
         node_id: str = "") -> dict[str, str]:
    """The headers that authenticate one request."""
    stamp = str(int((time.time() if now is None else now) * 1000))
    nonce = secrets.token_hex(16)
    return {NODE: node_id, TIMESTAMP: stamp, NONCE: nonce,
            SIGNATURE: _mac(secret, method, path, _digest(body), stamp, nonce, node_id)}


def _header(headers, name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        value = headers.get(name.encode())
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value


def verify(secret: bytes, method: str, path: str, body: bytes, headers, now: float | None = None) -> dict:
    """Checks one request's signature and timestamp; raises SignatureError. `headers` maps
    lower-case names (bytes or str) to values. Returns the signed fields (node, timestamp,
    nonce) for the replay check."""
    fields = {name: _header(headers, name) for name in HEADERS}
    if fields[SIGNATURE] is None or fields[TIMESTAMP] is None or fields[NONCE] is None:
        raise SignatureError("missing cluster signature: internal routes take only requests "
                             "signed with the cluster secret")
    stamp, nonce, node_id = fields[TIMESTAMP], fields[NONCE], fields[NODE] or ""
    if not stamp.isdigit() or len(stamp) > 16 or not 16 <= len(nonce) <= 64 or not set(nonce) <= _NONCE_CHARS:
        raise SignatureError("malformed cluster signature headers")
    expected = _mac(secret, method, path, _digest(body), stamp, nonce, node_id)
    if not hmac.compare_digest(expected, fields[SIGNATURE]):
        raise SignatureError("bad cluster signature")
    skew = int(stamp) / 1000 - (time.time() if now is None else now)
    if abs(skew) > REPLAY_WINDOW:
        raise SignatureError(f"stale cluster signature: its timestamp is {skew:+.1f} s from this "
                             f"node's clock (the window is {REPLAY_WINDOW:g} s)")
    return {"node": node_id, "timestamp": int(stamp) / 1000, "nonce": nonce}


class ReplayCache:
    """Nonces of accepted requests, each kept until its timestamp leaves the window."""

    def __init__(self, window: float = REPLAY_WINDOW, limit: int = MAX_REMEMBERED):
        self.window = window
        self.limit = limit
        self._seen: set[str] = set()
        self._expiry: list[tuple[float, str]] = []

    def admit(self, nonce: str, timestamp: float, now: float | None = None) -> None:
        now = time.time() if now is None else now
        while self._expiry and self._expiry[0][0] < now:
            self._seen.discard(heapq.heappop(self._expiry)[1])
        if nonce in self._seen:
            raise SignatureError("replayed request: this signature's nonce was used already")
        if len(self._seen) >= self.limit:
            raise SignatureError("too many signed requests within the replay window")
        self._seen.add(nonce)
        heapq.heappush(self._expiry, (timestamp + self.window, nonce))


def sign_answer(secret: bytes, nonce: str, status: int, body: bytes) -> str:
    return _mac(secret, "answer", nonce, str(status), _digest(body))


def verify_answer(secret: bytes, nonce: str, status: int, body: bytes, signature: str | None) -> bool:
    return signature is not None and hmac.compare_digest(sign_answer(secret, nonce, status, body), signature)
