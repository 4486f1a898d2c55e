"""The model-management group, on both ports, counted against the cluster rate-limit group.

Load, unload, pull and import answer with the model's description: its manifest facts and its
state, the same shape as an entry of GET /v1/models.
"""
from __future__ import annotations

import asyncio

import orjson

from ..auth import permissions as perm
from ..http import validate
from ..errors import DomainError, invalid
from ..system import durations
from .errors import api_error
from ..http.openapi import json_answer
from ..http.response import Response, StreamingResponse, json_response
from ..http.routing import Endpoint
from ..config import MAX_REPLICAS
from ..engine.config import KV_TYPES
from ..store.defaults import CHAT_MODEL

CLUSTER = "cluster"

# The bodies, described once: the handlers read these and the OpenAPI document shows them.
MODEL = validate.String("model", required=True, max_len=256, doc="The model's id in the store.")
CONTEXT_LENGTH = validate.Integer("context_length", lo=1, hi=1 << 24,
                                  doc="Tokens per sequence; at most the model's trained context.")
SPLIT_MODE = validate.String("split_mode", choices=("layer", "tensor", "replica"),
                             doc="How a model placed over several nodes is cut: by layers (the default for a model "
                                 "too large for one node), by tensors (llama.cpp's tensor split; flash attention, an "
                                 "f16 KV cache), or not at all: a full replica on each node that can hold it (the "
                                 "default for a model that fits one node; the leader routes each request).")
NODES = validate.Array("nodes", validate.String(max_len=128), min_items=1, max_items=16,
                       doc="Node ids to place the model on (GET /v1/nodes); the default is the leader alone "
                           "when it fits, else every node that is up.")
PIPELINE = validate.Boolean("pipeline", doc="Layer split over several nodes: the leader computes its layers "
                                             "through its own loopback RPC server, so every layer is on an RPC "
                                             "device and llama.cpp overlaps micro-batches across the nodes.")
LAYERS = validate.Array("layers", validate.Integer(lo=1, hi=1 << 16), min_items=1, max_items=16,
                        doc="Layer split: how many layers each node of 'nodes' takes, in that order (they add "
                            "up to the model's layer count), as llama.cpp's --tensor-split; the default follows "
                            "each node's measured compute (the last node's share counting the output layer), "
                            "or the memory each offers while a node is unmeasured.")
LANES = validate.Integer("lanes", lo=1, hi=8,
                         doc="Layer split over several nodes: the engine's lanes, contexts of the model that "
                             "share the slots and step in turn, so that one lane's step runs on a follower "
                             "while another's runs on the leader. Default: one per node when the layer counts "
                             "followed every node's measured compute and each lane keeps 2 slots, else 1 "
                             "(they pay when the nodes' parts of a step take about as long).")
REPLICAS = validate.OneOf("replicas", validate.String(choices=("all",)), validate.Integer(lo=1, hi=MAX_REPLICAS),
                          doc="Replicas of a model that fits one node, the leader's own included: 'all' (every "
                              "node that is up and can hold it) or a number; the default is cluster.replicas.",
                          message=f"'options.replicas' must be 'all' or a number from 1 to {MAX_REPLICAS}")
KV_TYPE = validate.String("kv_type", choices=tuple(KV_TYPES),
                          doc="The KV cache's element type: f16, or q8_0 (about half the bytes, so more "
                              "context or slots fit; flash attention on; greedy output close to f16's, "
                              "docs/engine.md); the default is engine.kv_type.")
OPTIONS = validate.Object("options", CONTEXT_LENGTH, SPLIT_MODE, NODES, PIPELINE, LAYERS, LANES, REPLICAS, KV_TYPE)
KEEP_ALIVE = validate.OneOf("keep_alive", validate.Number(lo=-durations.MAX_SECONDS, hi=durations.MAX_SECONDS),
                            validate.String(max_len=32),
                            doc="How long the model stays loaded once idle, as Ollama's keep_alive: seconds, or "
                                "a duration such as \"5m\" or \"1h30m\"; 0 unloads it as soon as its last "
                                "request ends, a negative value keeps it until unloaded. The default is "
                                "models.keep_alive. A load of a model already loaded with the same options "
                                "only sets its keep-alive.")
PULL_MODEL = validate.String("model", required=True, max_len=256,
                             doc="A registry reference: name, name:tag or namespace/name:tag.")
STREAM = validate.Boolean("stream", doc="Report progress as NDJSON lines.")
IMPORT_PATH = validate.String("path", required=True, max_len=4096,
                              doc="The GGUF file: relative to the import directory (models.import_dir), "
                                  "or an absolute path under it. Nothing outside it can be imported.")
