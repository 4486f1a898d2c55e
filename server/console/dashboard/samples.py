"""One sample of a device: what its /metrics and /v1/nodes say, turned into chart values.

Counters become rates over the time since the previous reading, histograms become the p50 and
p95 of what they observed in that time, gauges are read as they are. `FIELDS` is the one list
of a sample's values: the database's columns, the API's and the page's series follow it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import prometheus as prom

# name, unit, how a minute of them becomes one value (mean or max)
FIELDS = (
    ("generated_tps", "tokens/s", "mean"),
    ("prompt_tps", "tokens/s", "mean"),
    ("requests_running", "requests", "mean"),
    ("requests_waiting", "requests", "mean"),
    ("ttft_p50_ms", "ms", "mean"),
    ("ttft_p95_ms", "ms", "max"),
    ("itl_p50_ms", "ms", "mean"),
    ("itl_p95_ms", "ms", "max"),
    ("kv_cache_pct", "%", "max"),
    ("memory_used_mb", "MiB", "mean"),
    ("model_memory_mb", "MiB", "mean"),
    ("temperature_c", "°C", "max"),
    ("power_budget_w", "W", "mean"),
    ("power_draw_w", "W", "mean"),
)
NAMES = tuple(name for name, _, _ in FIELDS)
MIB = 1 << 20


@dataclass
class Reading:
    """What one poll of a device read: its metrics parsed, when, and its own /v1/nodes entry."""
    t: float
    series: dict
    node: dict | None


def _rate(name: str, before: Reading, after: Reading) -> float | None:
    a, b = prom.total(before.series, name), prom.total(after.series, name)
    if a is None or b is None or after.t <= before.t:
        return None
    return max(0.0, b - a) / (after.t - before.t)      # a restarted engine's counter starts over


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


def _watts(power: dict | None, field: str) -> float | None:
    value = (power or {}).get(field)
    return None if value is None else value / 1000.0


def values(before: Reading | None, after: Reading) -> tuple:
    """The sample `after` makes, following `before` (None: the first reading, no rates yet)."""
    s, node = after.series, after.node or {}
    rates = {"generated_tps": None, "prompt_tps": None}
    latency = {"ttft_p50_ms": None, "ttft_p95_ms": None, "itl_p50_ms": None, "itl_p95_ms": None}
    if before is not None:
        rates = {"generated_tps": _rate("stackd_generation_tokens_total", before, after),
                 "prompt_tps": _rate("stackd_prompt_tokens_total", before, after)}
        for short, name in (("ttft", "stackd_time_to_first_token_seconds"),
                            ("itl", "stackd_inter_token_latency_seconds")):
            was, now = prom.buckets(before.series, name), prom.buckets(s, name)
            latency[f"{short}_p50_ms"] = _ms(prom.quantile(0.5, was, now))
            latency[f"{short}_p95_ms"] = _ms(prom.quantile(0.95, was, now))
    kv = prom.largest(s, "stackd_kv_cache_usage_ratio")
    pss = prom.total(s, "stackd_model_memory_pss_bytes")
    total, available = node.get("memory_total_bytes"), node.get("memory_available_bytes")
    power = node.get("power") or {}
    budget = _watts(power, "granted_mw")
    if budget is None and node.get("power_budget"):
        budget = node["power_budget"]["max_mw"] / 1000.0      # no contract: the node's own ceiling
    out = {**rates, **latency,
           "requests_running": prom.total(s, "stackd_num_requests_running"),
           "requests_waiting": prom.total(s, "stackd_num_requests_waiting"),
           "kv_cache_pct": None if kv is None else round(kv * 100.0, 2),
           "memory_used_mb": round((total - available) / MIB, 1) if total and available is not None else None,
           "model_memory_mb": None if pss is None else round(pss / MIB, 1),
           "temperature_c": node.get("temperature_c"),
           "power_budget_w": budget,
           "power_draw_w": _watts(power, "demand_mw")}
    return tuple(out[name] for name in NAMES)


GAP = (None,) * len(FIELDS)     # a poll the device did not answer: the charts show a gap


def now() -> float:
    return round(time.time(), 3)


def combine(rows: list[tuple]) -> tuple:
    """A minute's samples as one: each field's mean or max over the samples that have it."""
    out = []
    for i, (_, _, how) in enumerate(FIELDS):
        known = [row[i] for row in rows if row[i] is not None]
        if not known:
            out.append(None)
        else:
            out.append(max(known) if how == "max" else round(sum(known) / len(known), 3))
    return tuple(out)
