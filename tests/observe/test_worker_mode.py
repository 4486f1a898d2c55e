"""With the default engine.isolation (each model's engine in a worker process) the engine's
metrics still reach /metrics (the worker pushes them as it starts, with each request's end
and once a second), responses
carry their timings, and the trace records the worker's engine: its spans carry the worker's
pid, and their times (the worker's CLOCK_MONOTONIC) lie inside the daemon's recording window."""
import os
import signal
import threading
import time

import pytest

from testing.daemon import Daemon

from . import test_metrics
from .conftest import CHAT, Client, run_together, series
from .test_trace import check_nesting, check_steps_and_requests, three_requests, trace

pytestmark = pytest.mark.slow

EMBED = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def worker_client(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("observe-worker") / "data"),
                    "[engine]\nslots = 2\ncontext_length = 512\n", models=True)
    yield Client(daemon)
    daemon.stop()


def worker_pid(client: Client, model: str) -> int:
    status, _, described = client.daemon.request("GET", f"/v1/models/{model}", port="inference",
                                                 key=client.key)
    assert status == 200 and described["isolation"] == "worker", described
    return described["pid"]


def test_every_series_is_there_and_moves_with_each_request(worker_client):
    """A worker reports as it starts (a few ms after the daemon listens, for the last model
    loaded) and with every request's end, not only once a second: the same checks as with
    inline engines, where a request's counts are in /metrics as soon as it has been answered."""
    # each model's worker loads and reports on its own: wait for both first reports (a busy
    # machine once had the embedding worker's in /metrics before the chat worker's)
    first_reports = [series("stackd_request_queue_time_seconds_count", model) for model in (CHAT, EMBED)]
    for _ in range(1800):
        samples = worker_client.metrics()
        if all(report in samples for report in first_reports):
            break
        time.sleep(0.1)
    test_metrics.test_every_metric_is_there_for_every_model(worker_client)
    test_metrics.test_embeddings_count_their_tokens(worker_client)


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


def record_while(client: Client, seconds: float, send, wait: float = 2.5, **extra):
    """A trace of `seconds`; `wait` seconds into it, run `send` (callables, at once). -> (status,
    trace, what `send` answered, when they were sent and answered on CLOCK_MONOTONIC in us,
    the trace's clock)."""
    result = {}
    recorder = threading.Thread(target=lambda: result.update(answer=trace(client, seconds, **extra)))
    recorder.start()
    time.sleep(wait)                     # one local request, one round trip to an idle worker
    sent_us = time.monotonic_ns() // 1000
    answers = run_together(*send)
    answered_us = time.monotonic_ns() // 1000
    recorder.join()
    return *result["answer"], answers, (sent_us, answered_us)


def test_a_trace_records_the_worker_engine(worker_client):
    client = worker_client
    pid = worker_pid(client, CHAT)
    send, took = three_requests(client, "Name {} rivers.")
    seconds = min(60, 5 + 4 * took)
    for attempt in range(1, 4):
        # A step that runs when the recording starts is recorded whole, beginning before the
        # window: let the last step of the requests before end (its answer can come first).
        time.sleep(1.0)
        status, body, answers, (sent_us, answered_us) = record_while(client, seconds, send, 2.5 * attempt,
                                                                     model=CHAT)
        assert status == 200, body
        begin, end = body["otherData"]["window_us"]
        if begin < sent_us and answered_us < end:
            break
        # The busy machine began the recording after the requests were sent, or they outlasted
        # it: not what is under test. Again, waiting longer and recording longer.
        seconds = min(60, 2 * seconds)
    else:
        raise AssertionError(f"no window {begin}..{end} held the requests {sent_us}..{answered_us}")
    events = body["traceEvents"]
    check_nesting(events)
    assert body["otherData"]["models"] == [CHAT] and body["otherData"]["lost"] == {}
    [process] = [e for e in events if e["name"] == "process_name"]
    assert process["pid"] == pid and process["args"]["name"] == f"model {CHAT}"
    assert {e["pid"] for e in events} == {pid}

    timed = [e for e in events if e["ph"] in ("X", "i")]
    outside = [(e["name"], e["ts"], e.get("dur")) for e in timed
               if not begin <= e["ts"] <= e["ts"] + e.get("dur", 0) <= end]
    assert timed and not outside, f"outside the window {begin}..{end}: {outside[:8]}"

    _, requests = check_steps_and_requests(events, answers)
    for request in requests:
        # The worker's clock is this process's: each request lies between its sending and its answer.
        assert sent_us <= request["ts"] and request["ts"] + request["dur"] <= answered_us
        assert request["tid"] == request["args"]["id_request"] + 1


