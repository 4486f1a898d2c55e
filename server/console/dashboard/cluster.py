"""GET /api/cluster's answer, from the devices' latest polls: each cluster's nodes and links
(the leader marked), a node or model in trouble with the reason its leader gives, each model's
replicas and shards on the node that runs them, and each device's models and slots in use."""
from __future__ import annotations

import re

from .fleet import DeviceView

_NODE_IN = re.compile(r"\bnode (\S+?)[ ,;)]")


def _reasons_by_node(reasons: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for reason in reasons:
        for node in _NODE_IN.findall(reason + " "):
            out.setdefault(node, []).append(reason)
    return out


def _placements(models: list[dict]) -> dict[str, list[dict]]:
    """node id -> what of each loaded model runs there (a replica, layers, a tensor share)."""
    out: dict[str, list[dict]] = {}
    for model in models:
        placement = model.get("placement") or {}
        mode = placement.get("split_mode")
        if model.get("replicas"):
            for replica in model["replicas"]:
                out.setdefault(replica["node"], []).append({
                    "model": model["id"], "split_mode": "replica", "state": replica.get("state"),
                    "in_flight": replica.get("in_flight")})
            continue
        for node in placement.get("nodes", ()):
            part = {"model": model["id"], "split_mode": mode, "state": model.get("state")}
            if "layers" in node:
                part["layers"] = node["layers"]
            if "share" in node:
                part["share"] = node["share"]
            out.setdefault(node["id"], []).append(part)
    return out


def model_entry(model: dict, slots_busy: dict) -> dict:
    placement = model.get("placement") or {}
    return {"id": model["id"], "kind": model.get("kind"), "state": model.get("state"),
            "split_mode": placement.get("split_mode"),
            "nodes": [n.get("id") for n in placement.get("nodes", ())],
            "slots_busy": slots_busy.get(model["id"]), "error": model.get("error"),
            "degraded": False}


def device_entry(view: DeviceView) -> dict:
    return {"id": view.id, "name": view.name, "reachable": view.reachable, "error": view.error,
            "sampled_at": view.sampled_at, "polled_at": view.polled_at,
            "node_id": (view.node or {}).get("id"),
            "cluster_status": (view.cluster or {}).get("status"),
            "models": [model_entry(m, view.slots_busy) for m in view.models]}


def answer(views: list[DeviceView], interval: float) -> dict:
    """One cluster per leader the devices report; the freshest device that answers for a
    leader describes it. A device that does not answer is a node of its own, down."""
    clusters: dict[str, dict] = {}
    devices = [device_entry(v) for v in views]
    by_node = {}
    for view, entry in zip(views, devices):
        if entry["node_id"]:
            by_node[entry["node_id"]] = view.id
        for model in entry["models"]:
            model["degraded"] = any(f"model {model['id']} " in r
                                    for r in (view.cluster or {}).get("reasons", ()))
    for view in sorted(views, key=lambda v: v.sampled_at or 0, reverse=True):
        cluster = view.cluster or {}
        leader = cluster.get("leader")
        if not view.reachable or leader is None or leader in clusters:
            continue
        reasons = cluster.get("reasons", [])
        why = _reasons_by_node(reasons)
        placed = _placements(view.models)
        nodes = []
        for node in view.nodes:
            node_id = node.get("id")
            nodes.append({"id": node_id, "role": node.get("role"), "status": node.get("status"),
                          "leader": node_id == leader, "address": node.get("address"),
                          "degraded": node.get("status") != "up" or bool(why.get(node_id)),
                          "reasons": why.get(node_id, []), "device_id": by_node.get(node_id),
                          "temperature_c": node.get("temperature_c"),
                          "placed": placed.get(node_id, [])})
        clusters[leader] = {"leader": leader, "status": cluster.get("status"), "reasons": reasons,
                            "described_by": view.id, "nodes": nodes,
                            "links": [{"source": leader, "target": n["id"], "status": n["status"]}
                                      for n in nodes if n["id"] != leader]}
    return {"object": "cluster", "interval_seconds": interval, "clusters": list(clusters.values()),
            "devices": devices}
