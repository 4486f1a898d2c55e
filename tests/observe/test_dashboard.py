"""The Grafana dashboard in docs/observe queries only metrics that /metrics serves."""
import json
import os
import re

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "docs", "observe", "grafana-dashboard.json")


def queries(node) -> list[str]:
    """Every PromQL string in the dashboard: targets' expr and the templating queries."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            else:
                found += queries(value)
    elif isinstance(node, list):
        for item in node:
            found += queries(item)
    return found


def test_every_metric_the_dashboard_queries_is_served(client):
    dashboard = json.load(open(DASHBOARD))
    names = {name for q in queries(dashboard) for name in re.findall(r"\bstackd_[a-z0-9_]+", q)}
    assert len(names) >= 12
    client.metrics_text()                 # the HTTP series exist once a request has been answered
    served = {re.split(r"[{ ]", line, 1)[0] for line in client.metrics_text().splitlines()
              if line and not line.startswith("#")}
    assert sorted(names - served) == []


def test_the_dashboard_covers_what_the_issue_asks():
    text = open(DASHBOARD).read()
    for needed in ("stackd_generation_tokens_total", "stackd_time_to_first_token_seconds_bucket",
                   "stackd_inter_token_latency_seconds_bucket", "stackd_num_requests_waiting",
                   "stackd_kv_cache_usage_ratio", "stackd_engine_errors_total"):
        assert needed in text, needed
