"""POST /v1/debug/trace against the real daemon: valid Chrome trace JSON whose spans nest and
whose request spans are the requests sent; cluster:write only; bounded."""
import threading
import time

import pytest

from .conftest import CHAT, run_together

pytestmark = pytest.mark.slow

PHASES = ["schedule", "batch", "decode", "sample", "emit"]


def trace(client, seconds, **extra):
    return client.post("/v1/debug/trace", {"seconds": seconds, **extra}, port="cluster")


def check_nesting(events: list[dict]) -> None:
    """Within each track, complete events either nest or are disjoint (what Perfetto draws)."""
    tracks: dict[tuple, list] = {}
    for e in events:
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0, e
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for spans in tracks.values():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends: list[int] = []
        for e in spans:
            while open_ends and open_ends[-1] <= e["ts"]:
                open_ends.pop()
            end = e["ts"] + e["dur"]
            assert not open_ends or end <= open_ends[-1], f"{e['name']} overlaps its parent"
            open_ends.append(end)


def three_requests(client, prompt: str):
    """Three greedy completions of 3, 5 and 7 tokens (with two slots the third waits), sent once
    untraced: -> (them, how long they took right now, to size a window that holds them however
    busy the machine is)."""
    send = [lambda n=n: client.complete(prompt=prompt.format(n), max_tokens=n, ignore_eos=True)
            for n in (3, 5, 7)]
    began = time.monotonic()
    run_together(*send)
    return send, time.monotonic() - began


def check_steps_and_requests(events: list[dict], answers: list[dict]) -> tuple[list, list]:
    """Steps on track 0 with their five phases each; one request span per answer, with its
    tokens, on a track of its own holding its queue, prefill, decode and finish."""
    steps = [e for e in events if e["name"] == "step"]
    assert steps and all(e["tid"] == 0 and e["args"]["n_tokens"] >= 1 for e in steps)
    step_phases = [e["name"] for e in events if e["tid"] == 0 and e["ph"] == "X" and e["name"] != "step"]
    assert step_phases == PHASES * len(steps)
    sampled = sum(e["args"]["n_sampled"] for e in steps)
    assert sampled >= sum(a["usage"]["completion_tokens"] for a in answers)

    requests = [e for e in events if e["name"] == "request"]
    sent = sorted((a["usage"]["prompt_tokens"], a["usage"]["completion_tokens"]) for a in answers)
    assert sorted((e["args"]["n_prompt"], e["args"]["n_generated"]) for e in requests) == sent
    for request in requests:
        on_track = {e["name"] for e in events if e["tid"] == request["tid"] and e["pid"] == request["pid"]}
        assert {"request", "queued", "prefill", "decode", "finish", "thread_name"} <= on_track
        assert request["args"]["finish_reason"] == "length"
    return steps, requests


def test_the_trace_holds_the_steps_and_the_requests_sent(client):
    send, took = three_requests(client, "Tell me {} things.")
    seconds = min(60, 2 + 4 * took)
    result = {}
    recorder = threading.Thread(target=lambda: result.update(answer=trace(client, seconds, model=CHAT)))
    recorder.start()
    time.sleep(0.5)                      # the recording has begun
    status, busy = trace(client, 1)
    assert status == 409 and busy["error"]["type"] == "conflict_error"
    answers = run_together(*send)
    recorder.join()
    status, body = result["answer"]
    assert status == 200 and isinstance(body["traceEvents"], list)
    events = body["traceEvents"]
    check_nesting(events)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"model {CHAT}"}
    check_steps_and_requests(events, answers)


def test_tracing_needs_cluster_write(client, reader_key):
    status, body = client.post("/v1/debug/trace", {"seconds": 1}, port="cluster", key=reader_key)
    assert status == 403 and body["error"]["type"] == "permission_error"


@pytest.mark.parametrize("seconds", [0, 0.5, 61, 3600, "5", None, True])
def test_the_recording_is_bounded(client, seconds):
    status, body = trace(client, seconds)
    assert status == 400 and body["error"]["param"] == "seconds"


def test_an_unknown_model_is_404(client):
    status, body = trace(client, 1, model="no-such-model")
    assert status == 404 and body["error"]["type"] == "model_not_found"


def test_a_one_second_trace_of_every_model(client):
    status, body = trace(client, 1)
    assert status == 200 and len([e for e in body["traceEvents"] if e["name"] == "process_name"]) == 2
    check_nesting(body["traceEvents"])
