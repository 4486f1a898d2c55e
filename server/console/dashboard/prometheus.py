"""Read the Prometheus text a node's /metrics answers with (version 0.0.4, no timestamps)."""
from __future__ import annotations

import re

_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """name -> [(labels, value), ...]; comment lines and lines it cannot read are skipped."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        head, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        name, brace, rest = head.partition("{")
        labels = dict(_LABEL.findall(rest)) if brace else {}
        out.setdefault(name.strip(), []).append((labels, number))
    return out


def total(series: dict, name: str) -> float | None:
    """The sum of a series over its labels (every model's); None when the node has none."""
    found = series.get(name)
    return sum(value for _, value in found) if found else None


def largest(series: dict, name: str) -> float | None:
    found = series.get(name)
    return max(value for _, value in found) if found else None


def by_label(series: dict, name: str, label: str) -> dict[str, float]:
    return {labels.get(label, ""): value for labels, value in series.get(name, ())}


def buckets(series: dict, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts, added up over its models: upper bound -> count."""
    out: dict[float, float] = {}
    for labels, value in series.get(name + "_bucket", ()):
        bound = float(labels.get("le", "nan"))
        out[bound] = out.get(bound, 0.0) + value
    return out


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The q-quantile of what a histogram observed between two readings, interpolated inside
    its bucket as Prometheus' histogram_quantile does; None when it observed nothing."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not bounds or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, count
    return lower
