"""A follower's tensor shards, started and stopped by its leader: internal routes on the cluster
port, signed with the cluster secret by the internal route group; runtime/tensor_host.py does
the work.

    POST /internal/v1/tensor/start {"group_id", "model", "sha256", "rank", "weights", "addresses",
                                    "engine", "tensor"}                        -> {"port", "pid"}
    POST /internal/v1/tensor/stop  {"group_id"}                                -> {"stopped"}
    GET  /internal/v1/tensor                                                   -> {"groups": [...]}
"""
from __future__ import annotations

from ...http import validate
from ...http.errors import invalid
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...http.routing import Endpoint

MAX_NODES = 64                 # a group's nodes at most (a model has fewer KV-head groups)
MAX_VOCAB = 1 << 22
MAX_ENGINE_INT = 1 << 24       # an engine parameter's bound (a context length, a batch, a count)

GROUP_ID = validate.String("group_id", required=True, max_len=128, doc="The leader's id for the group.")
MODEL = validate.String("model", required=True, max_len=256, doc="The model's id in this node's store.")
SHA256 = validate.String("sha256", required=True, max_len=64, doc="The model file's digest, as the leader has it.")
RANK = validate.Integer("rank", required=True, lo=1, hi=MAX_NODES - 1, doc="This node's place in the group.")
START_BODY = validate.Body(GROUP_ID, MODEL, SHA256, RANK)
STOP_BODY = validate.Body(GROUP_ID)


def _numbers(body: dict, field: str, kind, lo, hi, n_min: int, n_max: int) -> list:
    value = body.get(field)
    if (not isinstance(value, list) or not n_min <= len(value) <= n_max
            or not all(isinstance(v, kind) and not isinstance(v, bool) and lo <= v <= hi for v in value)):
        raise invalid(f"'{field}' must be {n_min} to {n_max} numbers from {lo} to {hi}", field)
    return value


def _addresses(body: dict, rank: int) -> list[list]:
    value = body.get("addresses")
    if not isinstance(value, list) or len(value) != rank or not all(
            isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and 0 < len(a[0]) <= 255
            and isinstance(a[1], int) and not isinstance(a[1], bool) and 0 < a[1] < 65536 for a in value):
        raise invalid("'addresses' must be the lower ranks' [host, port], one for each", "addresses")
    return value


def _tensor(body: dict, n: int) -> dict:
    value = body.get("tensor")
    if not isinstance(value, dict) or not isinstance(value.get("mesh_id"), str) or len(value["mesh_id"]) > 128:
        raise invalid("'tensor' must carry the group's mesh_id, deadline_ms, spin_us and vocab_cut", "tensor")
    deadline, spin = value.get("deadline_ms"), value.get("spin_us")
    if not (isinstance(deadline, int) and 1 <= deadline <= 60_000 and isinstance(spin, int) and 0 <= spin <= 10_000):
        raise invalid("'tensor.deadline_ms' must be 1 to 60000 and 'tensor.spin_us' 0 to 10000", "tensor")
    cut = _numbers(value, "vocab_cut", int, 0, MAX_VOCAB, n + 1, n + 1)
    if cut[0] != 0 or any(b <= a for a, b in zip(cut, cut[1:])):
        raise invalid("'tensor.vocab_cut' must rise from 0, one boundary per node and one more", "tensor")
    return {"mesh_id": value["mesh_id"], "deadline_ms": deadline, "spin_us": spin, "vocab_cut": cut}


def _engine(body: dict) -> dict:
    """The leader's engine parameters a follower's engine copies (tensor_host.ENGINE_FIELDS), each
    of its type and within MAX_ENGINE_INT (a count or a length: slots, context, batch, queue)."""
    from ...runtime.tensor_host import ENGINE_FIELDS
    value = body.get("engine")
    if not isinstance(value, dict):
        raise invalid("'engine' must be the leader's engine parameters", "engine")
    out = {}
    for name, kind in ENGINE_FIELDS.items():
        if name not in value:
            continue
        v = value[name]
        fits = (isinstance(v, bool) if kind is bool else
                isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1 if kind is float else
                isinstance(v, int) and not isinstance(v, bool) and -1 <= v <= MAX_ENGINE_INT)
        if not fits:
            raise invalid(f"'engine.{name}' is not a valid {kind.__name__} for it", "engine")
        out[name] = v
    return out


async def start(ctx, request) -> Response:
    """Cut this node's shard of a model from its own store and start its engine worker."""
    body = request.json()
    rank = RANK.read(body)
    weights = _numbers(body, "weights", (int, float), 0.0001, 1e6, 2, MAX_NODES)
    engine = _engine(body)
    follower = await ctx.models.tensor_host.start(
        GROUP_ID.read(body), MODEL.read(body), SHA256.read(body), rank, [float(w) for w in weights],
        _addresses(body, rank), engine, _tensor(body, len(weights)))
    return json_response({"port": follower.port, "pid": follower.proc.pid})


async def stop(ctx, request) -> Response:
    return json_response({"stopped": await ctx.models.tensor_host.stop(GROUP_ID.read(request.json()))})


async def listing(ctx, request) -> Response:
    return json_response({"groups": ctx.models.tensor_host.listing()})


_STARTED = {"type": "object", "required": ["port", "pid"],
            "properties": {"port": {"type": "integer"}, "pid": {"type": "integer"}}}
_STOPPED = {"type": "object", "required": ["stopped"], "properties": {"stopped": {"type": "boolean"}}}
_LISTING = {"type": "object", "required": ["groups"], "properties": {"groups": {"type": "array"}}}

ROUTES = {
    ("POST", "/internal/v1/tensor/start"): Endpoint(start, None, body=START_BODY, responses={
        200: json_answer(_STARTED, "The shard's worker and the port its peers dial.")}),
    ("POST", "/internal/v1/tensor/stop"): Endpoint(stop, None, body=STOP_BODY, responses={
        200: json_answer(_STOPPED, "Whether a shard was stopped.")}),
    ("GET", "/internal/v1/tensor"): Endpoint(listing, None, responses={
        200: json_answer(_LISTING, "The tensor shards this node runs.")}),
}


def register() -> None:
    from . import internal
    internal.register(ROUTES)
