"""The sampler: every `interval` seconds, each device's /metrics, /v1/nodes, /v1/cluster and
/v1/requests/recent (cluster port) and /v1/models (inference port), read with the device's key through the
console's one client. Each device is polled on its own: one that does not answer costs its own
sample (a gap on its charts), never the others' or the page's, which read only from here.

The number of open pages changes nothing on the nodes: they are polled by the console, once per
interval, however many people watch.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import orjson

from ..errors import Refused
from . import prometheus as prom
from .history import History
from .samples import GAP, Reading, values

log = logging.getLogger("stackd.console")
RECENT = 50                 # recent requests read per poll
PRUNE_EVERY = 600.0         # seconds between deletions of minutes older than the retention


@dataclass
class DeviceView:
    """The latest of one device, as the page shows it."""
    id: str
    name: str
    cluster_url: str
    reachable: bool | None = None        # None: not polled yet
    error: str | None = None
    sampled_at: float | None = None      # the last poll that answered
    polled_at: float | None = None
    node: dict | None = None             # its own /v1/nodes entry
    nodes: list = field(default_factory=list)
    cluster: dict | None = None
    models: list = field(default_factory=list)
    slots_busy: dict = field(default_factory=dict)
    requests: list | None = None         # its /v1/requests/recent, newest first
    recording: bool | None = None
    reading: Reading | None = None       # the previous answer, for rates
    busy: asyncio.Task | None = None     # its poll still running


def _own_entry(nodes: list[dict], cluster_url: str, cluster: dict | None) -> dict | None:
    for entry in nodes:
        if (entry.get("address") or "").rstrip("/") == cluster_url:
            return entry
    if len(nodes) == 1:
        return nodes[0]
    leader = (cluster or {}).get("leader")
    return next((e for e in nodes if e.get("id") == leader), None)


class Fleet:
    def __init__(self, devices, upstream_of, history: History, *, interval: float,
                 max_devices: int, timeout: float):
        self.devices = devices            # console.devices.Devices
        self.upstream_of = upstream_of    # () -> the console's Upstream (made at start)
        self.history = history
        self.interval = interval
        self.max_devices = max_devices
        self.timeout = timeout
        self.views: dict[str, DeviceView] = {}
        self.polls = 0
        self._last_prune = 0.0

    async def tick(self) -> None:
        """One round: start each device's poll; a device whose previous poll still runs gets a
        gap for this round instead of a second poll."""
        listing = (await self.devices.listing())[:self.max_devices]
        keep = {d["id"] for d in listing}
        for device_id in [d for d in self.views if d not in keep]:
            del self.views[device_id]
        self.history.forget(keep)
        now = round(time.time(), 3)
        closed = []
        for device in listing:
            view = self.views.get(device["id"])
            if view is None or view.cluster_url != device["cluster_url"]:
                view = self.views[device["id"]] = DeviceView(device["id"], device["name"],
                                                             device["cluster_url"])
            view.name = device["name"]
            if view.busy is not None and not view.busy.done():
                view.reachable, view.error = False, f"no answer within {self.interval:g} s"
                closed += self._keep(view.id, now, GAP)
            else:
                view.busy = asyncio.create_task(self._poll(view, device, now))
        self.polls += 1
        await self.history.write(closed)
        if now - self._last_prune > PRUNE_EVERY:
            self._last_prune = now
            await self.history.prune(now)

    async def wait(self) -> None:
        """Let the polls under way end (each is bounded by the timeout): at close."""
        busy = [v.busy for v in self.views.values() if v.busy is not None]
        await asyncio.gather(*busy, return_exceptions=True)

    def _keep(self, device_id: str, t: float, sample: tuple) -> list:
        closed = self.history.add(device_id, t, sample)
        return [] if closed is None else [(device_id, *closed)]

    async def _poll(self, view: DeviceView, device: dict, t: float) -> None:
        try:
            await self._read(view, device, t)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("dashboard: polling device %s failed", view.name)

    async def _read(self, view: DeviceView, device: dict, t: float) -> None:
        upstream = self.upstream_of()
        row = await self.devices.get(device["id"])
        key = self.devices.api_key(row)
        cluster_url, inference_url = row.cluster_url, row.inference_url
        answers = await asyncio.gather(
            upstream.read(cluster_url + "/metrics", key, self.timeout),
            upstream.read(cluster_url + "/v1/nodes", key, self.timeout),
            upstream.read(cluster_url + "/v1/cluster", key, self.timeout),
            upstream.read(inference_url + "/v1/models", key, self.timeout),
            upstream.read(cluster_url + f"/v1/requests/recent?limit={RECENT}", key, self.timeout),
            return_exceptions=True)
        view.polled_at = t
        metrics, nodes, cluster, models, recent = answers
        if isinstance(metrics, BaseException):
            view.reachable = False
            view.error = str(metrics) if isinstance(metrics, Refused) else type(metrics).__name__
            view.reading = None          # the next rates start afresh after the gap
            await self.history.write(self._keep(view.id, t, GAP))
            return
        view.reachable, view.error, view.sampled_at = True, None, t
        view.nodes = _json(nodes, {}).get("data", view.nodes)
        view.cluster = _json(cluster, None)
        view.models = [m for m in _json(models, {}).get("data", []) if m.get("state") != "available"]
        recent = _json(recent, None)
        view.requests = recent.get("data") if recent else None     # None: a node without the route
        view.recording = recent.get("recording") if recent else None
        view.node = _own_entry(view.nodes, view.cluster_url, view.cluster)
        # rates over the times the answers came (the round's time is the sample's place on the chart)
        reading = Reading(time.time(), prom.parse(metrics.decode("utf-8", "replace")), view.node)
        view.slots_busy = prom.by_label(reading.series, "stackd_slots_busy", "model")
        sample = values(view.reading, reading)
        view.reading = reading
        await self.history.write(self._keep(view.id, t, sample))


def _json(answer, default):
    if isinstance(answer, BaseException):
        return default
    try:
        return orjson.loads(answer)
    except orjson.JSONDecodeError:
        return default
