"""A closed-loop streaming load generator for OpenAI-compatible servers.

C clients each send a streaming /v1/completions request, read it to the end, and send
the next, until the time is up. Every request asks for the same number of tokens with
the end of generation suppressed, so each server does the same work. The client is
raw asyncio sockets with its own chunked and SSE decoding: nothing heavier than the
servers under test sits in the measurement.
"""
from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import orjson


@dataclass
class RequestResult:
    ttft: float | None = None                  # seconds to the first token
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    complete: bool = False
    start: float = 0.0                         # perf_counter() at the request's send
    last: float = 0.0                          # perf_counter() at the token before

    def token(self) -> None:
        """One token arrived now: the first sets ttft, each later one a gap."""
        now = time.perf_counter()
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.tokens += 1


@dataclass
class LoadResult:
    clients: int
    seconds: float
    requests: list[RequestResult]

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    def ttft(self, q: float) -> float:
        return _quantile([r.ttft for r in self.requests if r.ttft is not None], q)

    def itl(self, q: float) -> float:
        return _quantile([g for r in self.requests for g in r.gaps], q)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def _request_bytes(port: int, body: dict, key: str | None) -> bytes:
    payload = orjson.dumps(body)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            f"Connection: close\r\n\r\n").encode() + payload


async def _body_chunks(reader: asyncio.StreamReader, headers: bytes):
    if b"transfer-encoding: chunked" in headers.lower():
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        while data := await reader.read(65536):
            yield data


async def one_request(port: int, body: dict, key: str | None, deadline: float) -> RequestResult:
    result = RequestResult()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    result.start = time.perf_counter()
    try:
        writer.write(_request_bytes(port, body, key))
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise RuntimeError(f"server answered {head.splitlines()[0]!r}: {await reader.read(2000)!r}")
        pending = b""
        async for data in _body_chunks(reader, head):
            pending += data
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        result.complete = True
                        continue
                    choices = orjson.loads(payload).get("choices") or []
                    if choices and choices[0].get("text"):
                        result.token()
                    if choices and choices[0].get("finish_reason"):
                        result.complete = True
            if time.perf_counter() > deadline:
                break
    finally:
        writer.close()
    return result


async def run(port: int, body: dict, clients: int, seconds: float, key: str | None = None) -> LoadResult:
    started = time.perf_counter()
    deadline = started + seconds
    results: list[RequestResult] = []

    async def client():
        while time.perf_counter() < deadline:
            results.append(await one_request(port, body, key, deadline))

    await asyncio.gather(*(client() for _ in range(clients)))
    return LoadResult(clients, time.perf_counter() - started, results)


def post_json(port: int, path: str, key: str, body: dict) -> int:
    """One blocking JSON POST; its status (for benches that drive load beside the measurement)."""
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, orjson.dumps(body), {"Authorization": f"Bearer {key}",
                                                    "Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status