def test_a_trace_of_every_worker(worker_client):
    status, body = trace(worker_client, 1)
    assert status == 200 and body["otherData"]["lost"] == {}
    processes = {e["args"]["name"]: e["pid"] for e in body["traceEvents"] if e["name"] == "process_name"}
    assert processes == {f"model {m}": worker_pid(worker_client, m) for m in (CHAT, EMBED)}


@pytest.mark.parametrize("extra, expected", [({"seconds": 0}, 400), ({"seconds": 61}, 400),
                                             ({"seconds": 1, "model": "no-such-model"}, 404)])
def test_bad_requests_are_refused_before_any_worker_records(worker_client, extra, expected):
    status, body = worker_client.post("/v1/debug/trace", extra, port="cluster")
    assert status == expected and set(body["error"]) >= {"code", "message", "type"}


def test_a_worker_that_dies_or_freezes_mid_trace_is_named_not_waited_for(tmp_path):
    """The chat worker is killed while the trace records (and, the crash hook set, every restart
    dies too); the embedding worker is stopped (SIGSTOP) past debug.trace_reply_timeout. Each
    trace answers with what it has and names the model it lost."""
    crash = tmp_path / "crash"
    daemon = Daemon(str(tmp_path / "data"), "[engine]\nslots = 2\ncontext_length = 512\n"
                    "[debug]\ntrace_reply_timeout = 2.0\n", models=True,
                    injected={"worker_crash_file": str(crash)})
    try:
        client = Client(daemon)
        chat, embed = worker_pid(client, CHAT), worker_pid(client, EMBED)

        def kill_chat():
            crash.write_text("")
            os.kill(chat, signal.SIGKILL)
        status, body, _, _ = record_while(client, 4, [kill_chat])
        assert status == 200, body
        assert list(body["otherData"]["lost"]) == [CHAT] and "SIGKILL" in body["otherData"]["lost"][CHAT]
        assert body["otherData"]["models"] == [EMBED]
        processes = [e for e in body["traceEvents"] if e["name"] == "process_name"]
        assert [(e["pid"], e["args"]["name"]) for e in processes] == [(embed, f"model {EMBED}")]

        os.kill(embed, signal.SIGSTOP)
        try:
            status, body = trace(client, 1, model=EMBED)
        finally:
            os.kill(embed, signal.SIGCONT)
        assert status == 200, body
        assert body["otherData"]["models"] == [] and body["traceEvents"] == []
        assert "did not answer within 2 s" in body["otherData"]["lost"][EMBED]
        # The late answer is dropped; the worker records again for the next trace.
        status, body = trace(client, 1, model=EMBED)
        assert status == 200 and body["otherData"]["models"] == [EMBED], body
    finally:
        daemon.stop()


def test_the_description_says_which_weights_run_on_our_kernels(worker_client):
    """engine.kernels = auto (the default): the chat model's Q4_1 projections and its tied
    Q8_0 table run on our kernels, counted per type in the worker; the embedding model's
    F16/F32 weights stay with ggml (kernels/README.md)."""
    from stackd.engine import accel
    described = {}
    for model in (CHAT, EMBED):
        status, _, described[model] = worker_client.daemon.request("GET", f"/v1/models/{model}", port="inference",
                                                                   key=worker_client.key)
        assert status == 200, described[model]
    if not accel.cpu_supports("avx2"):
        assert described[CHAT]["kernels"] == {"path": None, "tensors": {}, "attention": "ggml"}
        return
    assert described[CHAT]["kernels"]["path"] in ("avx2", "avx512-vnni")
    assert described[CHAT]["kernels"]["tensors"] == {"q4_1": 30 * 7, "q8_0": 1}   # 7 projections a layer
    assert described[EMBED]["kernels"]["tensors"] == {}
    assert described[CHAT]["kernels"]["attention"] == "ours"     # our decode attention
    assert described[EMBED]["kernels"]["attention"] == "ggml"
