"""Routes are data; an App is a set of route tables served on one port.

A route group is a module-level table `{(method, path): Endpoint}`. `App`
resolves a request to its route, runs the app's guard (authentication,
permission, rate limit) and the handler, and is the one error wrapper: every
exception becomes an error response in the spec's shape.
"""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, field
from urllib.parse import unquote

from .errors import ApiError, ErrorKind
from .response import Response, error_response

log = logging.getLogger("stackd.http")


@dataclass(frozen=True)
class Endpoint:
    """What a table maps a (method, path) to, and what the OpenAPI document says of it
    (server/http/openapi.py): `body` is the validate.Body its handler reads; `responses`
    maps a status to an OpenAPI response object (success) or to why it happens (an error,
    in the shared error shape). The guard's and the body's errors are added for it."""
    handler: object                 # handler(ctx, request) -> Response | StreamingResponse | awaitable
    permission: str | None          # what the caller's credential must allow; None = any valid key
    group: str | None = None        # rate-limit group
    max_body: int | None = None     # body cap; None = the app's default
    body: object = None             # validate.Body, for requests with a JSON body
    responses: dict = field(default_factory=dict)
    summary: str = ""
    error_shape: object = None      # errors.ErrorShape: this route's errors in another dialect
    # a header that may carry the credential instead of Authorization, as the bare token
    # (Anthropic's x-api-key); the guard reads it only when Authorization is absent
    credential_header: bytes | None = None
    # work for this client alone (a model's generation): a client that ends its input while it
    # runs has gone, and the work stops (http/protocol.py, eof_received)
    ends_with_client: bool = False


class Route:
    __slots__ = ("method", "path", "label", "handler", "ctx", "permission", "group", "max_body", "stats",
                 "error_shape", "credential_header", "ends_with_client")

    def __init__(self, method: str, path: str, endpoint: Endpoint, default_max_body: int, ctx=None):
        self.method = method
        self.path = path
        self.label = f"{method} {path}"
        self.handler = endpoint.handler
        self.ctx = ctx                  # what the handler is called with: its group's context
        self.permission = endpoint.permission
        self.group = endpoint.group
        self.max_body = endpoint.max_body if endpoint.max_body is not None else default_max_body
        self.stats = None               # metrics.RouteStats, attached on first use
        self.error_shape = endpoint.error_shape
        self.credential_header = endpoint.credential_header
        self.ends_with_client = endpoint.ends_with_client


_NO_PARAMS: dict = {}
TARGET_CACHE_SIZE = 1024


class App:
    def __init__(self, name: str, tables: list, *, ctx=None, guard, max_body: int, errors=None,
                 error_shape=None):
        """`tables`: route tables, each a dict or a (dict, context) pair; a plain dict's
        handlers get `ctx`. `error_shape`: how the app words an error of no route of its (an
        unknown path) when it speaks another API's dialect (the Ollama port); None: the spec's."""
        self.name = name
        self.error_shape = error_shape
        self.guard = guard              # guard(request, route) raises ApiError or returns None
        # errors(exc) -> ApiError | None: how the API answers what its handlers raise beyond
        # ApiError (its domain's errors); None for anything else, which is a 500
        self.errors = errors
        self.max_body = max_body
        self.targets: dict[tuple[str, bytes], tuple] = {}
        self.exact: dict[tuple[str, str], Route] = {}
        self.methods: dict[str, list[str]] = {}
        self.patterns: list[tuple[re.Pattern, dict[str, Route]]] = []
        for entry in tables:
            table, table_ctx = entry if isinstance(entry, tuple) else (entry, ctx)
            for (method, path), endpoint in table.items():
                self._add(Route(method, path, endpoint, max_body, table_ctx))

    def _add(self, route: Route) -> None:
        if ":" not in route.path:
            self.exact[(route.method, route.path)] = route
            self.methods.setdefault(route.path, []).append(route.method)
            return
        regex = re.compile("^" + re.sub(r":(\w+)", r"(?P<\1>[^/]+)", route.path) + "$")
        for pattern, by_method in self.patterns:
            if pattern.pattern == regex.pattern:
                by_method[route.method] = route
                return
        self.patterns.append((regex, {route.method: route}))

    def match(self, method: str, path: str) -> tuple[Route | None, dict]:
        route = self.exact.get((method, path))
        if route is not None:
            return route, _NO_PARAMS
        for pattern, by_method in self.patterns:
            found = pattern.match(path)
            if found is not None and method in by_method:
                return by_method[method], {k: unquote(v) for k, v in found.groupdict().items()}
        return None, _NO_PARAMS

    def resolve_target(self, method: str, url: bytes, split) -> tuple:
        """(path, query, route, params) for a request target, cached for targets without a
        query string: probes and API calls repeat the same few URLs, and the cache is
        bounded so hostile URL variety cannot grow it."""
        path, query = split(url)
        route, params = self.match(method, path)
        target = (path, query, route, params)
        if not query and len(self.targets) < TARGET_CACHE_SIZE:
            self.targets[(method, url)] = target
        return target

    def unmatched(self, method: str, path: str) -> ApiError:
        allowed = list(self.methods.get(path, ()))
        for pattern, by_method in self.patterns:
            if pattern.match(path):
                allowed.extend(by_method)
        if allowed:
            if "GET" in allowed:
                allowed.append("HEAD")   # every GET route answers HEAD (protocol.send)
            allow = ", ".join(sorted(set(allowed)))
            return ApiError(ErrorKind.METHOD_NOT_ALLOWED, f"method {method} is not allowed on {path}",
                            headers=((b"allow", allow.encode()),))
        return ApiError(ErrorKind.NOT_FOUND, f"no such endpoint: {method} {path}")

    # ---- the one error wrapper ----------------------------------------------------------------

    def dispatch(self, request):
        """Run guard and handler. Returns a Response, a StreamingResponse or an awaitable."""
        try:
            route = request.route
            if route is None:
                raise self.unmatched(request.method, request.path)
            if self.guard is not None:
                self.guard(request, route)
            return route.handler(route.ctx, request)
        except ApiError as exc:
            response = error_response(exc, self._shape(request))
            if exc.delay > 0:
                return _held_back(exc.delay, response)
            return response
        except Exception as exc:
            return self.failed(request, exc)

    async def settle(self, request, awaitable):
        try:
            return await awaitable
        except ApiError as exc:
            return error_response(exc, self._shape(request))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return self.failed(request, exc)

    def _shape(self, request):
        """The ErrorShape of the request's route (None: the spec's shape), or the app's when
        no route matched."""
        route = request.route
        return route.error_shape if route is not None else self.error_shape

    def failed(self, request, exc: Exception) -> Response:
        answer = self.errors(exc) if self.errors is not None else None
        return error_response(answer, self._shape(request)) if answer is not None else self.crashed(request)

    def crashed(self, request) -> Response:
        log.exception("unhandled error request_id=%s %s %s", request.request_id.decode(),
                      request.method, request.path)
        return error_response(ApiError(ErrorKind.INTERNAL,
                                       "internal server error; see the server log for this request id"),
                              self._shape(request))




async def _held_back(delay: float, response):
    """A refusal answered after `delay` seconds: a timer, not a thread, so holding back a
    client that ignores Retry-After costs the node nothing while it waits."""
    await asyncio.sleep(delay)
    return response
