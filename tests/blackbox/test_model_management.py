"""Load, unload and their states against the real daemon and the default models."""
import threading
import os
import time

import pytest

pytestmark = pytest.mark.slow


CHAT, EMBED = "smollm2-135m-instruct", "all-minilm-l6-v2"


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def states(daemon) -> dict:
    _, _, body = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    return {m["id"]: m for m in body["data"]}


def manage(daemon, op, body, port="cluster"):
    return daemon.request("POST", f"/v1/models/{op}", port=port, key=daemon.admin_key, body=body)


@pytest.fixture
def idle(start_daemon):
    """A daemon with the defaults in its store but nothing loaded."""
    return start_daemon("[rate_limits]\ninference = 0\ncluster = 0\n[models]\npreload = []\n", models=True)


def test_defaults_are_in_the_store_and_available(idle):
    models = states(idle)
    assert set(models) == {CHAT, EMBED}
    assert models[CHAT]["state"] == "available" and models[CHAT]["kind"] == "chat"
    assert models[EMBED]["kind"] == "embedding" and models[CHAT]["quantization"] == "Q4_1"
    assert models[CHAT]["trained_context_length"] == 8192
    assert len(models[CHAT]["sha256"]) == 64 and models[CHAT]["file"].startswith("blobs/sha256-")


def test_load_with_context_then_noop_then_reload(idle):
    status, _, body = manage(idle, "load", {"model": CHAT, "options": {"context_length": 1024}})
    assert status == 200 and body["state"] == "loaded" and body["context_length"] == 1024
    _, _, cluster = idle.request("GET", "/v1/cluster", key=idle.admin_key)
    assert cluster["active_model"] == CHAT
    status, _, again = manage(idle, "load", {"model": CHAT, "options": {"context_length": 1024}})
    assert status == 200 and again["context_length"] == 1024
    status, _, reloaded = manage(idle, "load", {"model": CHAT, "options": {"context_length": 512}},
                                 port="inference")
    assert status == 200 and reloaded["context_length"] == 512


@pytest.mark.parametrize("context,expected", [(8192, 200), (8193, 400), (31, 400), ("big", 400)])
def test_context_length_is_bounded_by_training(idle, context, expected):
    status, _, body = manage(idle, "load", {"model": CHAT,
                                            "options": {"context_length": context}})
    assert status == expected
    if expected == 400:
        assert "context_length" in body["error"]["message"]
        assert states(idle)[CHAT]["state"] == "available"


@pytest.mark.parametrize("model,status,kind", [("nope", 404, "model_not_found"),
                                               ("../etc/passwd", 400, "invalid_request_error"),
                                               ("UPPER", 400, "invalid_request_error")])
def test_unknown_or_invalid_models(idle, model, status, kind):
    got, _, body = manage(idle, "load", {"model": model})
    assert got == status and body["error"]["type"] == kind


def test_a_load_that_does_not_fit_is_refused_and_changes_nothing(start_daemon):
    daemon = start_daemon("[models]\npreload = []\nmemory_reserve_mb = 100000000\n", models=True)
    status, _, body = manage(daemon, "load", {"model": CHAT})
    assert status == 507 and body["error"]["type"] == "insufficient_memory_error"
    assert "MiB" in body["error"]["message"] and "nothing was changed" in body["error"]["message"]
    assert states(daemon)[CHAT]["state"] == "available"


def test_unload_returns_memory(idle):
    """The model lives in its worker process (engine.isolation = worker): unloading ends that
    process, and the daemon itself holds no more than the vocabulary it kept."""
    pid = idle.proc.pid
    before = rss_bytes(pid)
    _, _, body = manage(idle, "load", {"model": CHAT, "options": {"context_length": 2048}})
    worker = body["pid"]
    idle.request("POST", "/v1/completions", port="inference", key=idle.admin_key,
                 body={"model": CHAT, "prompt": "Hello", "max_tokens": 4})
    assert worker != pid and rss_bytes(worker) > 50 << 20
    assert rss_bytes(pid) - before < 50 << 20          # the weights and KV are not in the daemon
    status, _, body = manage(idle, "unload", {"model": CHAT})
    assert status == 200 and body["state"] == "available"
    deadline = time.monotonic() + 60
    while os.path.exists(f"/proc/{worker}") and open(f"/proc/{worker}/stat").read().split()[2] != "Z":
        assert time.monotonic() < deadline, "the worker outlived the unload"
        time.sleep(0.1)
    _, _, cluster = idle.request("GET", "/v1/cluster", key=idle.admin_key)
    assert cluster["active_model"] is None


def test_load_unload_cycles_keep_states_right(idle):
    for _ in range(3):
        assert manage(idle, "load", {"model": EMBED})[2]["state"] == "loaded"
        assert states(idle)[EMBED]["state"] == "loaded"
        assert manage(idle, "unload", {"model": EMBED})[2]["state"] == "available"
    assert manage(idle, "unload", {"model": EMBED})[0] == 200      # unloading twice is fine


