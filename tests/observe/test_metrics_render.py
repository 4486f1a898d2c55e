from stackd.observe.metrics import Metrics


def test_prometheus_text_has_counters_histogram_and_gauges():
    metrics = Metrics()
    metrics.observe("cluster", "GET /v1/health", 200, 0.0003)
    metrics.observe("cluster", "GET /v1/health", 200, 0.02)
    metrics.observe("cluster", "GET /v1/health", 401, 0.0001)
    metrics.rate_limit_rejected("inference")
    metrics.open_connections = lambda: 3
    text = metrics.render({"stackd_uptime_seconds": ("Uptime.", 12)}).decode()
    assert 'stackd_http_requests_total{app="cluster",route="GET /v1/health",status="200"} 2' in text
    assert 'stackd_http_requests_total{app="cluster",route="GET /v1/health",status="401"} 1' in text
    assert 'le="0.0005"} 2' in text and 'le="+Inf"} 3' in text
    assert 'stackd_http_request_duration_seconds_count{app="cluster",route="GET /v1/health"} 3' in text
    assert 'stackd_rate_limit_rejections_total{group="inference"} 1' in text
    assert "stackd_http_open_connections 3" in text
    assert "stackd_uptime_seconds 12" in text
    for line in text.splitlines():
        assert line.startswith("#") or len(line.rsplit(" ", 1)) == 2
