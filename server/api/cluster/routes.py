"""The cluster group (port 5381): health, topology, status, nodes (from membership, on every
node: server/cluster/views.py), the power contract, metrics, the engine trace."""
from __future__ import annotations

from ...auth import permissions as perm
from ...http import validate
from ...http.errors import ApiError, ErrorKind
from ...http.openapi import json_answer
from ...http.validate import Body
from ...http.response import Response, StreamingResponse, json_response
from ...http.wire import JSON
from ...http.routing import Endpoint
from ...observe import prometheus, trace
from ...system import readings
from ..contexts import ClusterContext
from . import gate, recent
from ...cluster import views

CLUSTER = "cluster"


def health(ctx: ClusterContext, request) -> Response:
    # The body only changes once a second (uptime) or when the sensor cache refreshes,
    # so a probe hammering this endpoint reuses one encoded body.
    state = (ctx.facts.uptime_seconds(), ctx.facts.thermometer.celsius())
    cached = ctx.health_cache
    if cached is None or cached[0] != state:
        body = {"status": "ok", "uptime_seconds": state[0], "temperature_c": state[1]}
        cached = ctx.health_cache = (state, json_response(body))
    return cached[1]


def topology(ctx: ClusterContext, request) -> Response:
    return json_response(views.current(ctx.membership, "topology"))


def cluster_status(ctx: ClusterContext, request) -> Response:
    return json_response(views.current(ctx.membership, "cluster"))


def nodes(ctx: ClusterContext, request) -> Response:
    return json_response(views.current(ctx.membership, "nodes"))


def power_contract(ctx: ClusterContext, request) -> Response:
    """A power module's controller posts its capabilities; the answer is the sink's request."""
    return json_response(ctx.power.negotiate(request.json()))


def power_contract_in_force(ctx: ClusterContext, request) -> Response:
    if not ctx.membership.is_leader:
        return json_response(views.current(ctx.membership, "power") or ctx.power.in_force())
    return json_response(ctx.power.in_force())


def _engines(ctx: ClusterContext) -> dict:
    """The loaded models' engines. Their counters, histograms and trace stay readable while a
    model unloads (the observer outlives the freed model), so runner.engine is read directly."""
    return {model_id: m.runner.engine for model_id, m in ctx.models.loaded.items()}


def _on_demand_metrics(ctx: ClusterContext) -> list[str]:
    """Loads, and unloads nobody asked for (runtime/on_demand.py): to make room, or idle past
    the keep-alive."""
    on_demand = ctx.models.on_demand
    out = ["# HELP stackd_model_loads_total Times a model was loaded (asked for, preloaded or on demand).",
           "# TYPE stackd_model_loads_total counter"]
    out += [f'stackd_model_loads_total{{model="{m}"}} {n}' for m, n in sorted(on_demand.loads.items())]
    out += ["# HELP stackd_model_load_seconds_total Seconds the loads of a model took (its engine's start: "
            "the weights read, the worker ready), summed; over stackd_model_loads_total, a load's mean.",
            "# TYPE stackd_model_load_seconds_total counter"]
    out += [f'stackd_model_load_seconds_total{{model="{m}"}} {s:.3f}' for m, s in sorted(on_demand.load_seconds.items())]
    out += ["# HELP stackd_model_evictions_total Times a model was unloaded without being asked: "
            "reason memory (to make room for another), keep_alive (idle past its keep-alive).",
            "# TYPE stackd_model_evictions_total counter"]
    out += [f'stackd_model_evictions_total{{model="{m}",reason="{r}"}} {n}'
            for (m, r), n in sorted(on_demand.evictions.items())]
    return out


