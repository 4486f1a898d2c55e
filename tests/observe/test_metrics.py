"""Each engine metric moves as it should under a scripted load against the real daemon."""
import time

import pytest

from .conftest import CHAT, series, run_together

pytestmark = pytest.mark.slow

EMBEDDING = "all-minilm-l6-v2"
HISTOGRAMS = ("stackd_request_queue_time_seconds", "stackd_time_to_first_token_seconds",
              "stackd_inter_token_latency_seconds", "stackd_e2e_request_latency_seconds",
              "stackd_request_prompt_tokens", "stackd_request_generation_tokens")
GAUGES = ("stackd_num_requests_running", "stackd_num_requests_waiting", "stackd_kv_cache_usage_ratio",
          "stackd_slots_busy")
COUNTERS = ("stackd_prompt_tokens_total", "stackd_generation_tokens_total",
            "stackd_prefix_cache_hit_tokens_total", "stackd_requests_cancelled_total",
            "stackd_engine_errors_total")


def delta(before: dict, after: dict, key: str) -> float:
    return after[key] - before.get(key, 0.0)


def test_every_metric_is_there_for_every_model(client):
    samples = client.metrics()
    for model in (CHAT, EMBEDDING):
        for name in HISTOGRAMS:
            assert series(f"{name}_count", model) in samples, name
            assert f'{name}_bucket{{model="{model}",le="+Inf"}}' in samples
        for name in GAUGES + COUNTERS:
            assert series(name, model) in samples, name
        for reason in ("stop", "length"):
            assert series("stackd_request_success_total", model, finished_reason=reason) in samples
    # the buckets this hardware needs: inter-token latency from 1 ms, first token from 5 ms
    assert f'stackd_inter_token_latency_seconds_bucket{{model="{CHAT}",le="0.001"}}' in samples
    assert f'stackd_time_to_first_token_seconds_bucket{{model="{CHAT}",le="0.005"}}' in samples
    assert "stackd_engine_n_steps_total" + '{model="' + CHAT + '"}' in samples   # what was there stays


def test_a_request_that_waits_for_a_slot_raises_the_queue_histogram(client):
    before = client.settled()
    n_tokens = 24
    answers = run_together(*[lambda: client.complete(prompt="Count to ten:", max_tokens=n_tokens,
                                                     ignore_eos=True) for _ in range(3)])
    after = client.settled()
    queued = lambda le: delta(before, after, f'stackd_request_queue_time_seconds_bucket{{model="{CHAT}",le="{le}"}}')
    assert delta(before, after, series("stackd_request_queue_time_seconds_count")) == 3
    # two slots: the third request waited at least one whole request (24 decode steps)
    assert queued("0.005") <= 2 and queued("+Inf") == 3
    assert max(a["timings"]["queue_ms"] for a in answers) > 5.0
    assert delta(before, after, series("stackd_time_to_first_token_seconds_count")) == 3
    assert delta(before, after, series("stackd_inter_token_latency_seconds_count")) == 3 * (n_tokens - 1)
    assert delta(before, after, series("stackd_e2e_request_latency_seconds_count")) == 3
    assert delta(before, after, series("stackd_request_generation_tokens_sum")) == 3 * n_tokens
    assert delta(before, after, series("stackd_generation_tokens_total")) == 3 * n_tokens
    n_prompt = sum(a["usage"]["prompt_tokens"] for a in answers)
    assert delta(before, after, series("stackd_prompt_tokens_total")) == n_prompt
    assert delta(before, after, series("stackd_request_prompt_tokens_sum")) == n_prompt
    assert delta(before, after, series("stackd_request_success_total", finished_reason="length")) == 3
    for a in answers:
        t = a["timings"]
        assert t["predicted_n"] == n_tokens == a["usage"]["completion_tokens"]
        assert t["prompt_n"] + t["cache_n"] == a["usage"]["prompt_tokens"]
        assert t["first_token_ms"] >= t["queue_ms"] and t["predicted_ms"] > 0
        assert t["predicted_per_second"] > 0


def test_a_repeated_prefix_raises_prefix_hit_tokens(client):
    prompt = "You are a careful assistant who answers in one short sentence. " * 6
    before = client.settled()
    first = client.complete(prompt=prompt + "Say hi.", max_tokens=2)
    second = client.complete(prompt=prompt + "Say bye.", max_tokens=2)
    after = client.settled()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 60 and second["timings"]["cache_n"] == cached
    assert delta(before, after, series("stackd_prefix_cache_hit_tokens_total")) == \
        cached + first["usage"]["prompt_tokens_details"]["cached_tokens"]


def wait_for(client, predicate, what: str) -> dict:
    for _ in range(600):
        samples = client.metrics()
        if predicate(samples):
            return samples
        time.sleep(0.1)
    raise AssertionError(f"never saw {what}")


