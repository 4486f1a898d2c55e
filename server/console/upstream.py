"""The console's client of a device's node API: one pooled httpx2 client, the device's key.

Short calls (topology, models, health) are bounded by `console.upstream_timeout`; an
inference stream only bounds the connection and is otherwise as long as the node lets it
be. A device that does not answer is a 503 in the spec's shape, never a hang.
"""
from __future__ import annotations

import socket
import struct

import httpx2 as httpx

from ..http.response import Response, StreamingResponse
from .errors import Code, Refused

PASSED_HEADERS = ("retry-after", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")


def _headers_of(response) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((name.encode(), response.headers[name].encode())
                 for name in PASSED_HEADERS if name in response.headers)


def _content_type(response) -> bytes:
    return response.headers.get("content-type", "application/json").encode()


class Upstream:
    def __init__(self, timeout: float):
        self.timeout = timeout
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False)

    async def close(self) -> None:
        await self.client.aclose()

    async def get(self, url: str, key: str, what: str) -> Response:
        """GET a JSON resource and pass its answer through, status and body as they are."""
        try:
            response = await self.client.get(url, headers={"authorization": f"Bearer {key}"})
        except httpx.HTTPError as exc:
            raise Refused(Code.UNAVAILABLE, f"{what} did not answer within "
                          f"{self.timeout:g} s ({type(exc).__name__})") from None
        return Response(response.status_code, response.content, _content_type(response),
                        _headers_of(response))

    async def read(self, url: str, key: str, timeout: float) -> bytes:
        """GET a resource for the dashboard's sampler: its body when the answer is 200; a
        refusal (UNAVAILABLE) saying why otherwise, within `timeout` whatever the device does."""
        try:
            response = await self.client.get(url, headers={"authorization": f"Bearer {key}"},
                                             timeout=httpx.Timeout(timeout))
        except httpx.HTTPError as exc:
            raise Refused(Code.UNAVAILABLE, f"no answer within {timeout:g} s "
                          f"({type(exc).__name__})") from None
        if response.status_code != 200:
            raise Refused(Code.UNAVAILABLE, f"HTTP {response.status_code}")
        return response.content

    async def healthy(self, cluster_url: str, key: str) -> bool:
        try:
            response = await self.client.get(cluster_url + "/v1/health",
                                             headers={"authorization": f"Bearer {key}"})
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def chat(self, inference_url: str, key: str, body: bytes, what: str):
        """POST /v1/chat/completions. A stream is passed through chunk by chunk as it arrives;
        when the client goes, closing the stream closes the upstream connection, which is how
        the node learns to cancel the request."""
        request = self.client.build_request(
            "POST", inference_url + "/v1/chat/completions", content=body,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=httpx.Timeout(None, connect=self.timeout))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise Refused(Code.UNAVAILABLE, f"{what} did not answer ({type(exc).__name__})") from None
        content_type = _content_type(response)
        if not content_type.startswith(b"text/event-stream"):
            try:
                data = await response.aread()
            finally:
                await response.aclose()
            return Response(response.status_code, data, content_type, _headers_of(response))
        return StreamingResponse(_Relay(response), content_type, response.status_code,
                                 _headers_of(response))


class _Relay:
    """The device's stream as the protocol's chunk source. `aclose` always closes the device
    connection, even when the stream was never iterated (an async generator that never
    started would skip its `finally`)."""

    def __init__(self, response):
        _reset_on_close(response)
        self.response = response
        self.pieces = response.aiter_raw()

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.pieces.__anext__()
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        await self.response.aclose()


def _reset_on_close(response) -> None:
    """Make closing this device connection a reset rather than a FIN. When our client goes
    mid-stream the connection is closed unfinished; a FIN reads as a half-close, which an HTTP
    server may answer to the end, while a reset tells the device at once that nobody is
    listening, so it cancels the request instead of generating for no one."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
