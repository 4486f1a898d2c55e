"""With the default engine.isolation (each model's engine in a worker process) the engine's
metrics still reach /metrics (the worker pushes them with its stats, once a second), and a trace
says which models it could not record."""
import time

import pytest

from tests.blackbox.daemon import Daemon

from .conftest import CHAT, Client, series


@pytest.fixture
def worker_client(tmp_path):
    daemon = Daemon(str(tmp_path / "data"), "[engine]\nslots = 2\ncontext_length = 512\n", models=True)
    yield Client(daemon)
    daemon.stop()


def test_worker_engines_report_their_metrics(worker_client):
    client = worker_client
    answer = client.complete(prompt="Hello", max_tokens=3, ignore_eos=True)
    assert answer["timings"]["predicted_n"] == 3          # timings cross the worker wire
    for _ in range(600):
        samples = client.metrics()
        if samples.get(series("stackd_e2e_request_latency_seconds_count"), 0) >= 1 and \
                samples.get(series("stackd_generation_tokens_total"), 0) >= 3:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the worker never reported its histograms")
    assert samples[series("stackd_generation_tokens_total")] == 3
    assert samples[series("stackd_time_to_first_token_seconds_count")] == 1
    status, body = client.post("/v1/debug/trace", {"seconds": 1}, port="cluster")
    assert status == 200 and sorted(body["otherData"]["not_traced"]) == sorted([CHAT, "all-minilm-l6-v2"])