def test_gauges_follow_a_running_request_and_a_cancel_counts(client):
    before = client.settled()
    sock = client.open_stream({"prompt": "Write a long story about the sea.", "max_tokens": 400,
                               "ignore_eos": True})
    try:
        during = wait_for(client, lambda s: s[series("stackd_num_requests_running")] >= 1, "a running request")
        assert during[series("stackd_slots_busy")] >= 1
        assert 0 < during[series("stackd_kv_cache_usage_ratio")] < 1
    finally:
        sock.close()                     # the client goes away: the engine cancels the request
    after = wait_for(client, lambda s: delta(before, s, series("stackd_requests_cancelled_total")) >= 1,
                     "the cancel counted")
    assert delta(before, after, series("stackd_requests_cancelled_total")) == 1
    idle = wait_for(client, lambda s: s[series("stackd_num_requests_running")] == 0, "the slot freed")
    assert idle[series("stackd_kv_cache_usage_ratio")] == 0 and idle[series("stackd_slots_busy")] == 0
    assert delta(before, idle, series("stackd_request_success_total", finished_reason="length")) == 0


def test_bad_input_is_not_an_engine_error(client):
    before = client.metrics()
    status, answer = client.post("/v1/completions", {"model": CHAT, "prompt": [], "max_tokens": 2})
    assert status == 400                 # an empty prompt never reaches the engine
    after = client.metrics()
    assert delta(before, after, series("stackd_engine_errors_total")) == 0


def test_embeddings_count_their_tokens(client):
    before = client.metrics()
    status, answer = client.post("/v1/embeddings", {"model": EMBEDDING, "input": ["hello there", "bye"]})
    assert status == 200
    after = client.metrics()
    n = answer["usage"]["prompt_tokens"]
    assert delta(before, after, series("stackd_prompt_tokens_total", EMBEDDING)) == n
    assert delta(before, after, series("stackd_e2e_request_latency_seconds_count", EMBEDDING)) == 1
    assert delta(before, after, series("stackd_request_success_total", EMBEDDING, finished_reason="stop")) == 1


def test_timings_in_every_response_and_the_last_chunk_of_a_stream(client):
    chat = {"model": CHAT, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    status, answer = client.post("/v1/chat/completions", chat)
    assert status == 200 and answer["timings"]["predicted_n"] == answer["usage"]["completion_tokens"]
    assert set(answer["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens",
                                    "prompt_tokens_details"}           # usage keeps OpenAI's shape
    for path, body in (("/v1/chat/completions", chat),
                       ("/v1/completions", {"model": CHAT, "prompt": "Hi", "max_tokens": 3, "n": 2})):
        chunks = client.stream(path, body)
        assert "timings" in chunks[-1] and all("timings" not in c for c in chunks[:-1])
        assert chunks[-1]["timings"]["predicted_n"] == 3 * body.get("n", 1)
        with_usage = client.stream(path, {**body, "stream_options": {"include_usage": True}})
        assert with_usage[-1]["choices"] == [] and "timings" in with_usage[-1]
        assert with_usage[-1]["timings"]["predicted_n"] == with_usage[-1]["usage"]["completion_tokens"]


COPY = ("Repeat exactly: The board approved a dividend of 0.15 euros per share, payable on 14 March "
        "to holders of record on 1 March, and headcount grew from 212 to 240.\n\nRepeat exactly: "
        "The board approved a dividend of 0.15 euros per share, payable on 14 March")


def test_drafted_and_accepted_tokens_in_timings_and_metrics(client):
    # Both answers compared below start from the cached prompt: a cold prompt of 64 tokens or
    # more is prefilled on ggml's tiled attention, a cached one recomputes its last token one row
    # at a time, and those two orders of adding part texts whether or not anything is drafted
    # (kernels/README.md, "One arithmetic per row"). What must not part them is the drafting.
    client.complete(prompt=COPY, max_tokens=1, temperature=0, speculative=False)
    before = client.settled()
    drafted = client.complete(prompt=COPY, max_tokens=40, temperature=0)
    after = client.settled()
    t = drafted["timings"]
    assert 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert delta(before, after, series("stackd_spec_decode_num_draft_tokens_total")) == t["draft_n"]
    assert delta(before, after, series("stackd_spec_decode_num_accepted_tokens_total")) == t["draft_n_accepted"]
    assert 0 < after[series("stackd_spec_decode_acceptance_ratio")] <= 1
    opted_out = client.complete(prompt=COPY, max_tokens=40, temperature=0, speculative=False)
    assert opted_out["timings"]["draft_n"] == 0 and opted_out["timings"]["draft_n_accepted"] == 0
    assert opted_out["choices"][0]["text"] == drafted["choices"][0]["text"]
    assert delta(after, client.settled(), series("stackd_spec_decode_num_draft_tokens_total")) == 0


def test_the_opt_out_must_be_a_boolean(client):
    status, answer = client.post("/v1/completions", {"model": CHAT, "prompt": "hi", "max_tokens": 2,
                                                     "speculative": "no"})
    assert status == 400 and "speculative" in answer["error"]["message"]
