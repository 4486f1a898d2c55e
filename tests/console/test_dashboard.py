"""The dashboard's data without a browser: reading Prometheus text, samples from two readings,
the history's bounds (memory and database, on both backends), the settings' limits at their
edges, the three /api routes (levels, errors, OpenAPI), the sampler against a scripted node
that answers, then stops answering, and the node-side recorder of recent requests."""
from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from stackd.api.cluster.recent import recording
from stackd.auth import permissions as perm
from stackd.auth.guard import KeyGuard
from stackd.auth.ratelimit import RateLimiter
from stackd.console.dashboard import prometheus as prom
from stackd.console.dashboard.history import History
from stackd.console.dashboard.samples import GAP, NAMES, Reading, combine, values
from stackd.console.service import DASHBOARD_LIMITS, ConsoleSettings
from stackd.http.response import Response, StreamingResponse, json_response
from stackd.http.routing import App, Endpoint
from stackd.observe.recent import RecentRequests

pytestmark = pytest.mark.slow

METRICS = """# HELP stackd_generation_tokens_total x
# TYPE stackd_generation_tokens_total counter
stackd_generation_tokens_total{model="tiny"} {gen}
stackd_generation_tokens_total{model="b"} 0
stackd_prompt_tokens_total{model="tiny"} {prompt}
stackd_num_requests_running{model="tiny"} 3
stackd_num_requests_waiting{model="tiny"} 1
stackd_kv_cache_usage_ratio{model="tiny"} 0.25
stackd_slots_busy{model="tiny"} 3
stackd_model_memory_pss_bytes{model="tiny"} 104857600
stackd_time_to_first_token_seconds_bucket{model="tiny",le="0.1"} {b1}
stackd_time_to_first_token_seconds_bucket{model="tiny",le="0.2"} {b2}
stackd_time_to_first_token_seconds_bucket{model="tiny",le="+Inf"} {b2}
"""


def metrics_text(gen: int, prompt: int = 0, b1: int = 0, b2: int = 0) -> str:
    return (METRICS.replace("{gen}", str(gen)).replace("{prompt}", str(prompt))
            .replace("{b1}", str(b1)).replace("{b2}", str(b2)))


NODE = {"id": "n1", "role": "leader", "status": "up", "address": "", "memory_total_bytes": 8 << 30,
        "memory_available_bytes": 6 << 30, "temperature_c": 51.5,
        "power": {"granted_mw": 12000, "demand_mw": 9000}, "power_budget": {"idle_mw": 2000, "max_mw": 15000}}


def test_prometheus_text_is_read_and_quantiles_interpolate():
    series = prom.parse(metrics_text(10, 4, 2, 4) + 'odd{label="with \\" quote"} 7\nnot a line\n')
    assert prom.total(series, "stackd_generation_tokens_total") == 10
    assert prom.by_label(series, "stackd_slots_busy", "model") == {"tiny": 3}
    assert prom.total(series, "odd") == 7 and prom.total(series, "missing") is None
    before = prom.buckets(prom.parse(metrics_text(0, 0, 2, 2)), "stackd_time_to_first_token_seconds")
    after = prom.buckets(series, "stackd_time_to_first_token_seconds")
    # between the two readings: nothing under 0.1, two between 0.1 and 0.2
    assert prom.quantile(0.5, before, after) == pytest.approx(0.15)
    assert prom.quantile(0.5, after, after) is None          # nothing observed: no figure


def test_a_sample_is_rates_and_gauges_from_two_readings():
    first = Reading(100.0, prom.parse(metrics_text(1000, 500, 0, 0)), NODE)
    second = Reading(102.0, prom.parse(metrics_text(1100, 700, 1, 3)), NODE)
    sample = dict(zip(NAMES, values(first, second)))
    assert sample["generated_tps"] == 50.0 and sample["prompt_tps"] == 100.0
    assert sample["requests_running"] == 3 and sample["requests_waiting"] == 1
    assert sample["kv_cache_pct"] == 25.0 and sample["model_memory_mb"] == 100.0
    assert sample["memory_used_mb"] == 2048.0 and sample["temperature_c"] == 51.5
    assert sample["power_budget_w"] == 12.0 and sample["power_draw_w"] == 9.0
    assert 0 < sample["ttft_p50_ms"] <= 200
    assert dict(zip(NAMES, values(None, first)))["generated_tps"] is None   # no rate from one reading
    restarted = Reading(104.0, prom.parse(metrics_text(10)), NODE)          # a counter that started over
    assert dict(zip(NAMES, values(second, restarted)))["generated_tps"] == 0.0


