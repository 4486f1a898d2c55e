"""The engines' counters, histograms and gauges as Prometheus text, one series per model.

Names, labels and help come from the native lists (server._engine COUNTERS, HISTOGRAMS,
GAUGES: native/engine/counters.h and timings.h), so nothing here repeats them.
"""
from __future__ import annotations

from ..engine.core import COUNTERS, GAUGES, HISTOGRAMS

PREFIX = "stackd_"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _header(out: list[str], name: str, kind: str, help_text: str) -> None:
    out.append(f"# HELP {PREFIX}{name} {help_text}")
    out.append(f"# TYPE {PREFIX}{name} {kind}")


def _counters(out: list[str], stats: dict[str, dict]) -> None:
    seen = set()
    for _, name, _, help_text in COUNTERS:            # one header per name (labelled counters share it)
        if name in seen:
            continue
        seen.add(name)
        _header(out, name, "counter", help_text)
        for field, other, labels, _ in COUNTERS:
            if other != name:
                continue
            extra = f",{labels}" if labels else ""
            out += [f'{PREFIX}{name}{{model="{m}"{extra}}} {s.get(field, 0)}' for m, s in stats.items()]


def _histograms(out: list[str], metrics: dict[str, dict]) -> None:
    for field, name, help_text in HISTOGRAMS:
        _header(out, name, "histogram", help_text)
        for model, m in metrics.items():
            bounds, counts, total = m["histograms"][field]
            cumulative = 0
            for bound, count in zip(bounds, counts):
                cumulative += count
                out.append(f'{PREFIX}{name}_bucket{{model="{model}",le="{bound:g}"}} {cumulative}')
            cumulative += counts[-1]
            out.append(f'{PREFIX}{name}_bucket{{model="{model}",le="+Inf"}} {cumulative}')
            out.append(f'{PREFIX}{name}_sum{{model="{model}"}} {total:.6f}')
            out.append(f'{PREFIX}{name}_count{{model="{model}"}} {cumulative}')


def _gauges(out: list[str], metrics: dict[str, dict]) -> None:
    for field, name, help_text in GAUGES:
        _header(out, name, "gauge", help_text)
        out += [f'{PREFIX}{name}{{model="{model}"}} {_number(m["gauges"][field])}'
                for model, m in metrics.items()]


def _acceptance(out: list[str], stats: dict[str, dict]) -> None:
    """Derived from two counters, for a dashboard without PromQL: over the engine's life."""
    _header(out, "spec_decode_acceptance_ratio", "gauge",
            "Drafted tokens accepted over drafted tokens verified, since the engine started (0: none drafted).")
    for model, s in stats.items():
        drafted = s.get("n_draft_tokens", 0)
        ratio = s.get("n_draft_accepted_tokens", 0) / drafted if drafted else 0.0
        out.append(f'{PREFIX}spec_decode_acceptance_ratio{{model="{model}"}} {_number(ratio)}')


# A tensor split's leader worker adds these to its stats (engine/worker.py send_stats).
TENSOR_COUNTERS = (
    ("tensor_exchanges", "tensor_exchanges_total",
     "Exchanges of a tensor split: partial sums all-reduced with every peer and vocabulary rows "
     "gathered, 2 x layers + 1 per decode graph."),
    ("tensor_exchange_bytes", "tensor_exchange_bytes_total",
     "Bytes this node's worker sent to its tensor split's peers (frames, headers and tags included)."),
    ("tensor_exchange_seconds", "tensor_exchange_seconds_total",
     "Time the leader's worker spent in exchanges (sending, waiting for its peers, checking): what "
     "the split adds to its steps beyond their compute."))


def _tensor(out: list[str], stats: dict[str, dict]) -> None:
    split = {model: s for model, s in stats.items() if "tensor_exchanges" in s}
    if not split:
        return
    for field, name, help_text in TENSOR_COUNTERS:
        _header(out, name, "counter", help_text)
        out += [f'{PREFIX}{name}{{model="{m}"}} {_number(s.get(field, 0))}' for m, s in split.items()]


def render(engines: dict) -> bytes:
    """engines: model id -> engine (inline, or a worker's client, whose figures are those of its
    last push, once a second). Every series is there for every model, even at zero, once the
    engine has reported."""
    stats, metrics = {}, {}
    for model_id, engine in engines.items():
        label = _escape(model_id)
        stats[label] = engine.stats()
        reported = engine.metrics()
        if reported is not None:
            metrics[label] = reported
    out: list[str] = []
    _counters(out, stats)
    _acceptance(out, stats)
    _tensor(out, stats)
    _histograms(out, metrics)
    _gauges(out, metrics)
    return ("\n".join(out) + "\n").encode()
