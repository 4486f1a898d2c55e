"""The model-management group, on both ports, counted against the cluster rate-limit group.

Load, unload and pull answer with the model's description: its manifest facts and its
state, the same shape as an entry of GET /v1/models.
"""
from __future__ import annotations

from ..auth import permissions as perm
from ..http import validate
import orjson

from ..http.errors import ApiError
from ..http.response import Response, StreamingResponse, json_response
from ..http.routing import Endpoint

CLUSTER = "cluster"


async def load(node, request) -> Response:
    body = request.json()
    model_id = validate.string(body, "model", max_len=256)
    options = validate.obj(body, "options", default={})
    context_length = validate.integer(options, "context_length", lo=1, hi=1 << 24)
    model = await node.models.load(model_id, context_length)
    return json_response(node.models.describe(model.manifest))


async def unload(node, request) -> Response:
    model_id = validate.string(request.json(), "model", max_len=256)
    manifest = await node.models.unload(model_id)
    return json_response(node.models.describe(manifest))


async def pull(node, request) -> Response | StreamingResponse:
    """{model, stream?}: NDJSON progress ({status, digest, total, completed}, Ollama's shape)
    when streaming, else one JSON result once the model is in the store."""
    body = request.json()
    name = validate.string(body, "model", max_len=256)
    events = node.pulls.pull(name)
    if validate.boolean(body, "stream"):
        first = await anext(events)          # a bad name or missing registry is a plain 4xx
        return StreamingResponse(_ndjson(first, events), b"application/x-ndjson")
    model_id = None
    async for event in events:
        model_id = event.get("model", model_id)
    result = node.models.describe(node.models.manifest(model_id))
    return json_response({"status": "success", **result})


async def _ndjson(first: dict, events):
    yield orjson.dumps(first, option=orjson.OPT_APPEND_NEWLINE)
    try:
        async for event in events:
            yield orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
    except ApiError as exc:                 # the head is sent: report in the stream, then end it
        yield orjson.dumps(exc.body(), option=orjson.OPT_APPEND_NEWLINE)


ROUTES = {
    ("POST", "/v1/models/load"): Endpoint(load, perm.MODELS_MANAGE, CLUSTER),
    ("POST", "/v1/models/unload"): Endpoint(unload, perm.MODELS_MANAGE, CLUSTER),
    ("POST", "/v1/models/pull"): Endpoint(pull, perm.MODELS_MANAGE, CLUSTER),
}