IMPORT_NAME = validate.String("name", max_len=200,
                              doc="name[:tag] or namespace/name[:tag]; default: the file name without .gguf.")
LOAD_BODY = validate.Body(MODEL, OPTIONS, KEEP_ALIVE, example={"model": CHAT_MODEL})
UNLOAD_BODY = validate.Body(MODEL, example={"model": CHAT_MODEL})
PULL_BODY = validate.Body(PULL_MODEL, STREAM, example={"model": "smollm2:135m"})
IMPORT_BODY = validate.Body(IMPORT_PATH, IMPORT_NAME, example={"path": "qwen2.5-0.5b-instruct-q4_k_m.gguf",
                                                               "name": "qwen2.5:0.5b"})


async def load(ctx, request) -> Response:
    """Load a model into memory, optionally with a context length."""
    body = request.json()
    model_id = MODEL.read(body)
    options = OPTIONS.read(body) or {}
    keep_alive = KEEP_ALIVE.read(body)
    if keep_alive is not None:
        try:
            keep_alive = durations.seconds(keep_alive)
        except durations.DurationError as exc:
            raise invalid(f"'keep_alive': {exc}", "keep_alive") from None
    context_length = options.get("context_length")
    model = await ctx.models.load(model_id, context_length, options, keep_alive)
    return json_response(ctx.models.describe(model.manifest))


async def unload(ctx, request) -> Response:
    """Unload a model; its in-flight requests end with 503."""
    model_id = MODEL.read(request.json())
    manifest = await ctx.models.unload(model_id)
    return json_response(ctx.models.describe(manifest))


async def pull(ctx, request) -> Response | StreamingResponse:
    """Download a model from the model registry into the store.

    {model, stream?}: NDJSON progress ({status, digest, total, completed}, Ollama's shape)
    when streaming, else one JSON result once the model is in the store."""
    body = request.json()
    name = PULL_MODEL.read(body)
    events = ctx.pulls.pull(name)
    if STREAM.read(body):
        first = await anext(events)          # a bad name or missing registry is a plain 4xx
        return StreamingResponse(_ndjson(first, events), b"application/x-ndjson")
    model_id = None
    async for event in events:
        model_id = event.get("model", model_id)
    result = ctx.models.describe(ctx.models.manifest(model_id))
    return json_response({"status": "success", **result})


async def import_(ctx, request) -> Response:
    """Add a GGUF file from the import directory to the store, through every check a pulled
    model passes; a refused file leaves nothing behind."""
    body = request.json()
    path, name = IMPORT_PATH.read(body), IMPORT_NAME.read(body)
    loop = asyncio.get_running_loop()
    manifest = await loop.run_in_executor(None, ctx.imports.add_requested, path, name)
    return json_response({"status": "success", **ctx.models.describe(manifest)})


async def _ndjson(first: dict, events):
    yield orjson.dumps(first, option=orjson.OPT_APPEND_NEWLINE)
    try:
        async for event in events:
            yield orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE)
    except DomainError as exc:              # the head is sent: report in the stream, then end it
        yield orjson.dumps(api_error(exc).body(), option=orjson.OPT_APPEND_NEWLINE)


