"""The dashboard's routes: a device's sampled history, the clusters as the devices last saw
them, a device's recent requests. All at level viewer; what they answer comes from the
console's own memory and database (console/dashboard): what its sampler read from each device,
the recent requests included (the node's GET /v1/requests/recent), so no page waits on a device."""
from __future__ import annotations

import math
import time
from urllib.parse import parse_qs

from ...http.errors import ApiError, ErrorKind, invalid
from ...http.openapi import json_answer
from ...http.response import Response, json_response
from ...console.dashboard import cluster as cluster_view
from ...console.dashboard.samples import FIELDS

DEFAULT_WINDOW = 15 * 60        # seconds of history when `since` is not given

_NUM, _STR, _INT = {"type": "number"}, {"type": "string"}, {"type": "integer"}
_NULL_NUM = {"type": ["number", "null"]}
METRICS = {"type": "object", "required": ["device_id", "fields", "units", "interval_seconds",
                                          "resolution", "samples", "reachable"], "properties": {
    "device_id": _STR,
    "fields": {"type": "array", "items": _STR, "description": "The name of each value of a sample, "
               "after its time: " + ", ".join(name for name, _, _ in FIELDS)},
    "units": {"type": "array", "items": _STR},
    "interval_seconds": _NUM,
    "resolution": {"enum": ["full", "minute"], "description": "minute: the oldest samples come from "
                   "the database, one a minute (mean, or max for p95, KV cache and temperature)"},
    "reachable": {"type": ["boolean", "null"], "description": "Whether the last poll was answered."},
    "error": {"type": ["string", "null"]},
    "samples": {"type": "array", "description": "[time (epoch s), value, ...] oldest first; a "
                "sample of nulls is a poll the device did not answer (a gap)",
                "items": {"type": "array", "items": _NULL_NUM}}}}
CLUSTER = {"type": "object", "required": ["object", "clusters", "devices"], "properties": {
    "object": {"const": "cluster"}, "interval_seconds": _NUM,
    "clusters": {"type": "array", "items": {"type": "object", "properties": {
        "leader": _STR, "status": _STR, "reasons": {"type": "array", "items": _STR},
        "nodes": {"type": "array", "items": {"type": "object", "properties": {
            "id": _STR, "role": _STR, "status": _STR, "leader": {"type": "boolean"},
            "degraded": {"type": "boolean"}, "reasons": {"type": "array", "items": _STR},
            "device_id": {"type": ["string", "null"]},
            "placed": {"type": "array", "items": {"type": "object"}}}}},
        "links": {"type": "array", "items": {"type": "object", "properties": {
            "source": _STR, "target": _STR, "status": _STR}}}}}},
    "devices": {"type": "array", "items": {"type": "object", "properties": {
        "id": _STR, "name": _STR, "reachable": {"type": ["boolean", "null"]},
        "error": {"type": ["string", "null"]}, "sampled_at": _NULL_NUM,
        "models": {"type": "array", "items": {"type": "object", "properties": {
            "id": _STR, "state": _STR, "split_mode": {"type": ["string", "null"]},
            "slots_busy": _NULL_NUM, "degraded": {"type": "boolean"}}}}}}}}}
REQUESTS = {"type": "object", "required": ["object", "recording", "data"], "properties": {
    "object": {"const": "list"}, "recording": {"type": ["boolean", "null"]}, "sampled_at": _NULL_NUM,
    "reachable": {"type": ["boolean", "null"], "description": "false: the last poll was not answered; "
                  "these are the requests of the last one that was"},
    "data": {"type": "array", "items": {"type": "object", "properties": {
        "time": _NUM, "model": {"type": ["string", "null"]}, "key": {"type": ["string", "null"]},
        "route": _STR, "prompt_tokens": {"type": ["integer", "null"]},
        "generated_tokens": {"type": ["integer", "null"]}, "ttft_ms": _NULL_NUM,
        "duration_ms": _NUM, "status": _INT}}}}}
ERRORS = {404: "No device with that id.", 503: "No poll of the device has read its requests yet."}


def _since(request, days: int) -> float:
    values = parse_qs(request.query).get("since")
    now = time.time()
    if not values:
        return now - DEFAULT_WINDOW
    try:
        since = float(values[-1])
    except ValueError:
        raise invalid("'since' must be a time in epoch seconds", "since") from None
    if not math.isfinite(since) or since < 0:
        raise invalid("'since' must be a time in epoch seconds", "since")
    return max(since, now - days * 86400)


async def device_metrics(console, request, device) -> Response:
    since = _since(request, console.settings.dashboard_days)
    samples, resolution = await console.history.since(device.id, since)
    view = console.fleet.views.get(device.id)
    return json_response({
        "device_id": device.id, "fields": [name for name, _, _ in FIELDS],
        "units": [unit for _, unit, _ in FIELDS], "interval_seconds": console.settings.dashboard_interval,
        "resolution": resolution, "reachable": view.reachable if view else None,
        "error": view.error if view else "not polled: beyond console.dashboard_devices",
        "samples": [[t, *values] for t, values in samples]})


def clusters(console, request) -> Response:
    scope = request.key.devices
    views = [v for v in console.fleet.views.values() if scope is None or v.id in scope]
    return json_response(cluster_view.answer(views, console.settings.dashboard_interval))


async def device_requests(console, request, device) -> Response:
    """From the last poll that answered: a page never waits on a device."""
    view = console.fleet.views.get(device.id)
    if view is None or view.requests is None:
        why = "it has not been polled yet" if view is None or view.reachable is None else \
            (view.error or "it does not serve GET /v1/requests/recent")
        raise ApiError(ErrorKind.UNAVAILABLE, f"device {device.name}'s recent requests are not known: {why}")
    return json_response({"object": "list", "recording": view.recording, "sampled_at": view.sampled_at,
                          "reachable": view.reachable, "data": view.requests})