def _worker_metrics(ctx: ClusterContext) -> bytes:
    on_demand = _on_demand_metrics(ctx)
    if not ctx.models.loaded:
        return ("\n".join(on_demand) + "\n").encode()
    out = on_demand + ["# HELP stackd_model_restarts_total Times a model's worker process was restarted after dying.",
           "# TYPE stackd_model_restarts_total counter"]
    out += [f'stackd_model_restarts_total{{model="{m}"}} {model.restarts}'
            for m, model in ctx.models.loaded.items()]
    out += ["# HELP stackd_model_memory_pss_bytes Proportional set size of a model's worker process.",
            "# TYPE stackd_model_memory_pss_bytes gauge"]
    for m, model in ctx.models.loaded.items():
        pid = model.runner.engine.pid
        pss = readings.pss_bytes(pid) if pid else None
        if pss is not None:
            out.append(f'stackd_model_memory_pss_bytes{{model="{m}"}} {pss}')
    return ("\n".join(out) + "\n").encode()


def _cluster_gauges(membership) -> dict:
    nodes = membership.nodes()
    return {"stackd_cluster_nodes": ("Nodes this node knows of, itself included.", len(nodes)),
            "stackd_cluster_nodes_up": ("Of those, the nodes that are up.",
                                        sum(n.status == "up" for n in nodes)),
            "stackd_cluster_fenced": ("1 while this follower has lost its leader.", int(membership.fenced))}


def metrics(ctx: ClusterContext, request) -> Response:
    gauges = {"stackd_uptime_seconds": ("Seconds since the daemon started.", ctx.facts.uptime_seconds()),
              **_cluster_gauges(ctx.membership)}
    return Response(200, ctx.metrics.render(gauges) + prometheus.render(_engines(ctx)) + _worker_metrics(ctx),
                    b"text/plain; version=0.0.4; charset=utf-8")


async def debug_trace(ctx: ClusterContext, request) -> StreamingResponse:
    body = request.json()
    seconds = trace.seconds_of(body)
    model_id = validate.string(body, "model", required=False, max_len=256)
    engines = _engines(ctx)
    if model_id is not None:
        if model_id not in engines:
            raise ApiError(ErrorKind.MODEL_NOT_FOUND, f"the model '{model_id}' is not loaded", param="model")
        engines = {model_id: engines[model_id]}
    recorded = await trace.record(ctx, engines, seconds, ctx.trace_reply_timeout)
    return StreamingResponse(recorded.stream(), JSON)


# What the handlers above answer, for the OpenAPI document.
_INT, _STR, _NUM = {"type": "integer"}, {"type": "string"}, {"type": "number"}


def _obj(properties: dict) -> dict:
    return {"type": "object", "required": list(properties), "properties": properties}


HEALTH = _obj({"status": {"const": "ok"}, "uptime_seconds": _INT,
               "temperature_c": {"type": ["number", "null"]}})
_AGE = {"type": ["integer", "null"], "description": "On a follower: how old the leader's view is (ms)."}
_STATUS = {"enum": ["up", "down"]}
_ROLE = {"enum": ["leader", "follower"]}
TOPOLOGY = _obj({"cluster_id": _STR, "node_count": _INT, "leader": {"type": ["string", "null"]}, "nodes": {
    "type": "array", "items": _obj({"id": _STR, "role": _ROLE, "ram_gb": _INT, "status": _STATUS,
                                    "last_seen_ago_ms": _INT, "address": _STR})}})
TOPOLOGY["properties"]["view_age_ms"] = _AGE
CLUSTER_STATUS = _obj({"status": {"enum": ["healthy", "degraded", "unavailable"]}, "total_ram_gb": _INT,
                       "active_model": {"type": ["string", "null"]}, "node_count": _INT, "nodes_up": _INT,
                       "leader": {"type": ["string", "null"]},
                       "reasons": {"type": "array", "items": _STR}})
CLUSTER_STATUS["properties"]["view_age_ms"] = _AGE
CLUSTER_STATUS["properties"]["links"] = {
    "type": "array", "description": "each measured link: round trip in microseconds, best of 3 TCP connects",
    "items": _obj({"from": _STR, "to": _STR, "rtt_us": _NUM})}
CLUSTER_STATUS["properties"]["placements"] = {
    "type": "array", "description": "models placed over several nodes: the split, its nodes and why "
                                    "(a tensor split: its basis and the link model's prediction)",
    "items": {"type": "object", "required": ["model", "split_mode", "nodes"],
              "properties": {"model": _STR, "split_mode": {"enum": ["layer", "tensor"]},
                             "nodes": {"type": "array"}, "reason": _STR}}}