# What ModelManager.describe answers: the model's facts and state.
_INT, _STR = {"type": "integer"}, {"type": "string"}
_NULLABLE_INT = {"type": ["integer", "null"]}
MODEL_STATES = ["available", "loading", "loaded", "unloading", "failed"]
MODEL_SCHEMA = {"type": "object", "required": [
    "id", "object", "created", "owned_by", "kind", "state", "context_length",
    "trained_context_length", "architecture", "quantization", "parameter_count", "size", "sha256",
    "file", "source"], "properties": {
    "id": _STR, "object": {"const": "model"}, "created": _INT, "owned_by": _STR,
    "kind": {"type": "string", "enum": ["chat", "embedding"]},
    "state": {"type": "string", "enum": MODEL_STATES},
    "context_length": _NULLABLE_INT, "trained_context_length": _NULLABLE_INT,
    "architecture": _STR, "quantization": _STR, "parameter_count": _INT, "size": _INT,
    "sha256": _STR, "file": _STR, "source": _STR,
    "error": {"type": "string", "description": "Why the last load failed."},
    "pinned": {"type": "boolean", "description": "Never unloaded to make room or for being idle "
                                                 "(models.pinned, serve --model)."},
    "keep_alive": {"type": "number", "description": "A loaded model: seconds it stays once idle (-1: until "
                                                    "unloaded)."},
    "expires_at": {"type": ["integer", "null"], "description": "A loaded model: when it will be unloaded for "
                                                             "being idle (unix seconds); null while a request "
                                                             "uses it, or when pinned or kept for ever."},
    "in_use": {"type": "integer", "description": "A loaded model: requests using it now."},
    "kv_cache": {"type": "object", "required": ["type", "bytes"],
                 "description": "A loaded chat model's KV cache: its element type (engine.kv_type or the load's "
                                "options.kv_type) and its size, as memory admission counts it.",
                 "properties": {"type": {"type": "string", "enum": list(KV_TYPES)}, "bytes": _INT}},
    "replicas": {"type": "array", "description": "split_mode replica: each full copy of the model, its node, "
                                                 "state and engine process", "items": {
        "type": "object", "required": ["node", "state", "pid"], "properties": {
            "node": _STR, "state": {"type": "string", "enum": ["loaded", "lost"]},
            "pid": _NULLABLE_INT, "in_flight": _INT}}},
    "placement": {"type": "object", "required": ["split_mode", "nodes"],
                  "description": "Where a loaded model's layers are: the nodes and what each holds.",
                  "properties": {
                      "split_mode": {"type": "string", "enum": ["layer", "tensor", "replica"]},
                      "pipeline": {"type": "boolean"},
                      "lanes": {"type": "integer", "minimum": 2,
                                "description": "layer split over several nodes, options.lanes: the "
                                               "engine's contexts, a step of each in flight at once"},
                      "nodes": {"type": "array", "items": {
                          "type": "object", "required": ["id", "memory_bytes"], "properties": {
                              "id": _STR, "memory_bytes": _INT,
                              "layers": {"type": "integer", "description": "layer split: its layers"},
                              "share": {"type": "number", "description": "tensor split: its share of "
                                                                         "every weight matrix"}}}}}}}}
MODEL_LIST_SCHEMA = {"type": "object", "required": ["object", "data"], "properties": {
    "object": {"const": "list"}, "data": {"type": "array", "items": MODEL_SCHEMA}}}

MODEL_ERRORS = {400: "The model id is not valid.", 404: "The model is not in the store."}
PULLED = {"type": "object", "required": ["status"],
          "properties": {**MODEL_SCHEMA["properties"], "status": {"const": "success"}}}
PROGRESS = {"application/x-ndjson": {"schema": {
    "type": "object", "description": "One JSON object a line: {status, digest?, total?, completed?}, "
                                     "the last {status: success, model}, or an error object."}}}

ROUTES = {
    ("POST", "/v1/models/load"): Endpoint(load, perm.MODELS_MANAGE, CLUSTER, body=LOAD_BODY, responses={
        200: json_answer(MODEL_SCHEMA, "The model, loaded."),
        **MODEL_ERRORS,
        400: "The model id is not valid, options.context_length is outside the model's range, "
             "options.kv_type is not f16 or q8_0, or options.nodes names a node that is not up.",
        503: "The model is being unloaded, or a node it was to be placed on does not answer; retry.",
        507: "The model with this context does not fit in the cluster's memory even after unloading every "
             "idle model that is not pinned; the message names the models that hold the memory and why "
             "they stay. Nothing else was changed."}),
    ("POST", "/v1/models/unload"): Endpoint(unload, perm.MODELS_MANAGE, CLUSTER, body=UNLOAD_BODY,
                                            responses={200: json_answer(MODEL_SCHEMA, "The model, "
                                                                        "no longer loaded."),
                                                       **MODEL_ERRORS}),
    ("POST", "/v1/models/pull"): Endpoint(pull, perm.MODELS_MANAGE, CLUSTER, body=PULL_BODY, responses={
        200: {**json_answer(PULLED, "The model, in the store."), "content": {
            "application/json": {"schema": PULLED}, **PROGRESS}},
        400: "The reference is not valid, no registry is configured, or the file is not a valid "
             "GGUF model.",
        404: "The registry has no such model.",
        413: "The model is larger than models.max_pull_gb.",
        503: "The registry cannot be reached or failed; retry later.",
        507: "The disk would be left with less than models.disk_reserve_mb free."}),
    ("POST", "/v1/models/import"): Endpoint(import_, perm.ADMIN, CLUSTER, body=IMPORT_BODY, responses={
        200: json_answer(PULLED, "The model, in the store."),
        400: "The path or name is not valid, or the file is not a valid GGUF model llama.cpp can load "
             "(the message says why).",
        403: "The key is not an admin key, or the path lies outside the import directory.",
        404: "No such file in the import directory.",
        409: "Another model already has this name.",
        413: "The file is larger than models.max_pull_gb.",
        507: "Copying the file would leave less than models.disk_reserve_mb of disk free."}),
}
