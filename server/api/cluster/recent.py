"""GET /v1/requests/recent (cluster read) and the wrapper that fills it: `recording(table)`
wraps an inference route table's POST endpoints so each request, once answered (a stream
once it ends), leaves a line in observe.recent: its counts and times from the answer's own
`usage` and `timings`, never its text. Applied where the daemon builds its inference app."""
from __future__ import annotations

import dataclasses
import inspect
import time
from urllib.parse import parse_qs

import orjson

from ...auth import permissions as perm
from ...http.errors import ApiError, invalid
from ...http.openapi import json_answer
from ...http.response import Response, StreamingResponse, json_response
from ...http.routing import Endpoint
from ...observe.recent import CAPACITY, RECENT, Finished, RecentRequests
from ..errors import to_api_error

TAIL = 4096         # bytes of a stream's end kept to find its last usage / timings
PARSE_AT_MOST = 256 * 1024   # bytes of a whole answer read back for its counts


def _counts(answer: dict) -> tuple[int | None, int | None, float | None]:
    """(prompt tokens, generated tokens, ttft ms) from an answer's usage and timings."""
    usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
    timings = answer.get("timings") if isinstance(answer.get("timings"), dict) else {}
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    generated = usage.get("completion_tokens", usage.get("output_tokens"))
    if prompt is None and "prompt_n" in timings:
        prompt = timings["prompt_n"] + timings.get("cache_n", 0)
    if generated is None:
        generated = timings.get("predicted_n")
    return prompt, generated, timings.get("first_token_ms")


def _from_events(tail: bytes) -> tuple[int | None, int | None, float | None]:
    """The last usage and timings a stream's events carried (OpenAI, Anthropic or ours)."""
    found: dict = {}
    for line in tail.split(b"\n"):
        if not line.startswith(b"data:") or (b'"usage"' not in line and b'"timings"' not in line):
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict):
            inner = event.get("message") if isinstance(event.get("message"), dict) else {}
            for part in (inner, event, event.get("response") if isinstance(event.get("response"), dict) else {}):
                for name in ("usage", "timings"):
                    if isinstance(part.get(name), dict):
                        found[name] = {**found.get(name, {}), **part[name]}
    return _counts(found)


class _Watched:
    """A stream passed through as it is, its end kept to read the counts when it closes."""

    def __init__(self, chunks, done):
        self.chunks = chunks
        self.pieces = chunks.__aiter__()
        self.tail = b""
        self.done = done

    def __aiter__(self):
        return self

    async def __anext__(self) -> bytes:
        piece = await self.pieces.__anext__()
        self.tail = (self.tail + piece)[-TAIL:] if piece else self.tail
        return piece

    async def aclose(self) -> None:
        done, self.done = self.done, None
        try:
            aclose = getattr(self.chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            if done is not None:
                done(self.tail)


def _recorded(handler, path: str, recent: RecentRequests):
    async def recorded(ctx, request):
        arrived, t0 = time.time(), time.perf_counter()
        key = request.key.name if request.key is not None else None
        try:
            model = request.json().get("model") if request.body else None
        except ApiError:
            model = None
        model = model if isinstance(model, str) else None

        def note(status: int, counts) -> None:
            recent.add(Finished(round(arrived, 3), path, model, key, *counts,
                                round((time.perf_counter() - t0) * 1000.0, 3), status))
        try:
            result = handler(ctx, request)
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:
            error = exc if isinstance(exc, ApiError) else to_api_error(exc)
            note(error.kind.status if error is not None else 500, (None, None, None))
            raise
        if isinstance(result, StreamingResponse):
            status = result.status
            result.chunks = _Watched(result.chunks, lambda tail: note(status, _from_events(tail)))
        elif isinstance(result, Response):
            counts = (None, None, None)
            # a large answer (thousands of embeddings) is not parsed again on the loop for counts
            if result.content_type.startswith(b"application/json") and result.status == 200 \
                    and len(result.body) <= PARSE_AT_MOST:
                try:
                    counts = _counts(orjson.loads(result.body))
                except (orjson.JSONDecodeError, AttributeError):
                    pass
            note(result.status, counts)
        return result
    return recorded


def recording(table: dict, recent: RecentRequests = RECENT) -> dict:
    """The inference table with each POST endpoint recorded into `recent`."""
    recent.recording = True
    return {route: dataclasses.replace(endpoint, handler=_recorded(endpoint.handler, route[1], recent))
            if route[0] == "POST" else endpoint for route, endpoint in table.items()}


def recent_requests(ctx, request) -> Response:
    values = parse_qs(request.query).get("limit")
    limit = 50
    if values:
        try:
            limit = int(values[-1])
        except ValueError:
            raise invalid(f"'limit' must be an integer from 1 to {CAPACITY}", "limit") from None
        if not 1 <= limit <= CAPACITY:
            raise invalid(f"'limit' must be an integer from 1 to {CAPACITY}", "limit")
    return json_response({"object": "list", "recording": RECENT.recording,
                          "data": RECENT.newest(limit)})


_N = {"type": ["integer", "null"]}
RECENT_SCHEMA = {"type": "object", "required": ["object", "recording", "data"], "properties": {
    "object": {"const": "list"},
    "recording": {"type": "boolean", "description": "false: this node does not record its requests"},
    "data": {"type": "array", "description": "newest first, at most 200 kept", "items": {
        "type": "object", "required": ["time", "route", "model", "key", "prompt_tokens",
                                       "generated_tokens", "ttft_ms", "duration_ms", "status"],
        "properties": {"time": {"type": "number"}, "route": {"type": "string"},
                       "model": {"type": ["string", "null"]}, "key": {"type": ["string", "null"]},
                       "prompt_tokens": _N, "generated_tokens": _N,
                       "ttft_ms": {"type": ["number", "null"]}, "duration_ms": {"type": "number"},
                       "status": {"type": "integer"}}}}}}

ROUTES = {("GET", "/v1/requests/recent"): Endpoint(
    recent_requests, perm.CLUSTER_READ, "cluster",
    summary="This node's recent inference requests: counts and times, never their text",
    responses={200: json_answer(RECENT_SCHEMA, "The requests, newest first."),
               400: "'limit' is not an integer from 1 to 200."})}
