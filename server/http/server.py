"""Listening sockets, the connection set, the periodic sweep and graceful shutdown."""
from __future__ import annotations

import asyncio
import logging
import time
from time import perf_counter

import orjson

from .access_log import AccessLog
from .errors import ApiError, ErrorKind
from .limits import Limits
from .protocol import HttpProtocol
from .wire import response_head

log = logging.getLogger("stackd.http")

SWEEP_INTERVAL = 0.5


_DAYS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")
_MONTHS = (b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
           b"Dec")


def _http_date(seconds: float | None = None) -> bytes:
    """An HTTP date (RFC 9110's IMF-fixdate), as email.utils.formatdate(usegmt=True) writes it;
    the email package (~1 MB of the daemon's memory) is not imported for it."""
    t = time.gmtime(seconds)
    return b"%s, %02d %s %04d %02d:%02d:%02d GMT" % (_DAYS[t.tm_wday], t.tm_mday, _MONTHS[t.tm_mon - 1],
                                                      t.tm_year, t.tm_hour, t.tm_min, t.tm_sec)


_OVERLOADED_BODY = orjson.dumps(ApiError(ErrorKind.UNAVAILABLE, "too many open connections").body())


def _overloaded_response(date: bytes) -> bytes:
    return response_head(503, b"application/json", len(_OVERLOADED_BODY), b"-", date,
                         b"retry-after: 1\r\n", False) + _OVERLOADED_BODY


class HttpServer:
    def __init__(self, loop: asyncio.AbstractEventLoop, limits: Limits, metrics,
                 access_log: AccessLog):
        self.loop = loop
        self.limits = limits
        self.metrics = metrics
        self.access_log = access_log
        self.connections: set[HttpProtocol] = set()
        self.open_per_app: dict = {}   # app -> its open connections (http.max_connections each)
        self.listeners: list[asyncio.AbstractServer] = []
        self.draining = False
        self.date = _http_date()
        self.tick_hooks: list = []     # callables run on every sweep (config/key reloads)
        self.overloaded_response = _overloaded_response(self.date)
        metrics.open_connections = lambda: len(self.connections)
        self._sweeper: asyncio.TimerHandle | None = None

    async def listen(self, app, host: str, port: int) -> int:
        """Start serving `app`; returns the bound port (useful with port 0)."""
        server = await self.loop.create_server(lambda: HttpProtocol(app, self), host, port,
                                               reuse_address=True, backlog=2048)
        self.listeners.append(server)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self.sweep)
        sock = server.sockets[0]
        return sock.getsockname()[1]

    def sweep(self) -> None:
        now = self.loop.time()
        date = _http_date()
        if date != self.date:           # the 503 for the connection cap carries today's Date too
            self.date = date
            self.overloaded_response = _overloaded_response(date)
        for connection in list(self.connections):
            connection.check_deadline(now)
        self.access_log.flush()
        for hook in self.tick_hooks:
            try:
                hook()
            except Exception:
                log.exception("periodic task failed")
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self.sweep)

    def record(self, app, request, status: int, n_bytes: int) -> None:
        duration = perf_counter() - request.t_start
        route = request.route
        if route is None:
            self.metrics.observe(app.name, "unmatched", status, duration)
        else:
            stats = route.stats
            if stats is None:
                stats = route.stats = self.metrics.stats(app.name, route.label)
            stats.observe(status, duration)
        if self.access_log.enabled:
            key = request.key
            self.access_log.write(request.method, request.path, status, n_bytes, duration,
                                  request.request_id, key.name if key is not None else None,
                                  request.peer)

    def record_rejection(self, app, method: str, path: str, status: int, request_id: bytes,
                         peer: str, route=None) -> None:
        """A request answered from its head alone: under its route when it had one (a missing
        key), else as `rejected` (framing, limits)."""
        if route is None:
            self.metrics.observe(app.name, "rejected", status, 0.0)
        else:
            if route.stats is None:
                route.stats = self.metrics.stats(app.name, route.label)
            route.stats.observe(status, 0.0)
        self.access_log.write(method, path, status, 0, 0.0, request_id, None, peer)

    async def shutdown(self, grace: float) -> None:
        """Stop accepting, let in-flight requests finish within `grace` seconds, then close."""
        self.draining = True
        for server in self.listeners:
            server.close()
        for connection in list(self.connections):
            connection.shutdown()
        deadline = self.loop.time() + grace
        while self.connections and self.loop.time() < deadline:
            for connection in list(self.connections):
                connection.shutdown()
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            if connection.task is not None:
                connection.task.cancel()
            if connection.transport is not None:
                connection.transport.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.access_log.drain()
        for server in self.listeners:
            await server.wait_closed()

