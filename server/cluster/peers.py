"""The signed client for node-to-node calls (routes under /internal/v1/ of a peer's cluster port).

Every call has a deadline (`timeout`, the whole exchange: connect, send, answer) and runs on
the loop without blocking it: a peer that is frozen, partitioned away or gone costs the caller
at most that long, never the daemon. Answers must carry the peer's signature over this
request's nonce: anything else, whatever its status, is a PeerError.
"""
from __future__ import annotations

import asyncio

import orjson

from ..system.imports import lazy_import
from . import signing

httpx = lazy_import("httpx2")  # loaded by a node with peers, not by a single node's start

DEFAULT_TIMEOUT = 2.0               # seconds for one whole call


class PeerError(Exception):
    """A call that did not succeed: refused (`status` and the peer's error `payload`), timed
    out or could not connect (`status` 0, `payload` None)."""

    def __init__(self, message: str, status: int = 0, payload: dict | None = None):
        super().__init__(message)
        self.status = status
        self.payload = payload


class PeerClient:
    def __init__(self, secret: bytes, self_id: str, timeout: float = DEFAULT_TIMEOUT):
        self.secret = secret
        self.self_id = self_id
        self.timeout = timeout
        # One pool for every peer: keep-alive connections, no proxies from the environment.
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False,
                                       limits=httpx.Limits(max_keepalive_connections=16))

    async def call(self, address: str, method: str, path: str, body: dict | None = None,
                   timeout: float | None = None) -> dict:
        """A signed request to `address` (a node's cluster URL); the answer's JSON object."""
        if not path.startswith("/internal/v1/"):
            raise ValueError(f"not an internal route: {path}")
        payload = orjson.dumps(body) if body is not None else b""
        headers = signing.sign(self.secret, method, path, payload, node_id=self.self_id)
        if body is not None:
            headers["content-type"] = "application/json"
        deadline = timeout or self.timeout
        try:
            response = await asyncio.wait_for(
                self._http.request(method, address.rstrip("/") + path, content=payload, headers=headers,
                                   timeout=httpx.Timeout(deadline)),
                deadline)
        except (asyncio.TimeoutError, httpx.TimeoutException):
            raise PeerError(f"{method} {path} on {address}: no answer within {deadline:g} s") from None
        except httpx.HTTPError as exc:
            raise PeerError(f"{method} {path} on {address}: {type(exc).__name__}: {exc}") from None
        return self._answer(address, path, headers[signing.NONCE], response)

    def _answer(self, address: str, path: str, nonce: str, response) -> dict:
        content, status = response.content, response.status_code
        try:
            parsed = orjson.loads(content) if content else {}
        except orjson.JSONDecodeError:
            parsed = None
        if status >= 400:                 # reported, never acted upon: no signature needed
            error = parsed.get("error") if isinstance(parsed, dict) else None
            message = error.get("message") if isinstance(error, dict) else None
            raise PeerError(f"{path} on {address}: {status} {message or ''}".rstrip(), status,
                            parsed if isinstance(parsed, dict) else None)
        if not signing.verify_answer(self.secret, nonce, status, content,
                                     response.headers.get(signing.SIGNATURE)):
            raise PeerError(f"{path} on {address}: the answer is not signed with the cluster "
                            "secret: not a node of this cluster", status)
        if not isinstance(parsed, dict):
            raise PeerError(f"{path} on {address}: the answer is not a JSON object", status)
        return parsed

    async def aclose(self) -> None:
        await self._http.aclose()
