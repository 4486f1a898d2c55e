"""Hostile bytes: mutated requests fed in random pieces never make the protocol raise, and
whatever it writes is well-formed HTTP. Fixed seeds, so a failure reproduces."""
import asyncio
import random

import httptools
import pytest

from stackd.http.protocol import HttpProtocol

from .fake import connect, make_server

SEEDS = [
    b"GET /echo?x=1 HTTP/1.1\r\nHost: a\r\nX-Request-ID: abc\r\n\r\n",
    b"POST /json HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\": 1}",
    b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
    b"GET /items/%41%42 HTTP/1.1\r\nConnection: keep-alive\r\n\r\nGET /echo HTTP/1.1\r\n\r\n",
    b"POST /small HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nabc",
]
INSERTS = [b"\r\n", b"\x00", b":", b" ", b"\xff", b"Content-Length: 5\r\n",
           b"Transfer-Encoding: chunked\r\n", b"GET / HTTP/1.1\r\n\r\n", b"9" * 30, b"\r\n\r\n"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        at = rng.randrange(len(data) + 1)
        if choice < 0.3 and data:
            data[min(at, len(data) - 1)] = rng.randrange(256)
        elif choice < 0.6:
            data[at:at] = rng.choice(INSERTS)
        elif choice < 0.8 and data:
            del data[at:at + rng.randint(1, 8)]
        else:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(data)


def pieces(rng: random.Random, data: bytes):
    at = 0
    while at < len(data):
        n = rng.randint(1, 64)
        yield data[at:at + n]
        at += n


class Checker:
    """Accepts a stream of well-formed HTTP/1.1 responses; raises on anything else."""

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.statuses: list[int] = []

    def on_message_complete(self):
        self.statuses.append(self.parser.get_status_code())


@pytest.mark.parametrize("seed", range(8))
def test_mutated_requests_never_escape_the_protocol(loop, seed):
    rng = random.Random(seed)
    seen: set[int] = set()
    for _ in range(250):
        server, app = make_server(loop, max_body_bytes=4096)
        protocol, transport = connect(server, app, HttpProtocol)
        for piece in pieces(rng, mutate(rng, rng.choice(SEEDS))):
            protocol.data_received(piece)             # must never raise
        loop.run_until_complete(asyncio.sleep(0))
        written = transport.take().replace(b"HTTP/1.1 100 Continue\r\n\r\n", b"")
        checker = Checker()
        checker.parser.feed_data(written)             # raises if the bytes are not HTTP
        assert not any(status >= 500 for status in checker.statuses), checker.statuses
        seen.update(checker.statuses)
        protocol.connection_lost(None)
    assert 200 in seen and 400 in seen                # both the accepting and refusing paths ran
