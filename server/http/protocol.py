"""HTTP/1.1 over one asyncio.Protocol, parsed by httptools (llhttp).

`data_received` never awaits: it feeds the parser, whose callbacks build the
request and enforce the limits; a finished request is handed to the app. Sync
handlers are answered inline (no task per request); async handlers and streams
get a task. Pipelined requests queue up and are answered strictly in order,
with reading paused while any wait.

Parse-phase deadlines (head, body, keep-alive) are plain floats checked by the
server's periodic sweep, so the hot path never schedules a timer.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
from time import perf_counter

import cython
import httptools

from .errors import ApiError, ErrorKind
from .flow_control import FlowControl
from .request import Request, Session
from .response import Response, StreamingResponse, error_response
from .wire import CONTINUE, LAST_CHUNK, chunk, encode_headers, response_head, stream_head

log = logging.getLogger("stackd.http")

# Parse phases of a connection.
IDLE, HEAD, BODY = 0, 1, 2

# One read can hold thousands of tiny pipelined requests (a 256 KiB read of `GET /` lines is
# ~7,000), and requests answered at once (a 401, a health probe) never queue, so max_pipeline
# does not stop them: one callback answering them all stalled the loop for everyone (~350 ms).
# A read larger than PARSE_SLICE is parsed a slice at a time; once PARSE_BUDGET requests have
# completed in one loop callback, the rest waits for the next turn of the loop (reading paused
# meanwhile, so order is kept). Reads of ordinary size take the single-feed path as before.
# A slice holds at most ~110 minimal requests (18 bytes each), under max_pipeline's default of
# 128: a client that stops reading mid-slice is held at the slice's end, not refused.
PARSE_SLICE = 2048
PARSE_BUDGET = 64

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:+=/~-]{1,128}")


class RequestIds:
    """Random UUIDv4 request ids, cheaply.

    uuid.uuid4() costs about 2 us (a getrandom syscall and a UUID object per id). Here the
    random bytes come from one os.urandom call per 256 ids and are formatted directly; every
    id is fully random (122 bits), so ids cannot be guessed or enumerated from one another.
    """

    BATCH = 256

    def __init__(self):
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool = os.urandom(16 * self.BATCH)
            at = 0
        self._at = at + 16
        text = self._pool[at:at + 16].hex()
        variant = "89ab"[self._pool[at + 8] & 3]
        return (f"{text[:8]}-{text[8:12]}-4{text[13:16]}-{variant}{text[17:20]}-{text[20:32]}"
                .encode())


new_request_id = RequestIds().next


class _Reject(Exception):
    """Raised inside parser callbacks to stop parsing and answer with an error: of `kind`, or
    `error` itself (an ApiError, with its headers) in the error shape of its `route`."""

    def __init__(self, kind: ErrorKind, message: str, error=None, route=None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.error = error
        self.route = route              # the route it was for, when its head named one


@cython.cclass
class HttpProtocol:
    """One client connection. A Cython extension type when compiled (typed fields are C
    struct members); the same source runs uncompiled as the Python twin."""

    app = cython.declare(object, visibility="public")
    server = cython.declare(object, visibility="public")
    limits = cython.declare(object, visibility="readonly")
    loop = cython.declare(object)
    parser = cython.declare(object, visibility="readonly")
    transport = cython.declare(object, visibility="public")
    flow = cython.declare(object, visibility="readonly")
    peer = cython.declare(str, visibility="readonly")
    closed = cython.declare(cython.bint, visibility="readonly")
    peer_done = cython.declare(cython.bint, visibility="readonly")   # the client half-closed
    reading = cython.declare(cython.bint, visibility="readonly")
    # parse state
    phase = cython.declare(cython.int, visibility="readonly")
    deadline = cython.declare(cython.double, visibility="readonly")
    n_chunks = cython.declare(cython.long)
    n_completed = cython.declare(cython.long, visibility="readonly")  # requests parsed whole on this connection
    _unparsed = cython.declare(object)            # the rest of a large read, or None
    _at = cython.declare(cython.Py_ssize_t)       # where parsing of _unparsed resumes
    _parse_scheduled = cython.declare(cython.bint)
    _url = cython.declare(bytes)
    _headers = cython.declare(dict)
    _n_headers = cython.declare(cython.int)
    _header_bytes = cython.declare(cython.long)
    _head_seen = cython.declare(cython.long)
    _head_chunk = cython.declare(cython.long)
    _n_content_length = cython.declare(cython.int)
    _body = cython.declare(list)
    _body_len = cython.declare(cython.longlong)
    _max_body = cython.declare(cython.longlong)
    _max_head = cython.declare(cython.long)
    _max_headers = cython.declare(cython.int)
    _method = cython.declare(str)
    _path = cython.declare(str)
    _query = cython.declare(str)
    _route = cython.declare(object)
    _params = cython.declare(object)
    _keep_alive = cython.declare(cython.bint)
    _t_start = cython.declare(cython.double)
    # answering
    pipeline = cython.declare(object, visibility="readonly")
    busy = cython.declare(cython.bint, visibility="readonly")
    pumping = cython.declare(cython.bint)
    task = cython.declare(object, visibility="public")
    answering = cython.declare(object)            # the request being answered, or None
    session = cython.declare(object, visibility="readonly")
    counted_in = cython.declare(object)           # the app whose connection count holds this one

    def __init__(self, app, server):
        self.app = app
        self.server = server
        self.limits = server.limits
        self.loop = server.loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.flow = FlowControl(self.loop)
        self.peer = ""
        self.closed = False
        self.peer_done = False
        self.reading = True
        self.phase = IDLE
        self.deadline = 0.0
        self.n_chunks = 0
        self.n_completed = 0
        self._unparsed = None
        self._at = 0
        self._parse_scheduled = False
        self._url = b""
        self._headers = {}
        self._n_headers = 0
        self._header_bytes = 0
        self._head_seen = 0
        self._head_chunk = 0
        self._n_content_length = 0
        self._body = []
        self._body_len = 0
        self._max_body = 0
        self._max_head = self.limits.max_head_bytes
        self._max_headers = self.limits.max_headers
        self._method = ""
        self._path = ""
        self._query = ""
        self._route = None
        self._params = None
        self._keep_alive = True
        self._t_start = 0.0
        self.pipeline = collections.deque()
        self.busy = False
        self.pumping = False
        self.task = None
        self.answering = None
        self.session = Session()
        self.counted_in = None

    # ---- connection lifecycle -------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        server = self.server
        # The cap is per port (app): a flood of one port's connections never takes the other's
        # places, so the cluster port's health and heartbeats stay reachable.
        n_open = server.open_per_app.get(self.app, 0)
        if n_open >= self.limits.max_connections:
            server.metrics.connections_refused += 1
            self.closed = True
            transport.write(server.overloaded_response)
            transport.close()
            return
        server.open_per_app[self.app] = n_open + 1
        self.counted_in = self.app
        server.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            self.peer = f"{peer[0]}:{peer[1]}"
        self.phase = HEAD                # a new connection owes us a request head
        self.deadline = self.loop.time() + self.limits.head_timeout

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._unparsed = None
        self.server.connections.discard(self)
        if self.counted_in is not None:
            self.server.open_per_app[self.counted_in] -= 1
            self.counted_in = None
        self.flow.connection_lost()
        if self.task is not None:
            self.task.cancel()           # the client is gone: stop producing for it

    def eof_received(self):
        """The client half-closed. A model's work for it stops as if it had disconnected (a
        falsy return: the transport closes, connection_lost cancels): an SDK that times out
        closes its socket, which reads the same here, and uvicorn and llama-server take it the
        same way. Anything else it sent is answered, then the connection closes; with nothing in
        flight, the transport closes now."""
        request = self.answering
        if request is not None and request.route is not None and request.route.ends_with_client:
            return None
        if self.busy or self.pipeline or self._unparsed is not None:
            self.peer_done = True
            return True
        return None

    def pause_writing(self) -> None:
        """More than the high-water mark is unsent: stop reading (and answering pipelined
        requests) until the client takes its answers, whatever kind of response it was."""
        self.flow.pause_writing()
        self.pause_reading()

    def resume_writing(self) -> None:
        self.flow.resume_writing()
        self.pump()                      # answers what waited, then reads again

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self.phase == IDLE:
            self.phase = HEAD
            self.deadline = self.loop.time() + self.limits.head_timeout
        if len(data) <= PARSE_SLICE:
            self.feed(data)
            return
        self._unparsed = memoryview(data)
        self._at = 0
        self.parse_unparsed()

    @cython.ccall
    def parse_unparsed(self) -> None:
        """Parse the held read a slice at a time, until it is done, reading is paused (answers
        are owed first), or this callback's budget of requests is spent (then yield)."""
        data = self._unparsed
        size: cython.Py_ssize_t = len(data)
        budget_end: cython.long = self.n_completed + PARSE_BUDGET
        while self._at < size:
            if not self.reading:
                return                   # resume_reading continues from here
            if self.n_completed >= budget_end:
                self.transport.pause_reading()
                self.schedule_parse()
                return
            end: cython.Py_ssize_t = min(self._at + PARSE_SLICE, size)
            piece = data[self._at:end]
            self._at = end
            if not self.feed(piece):
                self._unparsed = None
                return
        self._unparsed = None
        if self.reading:
            self.transport.resume_reading()

    @cython.ccall
    def schedule_parse(self) -> None:
        if not self._parse_scheduled:
            self._parse_scheduled = True
            self.loop.call_soon(self.parse_later)

    def parse_later(self) -> None:
        self._parse_scheduled = False
        if self._unparsed is not None and not self.closed:
            self.parse_unparsed()

    @cython.ccall
    def feed(self, data) -> cython.bint:
        """One piece of the byte stream into the parser; False once the connection is done."""
        self.n_chunks += 1
        try:
            self.parser.feed_data(data)
        except _Reject as rejection:
            self.refuse(rejection)
            return False
        except httptools.HttpParserUpgrade:
            self.upgrade_requested()
            return False
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Reject):
                self.refuse(cause)
            elif cause is not None:      # our own callback failed: a bug, not a bad request
                log.error("HTTP parser callback failed", exc_info=cause)
                self.reject(ErrorKind.INTERNAL, "internal server error")
            else:
                self.reject(ErrorKind.INVALID_REQUEST, f"malformed HTTP request: {_reason(exc)}")
            return False
        if self.phase == HEAD and not self.closed:
            self.count_partial_head(len(data))
        return not self.closed

    @cython.ccall
    def count_partial_head(self, n_bytes: int) -> None:
        """Bound a head that is still arriving (a header line may be buffered in the parser)."""
        if self._head_chunk == self.n_chunks:
            self._head_seen = len(self._url) + self._header_bytes
        else:
            self._head_seen += n_bytes   # the whole chunk went into the unfinished head
        if self._head_seen > self._max_head:
            self.reject(ErrorKind.HEADERS_TOO_LARGE,
                        f"request head is larger than {self._max_head} bytes")

    @cython.ccall
    def upgrade_requested(self) -> None:
        # llhttp stops at a request asking for a protocol upgrade. A complete request is
        # answered normally (the upgrade is ignored); the connection then closes.
        if self.phase == IDLE and self.pipeline:
            # not pipeline[-1]: compiled with wraparound off, a negative index is out of range
            self.pipeline[len(self.pipeline) - 1].keep_alive = False
            self.pause_reading()
        elif self.busy:
            self.pause_reading()
        else:
            self.reject(ErrorKind.INVALID_REQUEST, "protocol upgrade is not supported")

    # ---- parser callbacks -----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._n_headers = 0
        self._header_bytes = 0
        self._head_seen = 0
        self._head_chunk = self.n_chunks
        self._n_content_length = 0
        self._body = []
        self._body_len = 0
        if self.phase != HEAD:           # a pipelined request starts inside a chunk
            self.phase = HEAD
            self.deadline = self.loop.time() + self.limits.head_timeout

    def on_url(self, fragment: bytes) -> None:
        self._url += fragment
        if len(self._url) > self._max_head:
            raise _Reject(ErrorKind.URI_TOO_LONG,
                          f"request target is longer than {self._max_head} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.phase == BODY:
            return                       # a chunked body's trailer: never a request header
        self._n_headers += 1
        if self._n_headers > self._max_headers:
            raise _Reject(ErrorKind.HEADERS_TOO_LARGE,
                          f"more than {self._max_headers} header fields")
        self._header_bytes += len(name) + len(value) + 4
        if self._header_bytes + len(self._url) > self._max_head:
            raise _Reject(ErrorKind.HEADERS_TOO_LARGE,
                          f"request head is larger than {self._max_head} bytes")
        name = name.lower()
        if name == b"content-length":
            self._n_content_length += 1
            if self._n_content_length > 1:
                raise _Reject(ErrorKind.INVALID_REQUEST, "duplicate Content-Length header")
            if not value.isdigit() or len(value) > 18:
                raise _Reject(ErrorKind.INVALID_REQUEST, "malformed Content-Length header")
        previous = self._headers.get(name)
        self._headers[name] = value if previous is None else previous + b", " + value

    def on_headers_complete(self) -> None:
        # Content-Length with Transfer-Encoding never gets here: llhttp refuses it (smuggling).
        parser = self.parser
        self._method = parser.get_method().decode("ascii", "replace")
        self._keep_alive = parser.should_keep_alive()
        _check_framing(parser.get_http_version(), self._headers.get(b"transfer-encoding"))
        # HEAD is GET without the body (RFC 9110 9.3.2): it runs the GET route, `send` drops the body
        method = "GET" if self._method == "HEAD" else self._method
        target = self.app.targets.get((method, self._url))
        if target is None:
            target = self.app.resolve_target(method, self._url, _split_target)
        self._path, self._query, self._route, self._params = target
        self._max_body = self._route.max_body if self._route is not None else self.app.max_body
        length = self._headers.get(b"content-length")
        if length is not None and int(length) > self._max_body:
            raise _Reject(ErrorKind.PAYLOAD_TOO_LARGE,
                          f"request body is larger than {self._max_body} bytes")
        self.precheck()
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and not self.busy:
            self.transport.write(CONTINUE)
        self._t_start = perf_counter()
        now = self.loop.time()
        self.phase = BODY
        self.deadline = now + self.limits.body_timeout

    def precheck(self) -> None:
        """A keyed route's credential, before its body is read (guard.precheck)."""
        route = self._route
        precheck = getattr(self.app.guard, "precheck", None) if route is not None else None
        if precheck is None:
            return
        try:
            precheck(self._headers, route, self.session)
        except ApiError as error:
            raise _Reject(error.kind, error.message, error, route)

    def on_body(self, data: bytes) -> None:
        self._body_len += len(data)
        if self._body_len > self._max_body:
            raise _Reject(ErrorKind.PAYLOAD_TOO_LARGE,
                          f"request body is larger than {self._max_body} bytes")
        self._body.append(data)
        self.deadline = self.loop.time() + self.limits.body_timeout

    def on_message_complete(self) -> None:
        if self.closed:
            return
        self.phase = IDLE
        self.n_completed += 1
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request_id = self._headers.get(b"x-request-id")
        if request_id is None or _REQUEST_ID.fullmatch(request_id) is None:
            request_id = new_request_id()
        request = Request(self._method, self._path, self._query, self._headers, body, request_id,
                          self._keep_alive, self._route, self._params, self._t_start, self.peer,
                          self.session)
        if len(self.pipeline) >= self.limits.max_pipeline:
            # Thousands of requests in one read, the client reading none of the answers: stop
            # parsing here (the rest of the read is dropped), answer what came, then close.
            raise _Reject(ErrorKind.RATE_LIMIT,
                          f"more than {self.limits.max_pipeline} pipelined requests are waiting "
                          "for their answers on this connection")
        self.pipeline.append(request)
        self.pump()
        if self.pipeline:
            self.pause_reading()         # answer what we have before reading more

    # ---- answering ------------------------------------------------------------------------

    @cython.ccall
    def pump(self) -> None:
        """Answer queued requests in order. Iterative, so deep pipelines cannot recurse."""
        if self.pumping:
            return
        self.pumping = True
        try:
            while self.pipeline and not self.busy and not self.closed and not self.flow.paused:
                self.start(self.pipeline.popleft())
        finally:
            self.pumping = False
        if not self.pipeline and not self.reading and not self.closed and not self.flow.paused:
            self.resume_reading()

    @cython.ccall
    def start(self, request) -> None:
        if type(request) is _Reject:
            self.refuse(request)
            return
        self.busy = True
        self.answering = request
        result = self.app.dispatch(request)
        if type(result) is Response:
            self.send(request, result)
        else:
            self.task = self.loop.create_task(self.answer(request, result))

    async def answer(self, request: Request, result) -> None:
        try:
            if not isinstance(result, StreamingResponse):
                result = await self.app.settle(request, result)
            if isinstance(result, StreamingResponse):
                await self.stream(request, result)
            else:
                self.send(request, result)
        except asyncio.CancelledError:
            self.finish(request, 499, 0, False)  # client closed the connection

    @cython.ccall
    def send(self, request: Request, response: Response) -> None:
        keep_alive = request.keep_alive and not self.server.draining
        extra = request.rate_headers
        if response.headers:
            extra += encode_headers(response.headers)
        body = response.body
        head = response_head(response.status, response.content_type, len(body),
                             request.request_id, self.server.date, extra, keep_alive)
        sent = b"" if request.method == "HEAD" else body     # HEAD: GET's head, no body
        self.transport.write(head + sent)
        self.finish(request, response.status, len(sent), keep_alive)

    async def stream(self, request: Request, response: StreamingResponse) -> None:
        keep_alive = request.keep_alive and not self.server.draining
        chunked = self.parser.get_http_version() != "1.0"
        keep_alive = keep_alive and chunked   # an HTTP/1.0 body ends when the connection does
        extra = request.rate_headers
        if response.headers:
            extra += encode_headers(response.headers)
        write = self.transport.write
        write(stream_head(response.status, response.content_type, request.request_id,
                          self.server.date, extra, chunked, keep_alive))
        sent = 0
        chunks = response.chunks
        try:
            if request.method != "HEAD":  # HEAD: the head only; `aclose` below ends the work
                sent = await self.write_chunks(chunks, chunked)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The head is gone already: the only honest signal left is an unterminated body.
            log.exception("stream failed request_id=%s", request.request_id.decode())
            keep_alive = False
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        self.finish(request, response.status, sent, keep_alive)

    async def write_chunks(self, chunks, chunked: cython.bint):
        """Write a streamed body; the number of bytes written."""
        write = self.transport.write
        sent = 0
        async for piece in chunks:
            if self.closed:
                return sent
            if piece:
                write(chunk(piece) if chunked else piece)
                sent += len(piece)
            if self.flow.paused:
                await self.flow.drain()
        if chunked and not self.closed:
            write(LAST_CHUNK)
        return sent

    @cython.ccall
    def finish(self, request, status: int, n_bytes: int, keep_alive: bool) -> None:
        self.busy = False
        self.task = None
        self.answering = None
        self.server.record(self.app, request, status, n_bytes)
        if self.closed:
            return
        if not keep_alive or (self.peer_done and not self.pipeline):
            self.close()
            return
        if self.phase == IDLE:
            self.deadline = self.loop.time() + self.limits.keepalive_timeout
        else:
            self.deadline = max(self.deadline, self.loop.time() + self.limits.head_timeout)
        self.pump()

    @cython.ccall
    def reject(self, kind: ErrorKind, message: str) -> None:
        self.refuse(_Reject(kind, message))

    @cython.ccall
    def refuse(self, rejection) -> None:
        """Answer a request we could not parse or accept, then close: the stream is out of sync."""
        if self.closed:
            return
        if self.busy or self.pipeline:   # answer in order, after the requests already here
            self.pipeline.append(rejection)
            self.pause_reading()
            return
        error = rejection.error if rejection.error is not None else ApiError(rejection.kind, rejection.message)
        route = rejection.route
        response = error_response(error, route.error_shape if route is not None else None)
        extra = encode_headers(response.headers) if response.headers else b""
        request_id = new_request_id()
        self.transport.write(response_head(response.status, response.content_type,
                                           len(response.body), request_id, self.server.date,
                                           extra, False) + response.body)
        self.server.record_rejection(self.app, self._method, self._path, response.status,
                                     request_id, self.peer, route)
        self.close()

    # ---- housekeeping ---------------------------------------------------------------------

    def check_deadline(self, now: float) -> None:
        """Called by the server's sweep about twice a second."""
        if self.closed:
            return
        if self.flow.paused and now - self.flow.paused_at > self.limits.write_timeout:
            self.transport.abort()       # the client stopped reading
            return
        if self.busy or self.deadline > now:
            return
        if self.phase == IDLE:
            self.close()                 # keep-alive expired
        elif self.phase == HEAD:
            self.reject(ErrorKind.REQUEST_TIMEOUT,
                        f"request head not received within {self.limits.head_timeout:g} s")
        else:
            self.reject(ErrorKind.REQUEST_TIMEOUT,
                        f"request body stalled for {self.limits.body_timeout:g} s")

    def shutdown(self) -> None:
        """Server is draining: close now if idle, else after the response in flight."""
        if not self.busy and not self.pipeline and self.phase == IDLE:
            self.close()

    @cython.ccall
    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    @cython.ccall
    def pause_reading(self) -> None:
        if self.reading and not self.closed:
            self.reading = False
            self.transport.pause_reading()

    @cython.ccall
    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            if self._unparsed is not None:
                self.schedule_parse()    # the held read first (never re-entering the parser)
            else:
                self.transport.resume_reading()


def _check_framing(version: str, transfer_encoding) -> None:
    """Refuse what this server cannot read right rather than read it wrong: a protocol version
    other than HTTP/1.0 or 1.1, and a transfer coding other than chunked (llhttp itself refuses
    a Transfer-Encoding whose last coding is not chunked; a body sent `gzip, chunked` would
    otherwise reach the handler still compressed). Both are the client's to fix: 400s, as
    llhttp answers the framing it refuses, so that no hostile head draws a 5xx."""
    if version != "1.1" and version != "1.0":
        raise _Reject(ErrorKind.INVALID_REQUEST,
                      f"HTTP/{version} is not supported: this server speaks HTTP/1.1 (and 1.0)")
    if transfer_encoding is None:
        return
    for coding in transfer_encoding.split(b","):
        coding = coding.strip().lower()
        if coding != b"chunked":
            raise _Reject(ErrorKind.INVALID_REQUEST,
                          f"Transfer-Encoding {coding.decode('latin-1')!r} is not supported: "
                          "send the body as is or chunked")


def _split_target(url: bytes) -> tuple[str, str]:
    """Origin-form or absolute-form request target -> (path, query)."""
    if url[:1] != b"/":
        if url[:7].lower() == b"http://" or url[:8].lower() == b"https://":
            try:
                parsed = httptools.parse_url(url)
            except httptools.HttpParserInvalidURLError:
                raise _Reject(ErrorKind.INVALID_REQUEST, "request target is not a valid URL") from None
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
        else:
            raise _Reject(ErrorKind.INVALID_REQUEST, "request target must be an absolute path")
    path, _, query = url.partition(b"?")
    try:
        return path.decode("ascii"), query.decode("ascii")
    except UnicodeDecodeError:
        raise _Reject(ErrorKind.INVALID_REQUEST, "request target must be ASCII") from None


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]