NODE = _obj({
    "id": _STR, "role": _ROLE, "status": _STATUS, "address": _STR, "last_seen_ago_ms": _INT,
    "hostname": _STR, "ram_gb": _INT, "cpu_cores": {"type": ["integer", "null"]}, "threads": _INT,
    "compute": {"type": "number", "minimum": 0,
                "description": "its measured compute in GFLOP/s (a decode-shaped matmul on its engine "
                               "threads), what a layer split's counts follow; 0: not measured yet"},
    "load_average": {"type": ["array", "null"], "items": _NUM},
    "memory_total_bytes": _INT, "memory_available_bytes": _INT, "model_memory_bytes": _INT,
    "disk_free_bytes": _INT, "temperature_c": {"type": ["number", "null"]}, "uptime_seconds": _INT,
    "system_uptime_seconds": _INT, "loaded_models": {"type": "array", "items": _STR},
    "power": {"type": ["object", "null"]},
    "power_budget": _obj({"idle_mw": _INT, "max_mw": _INT})})
NODE["properties"]["links"] = {"type": "object", "additionalProperties": _NUM,
                               "description": "round trip to each peer (µs), best of 3 TCP connects"}
NODES = _obj({"object": {"const": "list"}, "data": {"type": "array", "items": NODE}})
NODES["properties"]["view_age_ms"] = _AGE
METRICS = {"description": "Prometheus text exposition (version 0.0.4).",
           "content": {"text/plain": {"schema": {"type": "string"}}}}


def _answers(schema: dict, description: str) -> dict:
    return {200: json_answer(schema, description)}


ROUTES = {
    ("GET", "/v1/health"): Endpoint(health, perm.CLUSTER_READ, CLUSTER,
                                    responses=_answers(HEALTH, "The node is up.")),
    ("GET", "/v1/topology"): Endpoint(topology, perm.CLUSTER_READ, CLUSTER,
                                      responses=_answers(TOPOLOGY, "The cluster's nodes and leader.")),
    ("GET", "/v1/cluster"): Endpoint(cluster_status, perm.CLUSTER_READ, CLUSTER,
                                     responses=_answers(CLUSTER_STATUS, "The cluster's status.")),
    ("GET", "/v1/nodes"): Endpoint(nodes, perm.CLUSTER_READ, CLUSTER,
                                   responses=_answers(NODES, "Every node with its readings.")),
    # The power contract's fields are checked in server/cluster/power (not yet with specs):
    # documented as any object until they are.
    ("POST", "/v1/power/contract"): Endpoint(
        power_contract, perm.CLUSTER_WRITE, CLUSTER, summary="Negotiate a power contract",
        body=Body(doc="The source's capabilities (USB PD power data objects)."),
        responses=_answers({"type": "object"}, "The sink's request and the contract.")),
    ("GET", "/v1/power/contract"): Endpoint(
        power_contract_in_force, perm.CLUSTER_READ, CLUSTER, summary="The power contract in force",
        responses=_answers({}, "The contract in force.")),
    ("GET", "/metrics"): Endpoint(metrics, perm.CLUSTER_READ, CLUSTER, summary="Prometheus metrics",
                                  responses={200: METRICS}),
    ("POST", "/v1/debug/trace"): Endpoint(
        debug_trace, perm.CLUSTER_WRITE, CLUSTER, summary="Record an engine trace",
        body=Body(doc='{"seconds": 1..60, "model"?}: record for that long, one trace at a time.'),
        responses=_answers({"type": "object"}, "Chrome trace event JSON ({\"traceEvents\": [...]})")),
    **recent.ROUTES,
}


def leader_only_routes(membership) -> dict:
    """A follower's cluster group: the same, but the power contract is negotiated by the leader
    (a follower shows the leader's contract it last received)."""
    negotiate = ("POST", "/v1/power/contract")
    return {**ROUTES, **gate.leader_only({negotiate: ROUTES[negotiate]}, membership)}
