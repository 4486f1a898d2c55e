"""What the cluster read routes answer: /v1/topology, /v1/cluster, /v1/nodes.

The leader builds them from its membership; a follower answers with the leader's view it last
received plus `view_age_ms` (how old that view is, by its own clock), and with status
`unavailable` while it is fenced (or has never reached its leader).
"""
from __future__ import annotations

import os
import socket

from ..system import readings
from .links import cluster_links

MIB = 1 << 20


def own_entry(membership) -> dict:
    """This node's /v1/nodes entry, as it reports itself (and heartbeats it to the leader)."""
    facts, local = membership.facts, membership.local
    memory = readings.meminfo()
    settings = facts.settings
    power = settings["power"]
    return {
        "id": facts.node_id,
        "role": membership.role,
        "status": "up",
        "address": membership.address,
        "last_seen_ago_ms": 0,
        "hostname": socket.gethostname(),
        "ram_gb": readings.ram_gb(memory["MemTotal"]),
        "cpu_cores": os.cpu_count(),
        "threads": settings["engine.threads"] or os.cpu_count() or 1,
        "compute": round(facts.compute.value, 3),   # GFLOP/s measured (compute_speed.py); 0: not yet
        "links": membership.links.entry(),           # {peer: round trip in us} (links.py)
        "load_average": readings.load_average(),
        "memory_total_bytes": memory["MemTotal"],
        "memory_available_bytes": memory["MemAvailable"],
        "model_memory_bytes": model_memory_bytes(settings, memory["MemAvailable"]),
        "disk_free_bytes": readings.disk_free(settings.data_dir),
        "temperature_c": facts.thermometer.celsius(),
        "uptime_seconds": facts.uptime_seconds(),
        "system_uptime_seconds": int(readings.system_uptime()),
        "loaded_models": local.loaded_models(),
        "memory_pss_bytes": readings.pss_bytes(os.getpid()),
        "power": _own_power(membership),
        "power_budget": {"idle_mw": power["idle_mw"], "max_mw": power["max_mw"]},
        "rpc": membership.rpc_state() if membership.rpc_state is not None else None,
        "models": local.model_processes(),
        "replicas": local.replica_offer(),
    }


def model_memory_bytes(settings, available: int) -> int:
    """What this node offers to models: its available memory less the reserve, capped by
    models.memory_limit_mb when that setting exists and is set (0 = no cap)."""
    models = settings.values["models"]
    offered = max(0, available - models["memory_reserve_mb"] * MIB)
    limit = models.get("memory_limit_mb", 0) * MIB
    return min(offered, limit) if limit else offered


def _own_power(membership) -> dict | None:
    if membership.follower is not None:
        return membership.follower.power
    return membership.local.power_allocation(membership.self_id)


# ---- the leader's view ---------------------------------------------------------------------------

def leader_view(membership) -> dict:
    entries = membership.node_entries()
    return {"topology": _topology(membership, entries),
            "cluster": _cluster(membership, entries),
            "nodes": {"object": "list", "data": entries},
            "power": membership.local.power_in_force()}


def _topology(membership, entries: list[dict]) -> dict:
    return {"cluster_id": membership.facts.identity.cluster_id, "node_count": len(entries),
            "leader": membership.self_id,
            "nodes": [{"id": e["id"], "role": e["role"], "ram_gb": e["ram_gb"], "status": e["status"],
                       "last_seen_ago_ms": e["last_seen_ago_ms"], "address": e["address"]}
                      for e in entries]}


def _cluster(membership, entries: list[dict]) -> dict:
    up = [e for e in entries if e["status"] == "up"]
    reasons = [f"node {e['id']} is down" for e in entries if e["status"] != "up"]
    reasons += membership.local.degraded_reasons()
    return {"status": "degraded" if reasons else "healthy",
            "total_ram_gb": readings.ram_gb(sum(e["memory_total_bytes"] for e in up)),
            "active_model": membership.local.active_model(), "node_count": len(entries),
            "nodes_up": len(up), "leader": membership.self_id, "reasons": reasons,
            "links": cluster_links(entries),
            "placements": getattr(membership.local, "placements", list)()}   # splits, and why


# ---- what a route answers, on either role ---------------------------------------------------------

def current(membership, part: str) -> dict:
    """One part (topology, cluster, nodes) of the view this node answers with."""
    if membership.follower is None:
        return leader_view(membership)[part]
    state = membership.follower
    if state.view is None:
        view = leader_view(membership)            # never reached the leader: this node alone
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