def test_inference_loads_a_stored_model_on_demand(idle):
    status, _, body = idle.request("POST", "/v1/embeddings", port="inference", key=idle.admin_key,
                                   body={"model": EMBED, "input": "hi"})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384
    assert states(idle)[EMBED]["state"] == "loaded"


def test_without_autoload_an_unloaded_model_is_503(start_daemon):
    daemon = start_daemon("[models]\npreload = []\nautoload = false\n", models=True)
    status, headers, body = daemon.request("POST", "/v1/embeddings", port="inference",
                                           key=daemon.admin_key, body={"model": EMBED, "input": "hi"})
    assert status == 503 and "not loaded" in body["error"]["message"] and headers["retry-after"]


def test_unload_ends_in_flight_requests_cleanly(idle):
    manage(idle, "load", {"model": CHAT})
    result = {}

    def long_request():
        result["reply"] = idle.request("POST", "/v1/completions", port="inference", key=idle.admin_key,
                                       body={"model": CHAT, "prompt": "Once", "max_tokens": 2000,
                                             "ignore_eos": True})

    def sampled() -> int:
        metrics = idle.request("GET", "/metrics", key=idle.admin_key)[2].decode()
        return sum(int(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("stackd_engine_n_tokens_sampled_total") and CHAT in line)

    before = sampled()
    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + 300
    while sampled() == before:                  # generating (workers report once a second)
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert manage(idle, "unload", {"model": CHAT})[0] == 200
    worker.join(300)
    status, _, body = result["reply"]
    assert status == 503 and "unloaded" in body["error"]["message"]
    assert idle.request("GET", "/v1/health", key=idle.admin_key)[0] == 200


# SmolLM2-135M: 30 layers, 192 K (and V) values a token each: f16 384 bytes a row, q8_0 204.
def kv_cache_bytes(slots: int, context: int, kv_type: str) -> int:
    return slots * context * 2 * 30 * {"f16": 384, "q8_0": 204}[kv_type]


def test_kv_type_through_load_noop_reload_and_unload(idle):
    status, _, body = manage(idle, "load", {"model": CHAT, "options": {"context_length": 1024, "kv_type": "q8_0"}})
    assert status == 200 and body["kv_cache"] == {"type": "q8_0", "bytes": kv_cache_bytes(16, 1024, "q8_0")}
    assert body["kernels"]["attention"] == ("ours" if body["kernels"]["path"] else "ggml")   # q8_0 too
    status, _, answer = idle.request("POST", "/v1/completions", port="inference", key=idle.admin_key,
                                     body={"model": CHAT, "prompt": "The capital of France is", "max_tokens": 8})
    assert status == 200 and answer["usage"]["completion_tokens"] > 0
    pid = body["pid"]
    _, _, again = manage(idle, "load", {"model": CHAT, "options": {"context_length": 1024}})
    assert again["pid"] == pid and again["kv_cache"]["type"] == "q8_0"     # not asked: kept
    _, _, f16 = manage(idle, "load", {"model": CHAT, "options": {"context_length": 1024, "kv_type": "f16"}})
    assert f16["pid"] != pid and f16["kv_cache"] == {"type": "f16", "bytes": kv_cache_bytes(16, 1024, "f16")}
    assert f16["kernels"]["attention"] == ("ours" if f16["kernels"]["path"] else "ggml")
    assert states(idle)[CHAT]["kv_cache"]["type"] == "f16"
    _, _, unloaded = manage(idle, "unload", {"model": CHAT})
    assert unloaded["state"] == "available" and "kv_cache" not in unloaded


@pytest.mark.parametrize("kv_type", ["q4_0", "F16", 8, ""])
def test_a_kv_type_other_than_f16_or_q8_0_is_refused(idle, kv_type):
    status, _, body = manage(idle, "load", {"model": CHAT, "options": {"kv_type": kv_type}})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "kv_type" in body["error"]["message"] and body["error"]["param"] == "options.kv_type"
    assert states(idle)[CHAT]["state"] == "available"


def test_a_context_that_fits_with_q8_0_and_not_with_f16(start_daemon):
    """models.memory_limit_mb halfway between the two estimates at the trained context."""
    from stackd.runtime.planner import BUFFER_OVERHEAD
    from stackd.store import defaults
    base = os.path.getsize(defaults.smollm2_path()) + BUFFER_OVERHEAD
    q8, f16 = (base + kv_cache_bytes(2, 8192, t) for t in ("q8_0", "f16"))
    limit_mb = (q8 + f16) // 2 >> 20
    daemon = start_daemon(f"[engine]\nslots = 2\n[models]\npreload = []\nmemory_limit_mb = {limit_mb}\n",
                          models=True)
    status, _, body = manage(daemon, "load", {"model": CHAT, "options": {"context_length": 8192}})
    assert status == 507 and "as f16" in body["error"]["message"]
    assert states(daemon)[CHAT]["state"] == "available"
    status, _, body = manage(daemon, "load", {"model": CHAT, "options": {"context_length": 8192, "kv_type": "q8_0"}})
    assert status == 200 and body["kv_cache"] == {"type": "q8_0", "bytes": kv_cache_bytes(2, 8192, "q8_0")}