def test_a_minute_combines_mean_and_max_and_skips_gaps():
    rows = [values(None, Reading(1.0, prom.parse(metrics_text(0)), NODE)), GAP]
    combined = dict(zip(NAMES, combine(rows)))
    assert combined["requests_running"] == 3 and combined["generated_tps"] is None
    assert combine([GAP, GAP]) == GAP


@pytest.mark.parametrize("name", sorted(DASHBOARD_LIMITS))
def test_dashboard_settings_are_refused_past_their_limits(tmp_path, name):
    low, high = DASHBOARD_LIMITS[name]
    for fine in (low, high):
        assert getattr(ConsoleSettings(str(tmp_path), **{name: fine}), name) == fine
    step = 0.01 if isinstance(low, float) else 1
    for wrong in (low - step, high + step, True, "7"):
        with pytest.raises(ValueError, match=f"console.{name}"):
            ConsoleSettings(str(tmp_path), **{name: wrong})


def test_history_is_bounded_in_memory_and_by_days_in_the_database(fresh):
    harness = fresh()
    device = harness.add_device("bounded")
    history = History(harness.console.engine, samples=10, days=1)
    now = time.time()
    start = (int(now) // 60 - 5) * 60                  # five whole minutes ago
    sample = values(None, Reading(0.0, prom.parse(metrics_text(0)), NODE))

    async def fill():
        closed = []
        for i in range(5 * 30):                         # 2 s apart, five minutes
            done = history.add(device["id"], start + 2 * i, sample)
            if done is not None:
                closed.append((device["id"], *done))
        await history.write(closed)
        await history.write([(device["id"], start - 2 * 86400, GAP)])   # two days old
        return closed

    closed = harness.run(fill())
    assert len(history.recent[device["id"]]) == 10       # memory keeps `samples`
    assert len(closed) == 4                              # minutes 1-4 closed; the fifth is pending
    assert harness.run(history.prune(now)) == 1          # older than `days`: gone
    samples, resolution = harness.run(history.since(device["id"], start - 60))
    assert resolution == "minute"
    assert [t for t, _ in samples[:4]] == [start + 60 * i for i in range(4)]
    assert [t for t, _ in samples[4:]] == [start + 2 * i for i in range(140, 150)]
    assert samples[0][1][NAMES.index("requests_running")] == 3


def test_dashboard_routes_levels_errors_and_openapi(shared):
    device = shared.add_device("levels-device")
    shared.add_user("dash-user", "user")
    shared.add_user("dash-viewer", "viewer")
    user = shared.login("dash-user", "password-123")["access_token"]
    viewer = shared.login("dash-viewer", "password-123")["access_token"]
    paths = [f"/api/devices/{device['id']}/metrics", "/api/cluster", f"/api/devices/{device['id']}/requests"]
    for path in paths:
        status, _, body = shared.call("GET", path, user)
        assert status == 403 and body["error"]["type"] == "permission_error", (path, body)
        assert shared.call("GET", path)[0] == 401
    status, _, body = shared.call("GET", paths[0], viewer)
    assert status == 200 and body["fields"] == list(NAMES) and body["device_id"] == device["id"]
    status, _, body = shared.call("GET", paths[1], viewer)
    assert status == 200 and body["object"] == "cluster"
    status, _, body = shared.call("GET", paths[2], viewer)      # the fake node has no such route
    assert status == 503 and body["error"]["type"] == "service_unavailable_error"
    for since in ("abc", "-1", "nan", "inf"):
        status, _, body = shared.call("GET", f"{paths[0]}?since={since}", viewer)
        assert status == 400 and body["error"]["param"] == "since", since
    status, _, body = shared.call("GET", "/api/devices/dev_nope/metrics", viewer)
    assert status == 404 and body["error"]["type"] == "not_found_error"
    status, _, doc = shared.call("GET", "/openapi.json", viewer)
    assert status == 200
    for path in ("/api/devices/{id}/metrics", "/api/cluster", "/api/devices/{id}/requests"):
        assert "403" in doc["paths"][path]["get"]["responses"], path


class ScriptedNode:
    """A device's cluster and inference routes as the sampler reads them: counters that grow
    by `step` a poll, and a switch that makes every route hang (a device that stops answering)."""

    def __init__(self, keys):
        self.generated = 0
        self.step = 40
        self.hang = asyncio.Event()
        self.hang.set()

        async def answer(node, request, body):
            await self.hang.wait()
            return body() if callable(body) else body

        def route(body, permission=perm.CLUSTER_READ):
            return Endpoint(lambda node, request: answer(node, request, body), permission)

        def metrics():
            self.generated += self.step
            return Response(200, metrics_text(self.generated).encode(), b"text/plain")

        self.app = App("scripted-node", [{
            ("GET", "/metrics"): route(metrics),
            ("GET", "/v1/nodes"): route(json_response({"object": "list", "data": [NODE]})),
            ("GET", "/v1/cluster"): route(json_response({"status": "healthy", "leader": "n1", "reasons": []})),
            ("GET", "/v1/requests/recent"): route(json_response({"object": "list", "recording": True,
                                                                 "data": [RECENT_ROW]})),
            ("GET", "/v1/models"): route(json_response({"object": "list", "data": [
                {"id": "tiny", "state": "loaded", "kind": "chat",
                 "placement": {"split_mode": "replica", "nodes": [{"id": "n1", "memory_bytes": 1}]}}]}),
                perm.INFERENCE),
        }], ctx=self, guard=KeyGuard(keys, RateLimiter({})), max_body=1 << 20)


RECENT_ROW = {"time": 1.0, "route": "/v1/chat/completions", "model": "tiny", "key": "k", "prompt_tokens": 3,
              "generated_tokens": 4, "ttft_ms": 5.0, "duration_ms": 6.0, "status": 200}


def samples_of(harness, token, device_id):
    status, _, body = harness.call("GET", f"/api/devices/{device_id}/metrics", token)
    assert status == 200, body
    return body


def eventually(condition, what: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_sampler_charts_a_device_marks_its_silence_and_keeps_history_over_a_restart(fresh):
    harness = fresh(dashboard_interval=0.5, upstream_timeout=1.0)
    node = ScriptedNode(harness.node.keys)
    port = harness.run(harness.http.listen(node.app, "127.0.0.1", 0))
    token = harness.admin_token()
    status, _, device = harness.call("POST", "/api/devices", token, {
        "name": "scripted", "inference_url": f"http://127.0.0.1:{port}",
        "cluster_url": f"http://127.0.0.1:{port}", "api_key": harness.node.key})
    assert status == 201
    generated = NAMES.index("generated_tps") + 1

    def rates():
        return [s[generated] for s in samples_of(harness, token, device["id"])["samples"]]
    eventually(lambda: len([r for r in rates() if r]) >= 3, "three samples with tokens/s")
    status, _, view = harness.call("GET", "/api/cluster", token)
    assert status == 200 and view["devices"][0]["reachable"] is True
    assert view["devices"][0]["models"] == [{"id": "tiny", "kind": "chat", "state": "loaded",
                                             "split_mode": "replica", "nodes": ["n1"], "slots_busy": 3,
                                             "error": None, "degraded": False}]
    [cluster] = view["clusters"]
    assert cluster["leader"] == "n1" and cluster["nodes"][0]["leader"] is True
    assert cluster["nodes"][0]["placed"] == [{"model": "tiny", "split_mode": "replica", "state": "loaded"}]
    status, _, recent = harness.call("GET", f"/api/devices/{device['id']}/requests", token)
    assert status == 200 and recent["data"] == [RECENT_ROW] and recent["recording"] is True

    harness.call_soon(node.hang.clear)                   # the device stops answering
    eventually(lambda: samples_of(harness, token, device["id"])["samples"][-1][1:] == [None] * len(NAMES),
               "a gap after the silence")
    # the console still answers at once, from its memory: a silent device slows nothing
    status, _, view = harness.call("GET", "/api/cluster", token)
    assert status == 200 and view["devices"][0]["reachable"] is False
    status, _, recent = harness.call("GET", f"/api/devices/{device['id']}/requests", token)
    assert status == 200 and recent["reachable"] is False and recent["data"] == [RECENT_ROW]
    harness.call_soon(node.hang.set)
    eventually(lambda: rates()[-1] is not None, "samples again once it answers")

    before = samples_of(harness, token, device["id"])["samples"]
    harness.stop_console()
    harness.start_console()
    token = harness.admin_token()
    after = samples_of(harness, token, device["id"])
    # memory is gone with the process: what the chart opens with is the database's minutes
    assert after["samples"] and after["samples"][0][0] <= before[-1][0]
    assert any(s[generated] for s in after["samples"])


# ---- the node side: GET /v1/requests/recent and what fills it --------------------------------

class FakeKey:
    name = "bench-key"


class FakeRequest:
    def __init__(self, body: dict):
        self.body = orjson.dumps(body)
        self.key = FakeKey()

    def json(self):
        return orjson.loads(self.body)


async def _chunks(pieces):
    for piece in pieces:
        yield piece


def test_recorder_keeps_counts_and_times_never_text():
    recent = RecentRequests(capacity=3)
    answer = {"model": "m", "choices": [{"message": {"content": "SECRET ANSWER"}}],
              "usage": {"prompt_tokens": 7, "completion_tokens": 5},
              "timings": {"first_token_ms": 12.5}}
    events = [b'data: {"choices":[{"delta":{"content":"SECRET"}}]}\n\n',
              b'data: {"choices":[],"timings":{"prompt_n":3,"cache_n":2,"predicted_n":9,"first_token_ms":4.0}}\n\n',
              b"data: [DONE]\n\n"]

    def whole(ctx, request):
        return json_response(answer)

    def streamed(ctx, request):
        return StreamingResponse(_chunks(events), b"text/event-stream")

    table = recording({("POST", "/v1/chat/completions"): Endpoint(whole, perm.INFERENCE),
                       ("POST", "/v1/completions"): Endpoint(streamed, perm.INFERENCE),
                       ("GET", "/v1/models"): Endpoint(whole, perm.INFERENCE)}, recent)
    assert table[("GET", "/v1/models")].handler is whole          # only POSTs are recorded
    prompt = {"model": "m", "messages": [{"role": "user", "content": "SECRET PROMPT"}]}

    async def run():
        await table[("POST", "/v1/chat/completions")].handler(None, FakeRequest(prompt))
        response = await table[("POST", "/v1/completions")].handler(None, FakeRequest(prompt))
        assert [p async for p in response.chunks] == events       # passed through as it is
        await response.chunks.aclose()
    asyncio.run(run())
    newest = recent.newest(10)
    assert [(r["route"], r["model"], r["key"], r["prompt_tokens"], r["generated_tokens"], r["ttft_ms"], r["status"])
            for r in newest] == [("/v1/completions", "m", "bench-key", 5, 9, 4.0, 200),
                                 ("/v1/chat/completions", "m", "bench-key", 7, 5, 12.5, 200)]
    assert b"SECRET" not in orjson.dumps(newest)
    for _ in range(5):
        asyncio.run(table[("POST", "/v1/chat/completions")].handler(None, FakeRequest(prompt)))
    assert len(recent.newest(10)) == 3                             # bounded


def test_recent_requests_route_takes_a_limit_in_range():
    from stackd.api.cluster.recent import recent_requests
    from stackd.http.errors import ApiError

    class Query:
        def __init__(self, query):
            self.query = query

    assert orjson.loads(recent_requests(None, Query("limit=200")).body)["object"] == "list"
    assert orjson.loads(recent_requests(None, Query("")).body)["data"] is not None
    for wrong in ("limit=0", "limit=201", "limit=abc", "limit=1.5"):
        with pytest.raises(ApiError) as refused:
            recent_requests(None, Query(wrong))
        assert refused.value.param == "limit", wrong
