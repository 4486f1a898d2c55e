"""Prometheus metrics, kept as plain counters so recording costs a dict update.

Hand-rolled rather than prometheus_client: its per-observation locking is
measurable on the request hot path, and the text format is a few lines.
"""
from __future__ import annotations

from bisect import bisect_left

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 120.0)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class RouteStats:
    """Counters of one route: answers by status and a latency histogram."""

    __slots__ = ("by_status", "buckets", "sum", "count")

    def __init__(self):
        self.by_status: dict[int, int] = {}
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, status: int, seconds: float) -> None:
        by_status = self.by_status
        by_status[status] = by_status.get(status, 0) + 1
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.sum += seconds
        self.count += 1


class Metrics:
    def __init__(self):
        self.routes: dict[tuple[str, str], RouteStats] = {}
        self.rate_limited: dict[str, int] = {}
        self.connections_refused = 0
        self.open_connections = lambda: 0

    def stats(self, app: str, route: str) -> RouteStats:
        """The stats object of a route; callers keep it to skip this lookup per request."""
        found = self.routes.get((app, route))
        if found is None:
            found = self.routes[(app, route)] = RouteStats()
        return found

    def observe(self, app: str, route: str, status: int, seconds: float) -> None:
        self.stats(app, route).observe(status, seconds)

    def rate_limit_rejected(self, group: str) -> None:
        self.rate_limited[group] = self.rate_limited.get(group, 0) + 1

    def render(self, extra_gauges: dict[str, tuple[str, float]] | None = None) -> bytes:
        out = ["# HELP stackd_http_requests_total HTTP requests answered, by route and status.",
               "# TYPE stackd_http_requests_total counter"]
        routes = sorted(self.routes.items())
        for (app, route), stats in routes:
            for status, count in sorted(stats.by_status.items()):
                out.append(f'stackd_http_requests_total{{app="{app}",route="{_label(route)}",'
                           f'status="{status}"}} {count}')
        out += ["# HELP stackd_http_request_duration_seconds Time from request head to last byte.",
                "# TYPE stackd_http_request_duration_seconds histogram"]
        for (app, route), stats in routes:
            labels = f'app="{app}",route="{_label(route)}"'
            cumulative = 0
            for bound, count in zip(LATENCY_BUCKETS, stats.buckets):
                cumulative += count
                out.append(f'stackd_http_request_duration_seconds_bucket{{{labels},le="{bound}"}} {cumulative}')
            out.append(f'stackd_http_request_duration_seconds_bucket{{{labels},le="+Inf"}} {stats.count}')
            out.append(f"stackd_http_request_duration_seconds_sum{{{labels}}} {stats.sum:.6f}")
            out.append(f"stackd_http_request_duration_seconds_count{{{labels}}} {stats.count}")
        out += ["# HELP stackd_rate_limit_rejections_total Requests refused with 429, by group.",
                "# TYPE stackd_rate_limit_rejections_total counter"]
        for group, count in sorted(self.rate_limited.items()):
            out.append(f'stackd_rate_limit_rejections_total{{group="{group}"}} {count}')
        out += ["# HELP stackd_http_open_connections Open client connections.",
                "# TYPE stackd_http_open_connections gauge",
                f"stackd_http_open_connections {self.open_connections()}",
                "# HELP stackd_http_connections_refused_total Connections refused at the connection cap.",
                "# TYPE stackd_http_connections_refused_total counter",
                f"stackd_http_connections_refused_total {self.connections_refused}"]
        for name, (help_text, value) in (extra_gauges or {}).items():
            out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        return ("\n".join(out) + "\n").encode()
