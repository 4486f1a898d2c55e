"""A fake transport and a test app for protocol tests: raw bytes in, raw bytes out, no sockets."""
from __future__ import annotations

import asyncio

import httptools

from stackd.http.access_log import AccessLog
from stackd.http.errors import ApiError, ErrorKind
from stackd.http.limits import Limits
from stackd.http.response import Response, StreamingResponse, json_response
from stackd.http.routing import App, Endpoint
from stackd.http.server import HttpServer
from stackd.observe.metrics import Metrics


class FakeTransport(asyncio.Transport):
    def __init__(self, protocol=None):
        super().__init__()
        self.protocol = protocol
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.high = 64 * 1024
        self.paused_writing = False
        self.flow_control = False     # True: behave like a socket the client does not read
        self.n_pause_reading = 0

    # asyncio.Transport API used by the protocol
    def write(self, data) -> None:
        assert not self.closed, "write after close"
        self.written += data
        if self.flow_control and not self.paused_writing and len(self.written) > self.high:
            self.paused_writing = True
            self.protocol.pause_writing()

    def client_reads(self) -> bytes:
        """The client takes everything unsent: the buffer drains below the low-water mark."""
        data = self.take()
        if self.paused_writing:
            self.paused_writing = False
            self.protocol.resume_writing()
        return data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.protocol is not None:
                asyncio.get_event_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False
        self.n_pause_reading += 1

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        self.high = high

    def get_extra_info(self, name, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def take(self) -> bytes:
        data = bytes(self.written)
        self.written.clear()
        return data


def parse_responses(data: bytes) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """Split raw bytes into (status, headers, body) triples with httptools."""
    responses = []

    class Sink:
        def on_message_begin(self):
            self.headers, self.body = {}, b""

        def on_header(self, name, value):
            self.headers[name.lower()] = value

        def on_body(self, body):
            self.body += body

        def on_message_complete(self):
            responses.append((parser.get_status_code(), self.headers, self.body))

    sink = Sink()
    parser = httptools.HttpResponseParser(sink)
    parser.feed_data(data)
    return responses


# ---- a small app exercising every kind of handler ----------------------------------------------

def _echo(ctx, request) -> Response:
    return json_response({"path": request.path, "query": request.query,
                          "body_len": len(request.body), "params": request.params})


async def _slow(ctx, request) -> Response:
    await asyncio.sleep(int(request.query.partition("=")[2] or 10) / 1000)
    return json_response({"slow": True})


def _fail(ctx, request):
    raise RuntimeError("secret internals")


def _refuse(ctx, request):
    raise ApiError(ErrorKind.PERMISSION, "no")


def _json(ctx, request) -> Response:
    return json_response(request.json())


async def _stream_chunks(n: int, size: int):
    for i in range(n):
        yield (b"%d" % i).ljust(size, b".")
        await asyncio.sleep(0)


def _stream(ctx, request) -> StreamingResponse:
    n = int(request.query.partition("=")[2] or 3)
    return StreamingResponse(_stream_chunks(n, 1000), b"text/event-stream")


ROUTES = {
    ("GET", "/echo"): Endpoint(_echo, None),
    ("POST", "/echo"): Endpoint(_echo, None),
    ("POST", "/small"): Endpoint(_echo, None, max_body=10),
    ("GET", "/slow"): Endpoint(_slow, None),
    ("POST", "/generate"): Endpoint(_slow, None, ends_with_client=True),   # a model's work
    ("GET", "/fail"): Endpoint(_fail, None),
    ("GET", "/refuse"): Endpoint(_refuse, None),
    ("POST", "/json"): Endpoint(_json, None),
    ("GET", "/stream"): Endpoint(_stream, None),
    ("GET", "/items/:id"): Endpoint(_echo, None),
}


def make_server(loop, **limits) -> tuple[HttpServer, App]:
    server = HttpServer(loop, Limits(**limits), Metrics(), AccessLog(enabled=False))
    app = App("test", [ROUTES], ctx=None, guard=None, max_body=server.limits.max_body_bytes)
    return server, app


def connect(server, app, protocol_class):
    protocol = protocol_class(app, server)
    transport = FakeTransport(protocol)
    protocol.connection_made(transport)
    return protocol, transport
