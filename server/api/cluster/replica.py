"""Internal routes a leader calls on a follower for the model replicas it runs there (cluster
port, signed with the cluster secret by the internal route group; runtime/replica_host.py does
the work, runtime/remote_replica.py is the leader's side):

    POST /internal/v1/replica/start    {"replica_id", "model", "sha256", "context_length", "kv_type"} -> {"pid", "n_slots"}
    POST /internal/v1/replica/stop     {"replica_id"}                                       -> {"stopped"}
    GET  /internal/v1/replica                                                               -> {"replicas": [...]}
    POST /internal/v1/replica/generate {"replica_id", "owner", "stop", "jobs"} -> engine wire frames

The generate stream's head is signed over the request's nonce (its frames follow on the
connection the signed request opened); a client without the secret gets 401 before anything runs.
"""
from __future__ import annotations

from ...engine.config import KV_TYPES
from ...engine.core import SAMPLING_FIELDS, SamplingParams, encode_events_wire
from ...engine.errors import EndedEvent, EngineError
from ...engine.wire import frame
from ...errors import DomainError
from ...http import validate
from ...http.errors import invalid
from ...http.openapi import json_answer
from ...http.response import Response, StreamingResponse, json_response
from ...http.routing import Endpoint

MAX_JOBS = 128                 # choices of one request (n x prompts: 64 prompts, n up to 128)
MAX_PROMPT = 1 << 20           # token ids of one prompt

REPLICA_ID = validate.String("replica_id", required=True, max_len=128, doc="The leader's id for the replica.")
MODEL = validate.String("model", required=True, max_len=256, doc="The model's id in this node's store.")
SHA256 = validate.String("sha256", required=True, max_len=64, doc="The model file's digest, as the leader has it.")
CONTEXT = validate.Integer("context_length", required=True, lo=1, hi=1 << 24, doc="Tokens per sequence.")
KV_TYPE = validate.String("kv_type", choices=tuple(KV_TYPES), doc="The KV cache's type (default engine.kv_type).")
START_BODY = validate.Body(REPLICA_ID, MODEL, SHA256, CONTEXT, KV_TYPE)
STOP_BODY = validate.Body(REPLICA_ID)


async def start(ctx, request) -> Response:
    """Load a replica of a model from this node's store into a worker of its own."""
    body = request.json()
    hosted = await ctx.models.replica_host.start(REPLICA_ID.read(body), MODEL.read(body), SHA256.read(body),
                                                 CONTEXT.read(body), KV_TYPE.read(body))
    return json_response({"pid": hosted.runner.engine.pid, "n_slots": hosted.runner.engine.n_slots})


async def stop(ctx, request) -> Response:
    return json_response({"stopped": await ctx.models.replica_host.stop(REPLICA_ID.read(request.json()))})


async def listing(ctx, request) -> Response:
    return json_response({"replicas": ctx.models.replica_host.listing()})


def _jobs(body: dict, n_vocab: int) -> tuple[list, list[str], int]:
    """(jobs, stop, owner) of a generate body, checked: the leader's, but checked all the same."""
    jobs, stop, owner = body.get("jobs"), body.get("stop", []), body.get("owner", 0)
    if not isinstance(jobs, list) or not 1 <= len(jobs) <= MAX_JOBS:
        raise invalid(f"'jobs' must be an array of 1 to {MAX_JOBS} jobs", "jobs")
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("'stop' must be an array of strings", "stop")
    if not isinstance(owner, int) or isinstance(owner, bool):
        raise invalid("'owner' must be an integer", "owner")
    out = []
    for job in jobs:
        if not (isinstance(job, list) and len(job) == 3 and isinstance(job[0], list)
                and isinstance(job[1], int) and isinstance(job[2], dict)):
            raise invalid("a job is [prompt token ids, max_tokens, sampling fields]", "jobs")
        prompt, max_tokens, fields = job
        if not 1 <= len(prompt) <= MAX_PROMPT or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in prompt):
            raise invalid("a job's prompt must be token ids of this model's vocabulary", "jobs")
        sampling = SamplingParams()
        for name, value in fields.items():
            if name not in SAMPLING_FIELDS:
                raise invalid(f"unknown sampling field '{name}'", "jobs")
            try:
                setattr(sampling, name, value)
            except (TypeError, ValueError):
                raise invalid(f"bad sampling field '{name}'", "jobs") from None
        out.append((prompt, max_tokens, sampling))
    return out, stop, owner


async def generate(ctx, request) -> StreamingResponse:
    """Run one request's jobs on a replica here; stream the engine's events back."""
    body = request.json()
    hosted = ctx.models.replica_host.get(REPLICA_ID.read(body))
    jobs, stop_strings, owner = _jobs(body, hosted.runner.engine.n_vocab)
    return StreamingResponse(_frames(hosted.runner, jobs, stop_strings, owner), b"application/octet-stream")


async def _frames(runner, jobs, stop_strings, owner):
    try:
        stream = await runner.generate(jobs, stop_strings, owner)
    except DomainError as exc:                   # refused (queue, share), or the replica is going
        yield frame({"op": "refused", "code": getattr(exc.code, "value", str(exc.code)), "message": exc.message})
        return
    yield frame({"op": "accepted", "ids": list(stream.choice)})
    try:
        async for event in stream:
            if isinstance(event, EndedEvent):
                error = event.error
                yield frame({"op": "ended", "id": event.id_request,
                             "code": error.code.value if isinstance(error, EngineError) else None,
                             "message": error.message if isinstance(error, DomainError) else str(error)})
            else:
                yield frame({"op": "events"}, encode_events_wire([event]))
    finally:
        runner.cancel(stream)                    # the leader went away: free the slots


_STARTED = {"type": "object", "required": ["pid", "n_slots"],
            "properties": {"pid": {"type": "integer"}, "n_slots": {"type": "integer"}}}
_STOPPED = {"type": "object", "required": ["stopped"], "properties": {"stopped": {"type": "boolean"}}}
_LISTING = {"type": "object", "required": ["replicas"], "properties": {"replicas": {"type": "array"}}}

ROUTES = {
    ("POST", "/internal/v1/replica/start"): Endpoint(start, None, body=START_BODY, responses={
        200: json_answer(_STARTED, "The replica's worker and slots."), 507: "It does not fit this node."}),
    ("POST", "/internal/v1/replica/stop"): Endpoint(stop, None, body=STOP_BODY, responses={
        200: json_answer(_STOPPED, "Whether a replica was stopped.")}),
    ("GET", "/internal/v1/replica"): Endpoint(listing, None, responses={
        200: json_answer(_LISTING, "The replicas this node runs.")}),
    ("POST", "/internal/v1/replica/generate"): Endpoint(generate, None, responses={
        200: "Engine wire frames (server/engine/wire.py)."}),
}


def register() -> None:
    from . import internal
    internal.register(ROUTES)
