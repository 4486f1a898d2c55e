"""What the cluster read routes answer: /v1/topology, /v1/cluster, /v1/nodes.

The leader builds them from its membership; a follower answers with the leader's view it last
received plus `view_age_ms` (how old that view is, by its own clock), and with status
`unavailable` while it is fenced (or has never reached its leader).
"""
from __future__ import annotations

import os
import socket

from ..system import readings

MIB = 1 << 20


def own_entry(node, membership) -> dict:
    """This node's /v1/nodes entry, as it reports itself (and heartbeats it to the leader)."""
    memory = readings.meminfo()
    settings = node.settings
    power = settings["power"]
    return {
        "id": node.identity.node_id,
        "role": membership.role,
        "status": "up",
        "address": membership.address,
        "last_seen_ago_ms": 0,
        "hostname": socket.gethostname(),
        "ram_gb": readings.ram_gb(memory["MemTotal"]),
        "cpu_cores": os.cpu_count(),
        "threads": settings["engine.threads"] or os.cpu_count() or 1,
        "load_average": readings.load_average(),
        "memory_total_bytes": memory["MemTotal"],
        "memory_available_bytes": memory["MemAvailable"],
        "model_memory_bytes": model_memory_bytes(settings, memory["MemAvailable"]),
        "disk_free_bytes": readings.disk_free(settings.data_dir),
        "temperature_c": node.thermometer.celsius(),
        "uptime_seconds": node.uptime_seconds(),
        "system_uptime_seconds": int(readings.system_uptime()),
        "loaded_models": node.loaded_models,
        "memory_pss_bytes": readings.pss_bytes(os.getpid()),
        "power": _own_power(node, membership),
        "power_budget": {"idle_mw": power["idle_mw"], "max_mw": power["max_mw"]},
        "rpc": membership.rpc_state() if membership.rpc_state is not None else None,
        "models": model_processes(node),
    }


def model_memory_bytes(settings, available: int) -> int:
    """What this node offers to models: its available memory less the reserve, capped by
    models.memory_limit_mb when that setting exists and is set (0 = no cap)."""
    models = settings.values["models"]
    offered = max(0, available - models["memory_reserve_mb"] * MIB)
    limit = models.get("memory_limit_mb", 0) * MIB
    return min(offered, limit) if limit else offered


def _own_power(node, membership) -> dict | None:
    if membership.follower is not None:
        return membership.follower.power
    return node.power.allocation(node.identity.node_id) if node.power is not None else None


def model_processes(node) -> list[dict]:
    """Each loaded model's engine: where it runs, its memory, and how often it was restarted."""
    if node.models is None:
        return []
    out = []
    for model_id, model in node.models.loaded.items():
        engine = model.runner.engine
        out.append({"id": model_id, "isolation": engine.isolation, "pid": engine.pid,
                    "state": node.models.state(model_id),
                    "memory_pss_bytes": readings.pss_bytes(engine.pid) if engine.pid else None,
                    "restarts": model.restarts,
                    "last_exit": node.models.last_exits.get(model_id)})
    return out


# ---- the leader's view ---------------------------------------------------------------------------

def leader_view(node, membership) -> dict:
    entries = membership.node_entries()
    return {"topology": _topology(node, membership, entries),
            "cluster": _cluster(node, membership, entries),
            "nodes": {"object": "list", "data": entries},
            "power": node.power.in_force() if node.power is not None else None}


def _topology(node, membership, entries: list[dict]) -> dict:
    return {"cluster_id": node.identity.cluster_id, "node_count": len(entries),
            "leader": membership.self_id,
            "nodes": [{"id": e["id"], "role": e["role"], "ram_gb": e["ram_gb"], "status": e["status"],
                       "last_seen_ago_ms": e["last_seen_ago_ms"], "address": e["address"]}
                      for e in entries]}


def _cluster(node, membership, entries: list[dict]) -> dict:
    up = [e for e in entries if e["status"] == "up"]
    reasons = [f"node {e['id']} is down" for e in entries if e["status"] != "up"]
    reasons += [f"model {m} is placed on fewer nodes than it was" for m in _degraded_models(node)]
    return {"status": "degraded" if reasons else "healthy",
            "total_ram_gb": readings.ram_gb(sum(e["memory_total_bytes"] for e in up)),
            "active_model": node.active_model, "node_count": len(entries), "nodes_up": len(up),
            "leader": membership.self_id, "reasons": reasons}


def _degraded_models(node) -> list[str]:
    """Models the model manager placed again on fewer nodes than they were."""
    degraded = getattr(node.models, "degraded_models", None)
    return degraded() if degraded is not None else []


# ---- what a route answers, on either role ---------------------------------------------------------

def current(node, membership, part: str) -> dict:
    """One part (topology, cluster, nodes) of the view this node answers with."""
    if membership.follower is None:
        return leader_view(node, membership)[part]
    state = membership.follower
    if state.view is None:
        view = leader_view(node, membership)      # never reached the leader: this node alone
        view["topology"]["leader"] = None
    else:
        view = {name: dict(value) if isinstance(value, dict) else value for name, value in state.view.items()}
        view["nodes"]["data"] = membership.node_entries()
    answer = view[part]
    if answer is None:
        return None
    answer["view_age_ms"] = membership.view_age_ms() if state.view is not None else None
    if part == "cluster" and state.fenced:
        answer["status"] = "unavailable"
        answer["reasons"] = [f"this follower has lost its leader at {state.leader_address}"]
    return answer
