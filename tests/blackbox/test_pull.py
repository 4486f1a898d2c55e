"""Pulling through the daemon's API and the CLI, from a real registry on loopback."""
import hashlib
import http.client
import json
import os
import stat
import struct

import pytest

from testing.registry_server import MEDIA_MODEL, MEDIA_PARAMS, MEDIA_TEMPLATE, RegistryServer

from stackd.store.store import ModelStore
from tests.store.crafted import crafted, duplicate_token_copy, old_store_manifest
from tests.store.tiny import write_tiny

from testing.daemon import cli

pytestmark = pytest.mark.slow


def tiny_gguf_bytes(tmp_path, name="tiny.gguf", rows=16) -> bytes:
    path = tmp_path / name
    write_tiny(path, rows=rows)
    return path.read_bytes()


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    server = RegistryServer(str(tmp_path_factory.mktemp("registry"))).start()
    yield server
    server.stop()


@pytest.fixture
def daemon(start_daemon, registry):
    return start_daemon(f"[models]\npreload = []\nregistry = \"{registry.url}\"\n"
                        "[rate_limits]\ncluster = 0\n", models=True)


def pull(daemon, model, stream=False):
    return daemon.request("POST", "/v1/models/pull", key=daemon.admin_key,
                          body={"model": model, "stream": stream})


def test_pull_puts_the_model_and_its_layers_in_the_store(daemon, registry, tmp_path):
    data = tiny_gguf_bytes(tmp_path)
    registry.push_model("library/tiny", "latest", [(MEDIA_MODEL, data), (MEDIA_TEMPLATE, b"{{ prompt }}"),
                                                   (MEDIA_PARAMS, b'{"stop": ["</s>"]}')])
    status, _, body = pull(daemon, "tiny")
    assert status == 200 and body["status"] == "success"
    assert body["id"] == "tiny:latest" and body["state"] == "available"
    assert body["sha256"] == hashlib.sha256(data).hexdigest() and body["source"] == "registry"
    blobs = os.listdir(os.path.join(daemon.data_dir, "models", "blobs"))
    assert f"sha256-{hashlib.sha256(data).hexdigest()}" in blobs
    assert f"sha256-{hashlib.sha256(b'{{ prompt }}').hexdigest()}" in blobs
    assert not [b for b in blobs if b.endswith(".partial")]
    _, _, listing = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert "tiny:latest" in {m["id"] for m in listing["data"]}


def test_streamed_pull_reports_progress_in_ollamas_shape(daemon, registry, tmp_path):
    registry.push_model("library/tiny", "v2", [(MEDIA_MODEL, tiny_gguf_bytes(tmp_path, "t2.gguf"))])
    status, headers, raw = pull(daemon, "tiny:v2", stream=True)
    assert status == 200 and headers["content-type"] == "application/x-ndjson"
    events = [json.loads(line) for line in raw.splitlines() if line.strip()]
    assert events[0]["status"] == "pulling manifest"
    progress = [e for e in events if "total" in e]
    assert progress and all({"status", "digest", "total", "completed"} <= set(e) for e in progress)
    assert progress[-1]["completed"] == progress[-1]["total"]
    assert events[-1] == {"status": "success", "model": "tiny:v2"}


@pytest.mark.parametrize("kind", ["truncated", "absurd tensor count", "huge string length", "not gguf"])
def test_crafted_gguf_is_refused_and_the_daemon_keeps_serving(daemon, registry, tmp_path, kind):
    bad = crafted(tiny_gguf_bytes(tmp_path), kind)
    tag = kind.replace(" ", "-")
    registry.push_model("library/evil", tag, [(MEDIA_MODEL, bad)])
    status, _, body = pull(daemon, f"evil:{tag}")
    assert status == 400 and "not a valid GGUF" in body["error"]["message"]
    blobs = os.listdir(os.path.join(daemon.data_dir, "models", "blobs"))
    assert f"sha256-{hashlib.sha256(bad).hexdigest()}" not in blobs
    _, _, listing = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert f"evil:{tag}" not in {m["id"] for m in listing["data"]}
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200


@pytest.mark.parametrize("name,status", [("nosuchmodel", 404), ("tiny:nosuchtag", 404),
                                         ("../x", 400), ("UPPER", 400), ("a/b/c", 400)])
def test_unknown_or_bad_names(daemon, registry, name, status):
    got, _, body = pull(daemon, name)
    assert got == status, body


def test_cli_pull_list_rm(registry, tmp_path):
    registry.push_model("library/clitiny", "latest", [(MEDIA_MODEL, tiny_gguf_bytes(tmp_path, "c.gguf"))])
    data = str(tmp_path / "data")
    done = cli("models", "pull", "clitiny", "--registry", registry.url, data_dir=data)
    assert done.returncode == 0, done.stderr
    assert "pulled clitiny:latest" in done.stdout and "%" in done.stderr
    listed = cli("models", "list", data_dir=data)
    assert "clitiny:latest" in listed.stdout
    assert cli("models", "rm", "clitiny:latest", data_dir=data).returncode == 0
    assert "clitiny" not in cli("models", "list", data_dir=data).stdout
    assert cli("models", "rm", "clitiny:latest", data_dir=data).returncode == 1


def test_a_pull_killed_with_the_daemon_resumes_with_a_range_request(start_daemon, tmp_path):
    import threading
    import time

    from tests.store.misbehaving import MisbehavingRegistry, digest_of

    data = tiny_gguf_bytes(tmp_path, "big.gguf", rows=262144)   # 8 MiB: half outgrows the write batch
    registry = MisbehavingRegistry().start()
    try:
        registry.add_model("library/resumable", "latest", [(MEDIA_MODEL, data)])
        registry.blob_modes[digest_of(data)] = "stall"          # half the body, then silence
        config = (f"[models]\npreload = []\nregistry = \"{registry.url}\"\n"
                  "[rate_limits]\ncluster = 0\n")
        data_dir = tmp_path / "data"
        first = start_daemon(config, data_dir=data_dir, models=True)
        def doomed_pull():
            try:
                pull(first, "resumable")
            except OSError:
                pass                                            # its daemon is killed under it
        threading.Thread(target=doomed_pull, daemon=True).start()
        partial = data_dir / "models" / "blobs" / f"sha256-{hashlib.sha256(data).hexdigest()}.partial"
        deadline = time.monotonic() + 30
        while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.exists() and partial.stat().st_size > 0
        first.proc.kill()                                       # no goodbye: SIGKILL mid-pull
        first.proc.wait()
        have = partial.stat().st_size

        registry.blob_modes[digest_of(data)] = "ok"
        registry.release.set()
        second = start_daemon(config, data_dir=data_dir, models=True)
        status, _, body = pull(second, "resumable")
        assert status == 200 and body["sha256"] == hashlib.sha256(data).hexdigest()
        ranges = [r[2].get("Range") or r[2].get("range") for r in registry.seen("/blobs/")]
        assert f"bytes={have}-" in ranges
        assert not partial.exists()
    finally:
        registry.release.set()
        registry.stop()


# ---- a model llama.cpp cannot load is refused at the door, never aborted at load

@pytest.fixture(scope="module")
def duplicate_token_smollm2(tmp_path_factory):
    """The default SmolLM2 GGUF with one token overwritten by another: sound as a GGUF,
    but llama.cpp's vocabulary loader aborts the process on it."""
    path = tmp_path_factory.mktemp("crafted") / "smollm2-dup.gguf"
    duplicate_token_copy(path)
    return path


def post_slowly(daemon, path, body, key, port="cluster"):
    """One request with no client timeout a busy machine can hit (a 90 MB pull is silent
    until it is checked)."""
    conn = http.client.HTTPConnection("127.0.0.1", getattr(daemon, f"{port}_port"), timeout=600)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def still_serving(daemon) -> None:
    assert daemon.proc.poll() is None
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200
    status, _, listing = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert status == 200 and "smollm2-135m-instruct" in {m["id"] for m in listing["data"]}


def test_a_pulled_vocabulary_llama_cpp_cannot_load_is_refused(daemon, registry, duplicate_token_smollm2):
    data = duplicate_token_smollm2.read_bytes()
    registry.push_model("library/smollm2-dup", "latest", [(MEDIA_MODEL, data)])
    status, body = post_slowly(daemon, "/v1/models/pull", {"model": "smollm2-dup"}, daemon.admin_key)
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error"
    assert "cannot be loaded by llama.cpp" in body["error"]["message"]
    assert "twice" in body["error"]["message"]
    blobs = os.listdir(os.path.join(daemon.data_dir, "models", "blobs"))
    assert f"sha256-{hashlib.sha256(data).hexdigest()}" not in blobs
    # naming it afterwards is a plain "not in the store", never a load
    status, _, body = daemon.request("POST", "/v1/chat/completions", port="inference", key=daemon.admin_key,
                                     body={"model": "smollm2-dup:latest",
                                           "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404, body
    still_serving(daemon)


def test_cli_pull_refuses_it_too(registry, duplicate_token_smollm2, tmp_path):
    registry.push_model("library/smollm2-dup", "cli", [(MEDIA_MODEL, duplicate_token_smollm2.read_bytes())])
    data = str(tmp_path / "data")
    done = cli("models", "pull", "smollm2-dup:cli", "--registry", registry.url, data_dir=data)
    assert done.returncode == 1 and "cannot be loaded by llama.cpp" in done.stderr
    assert "smollm2-dup" not in cli("models", "list", data_dir=data).stdout


def test_a_model_from_an_older_store_is_checked_before_it_loads(start_daemon, duplicate_token_smollm2, tmp_path):
    data_dir = tmp_path / "data"
    old_store_manifest(ModelStore(str(data_dir)), str(duplicate_token_smollm2), "old/smollm2-dup:latest")
    daemon = start_daemon("[models]\npreload = []\n[rate_limits]\ncluster = 0\n", data_dir=data_dir, models=True)
    for _ in range(2):                    # an autoload, then an explicit load: each a 400, no abort
        status, body = post_slowly(daemon, "/v1/chat/completions", {
            "model": "old/smollm2-dup:latest", "messages": [{"role": "user", "content": "hi"}]},
            daemon.admin_key, port="inference")
        assert status == 400, body
        assert "cannot be loaded" in body["error"]["message"] and "twice" in body["error"]["message"]
        status, body = post_slowly(daemon, "/v1/models/load", {"model": "old/smollm2-dup:latest"},
                                   daemon.admin_key)
        assert status == 400, body
    still_serving(daemon)


def test_a_data_dir_made_by_the_models_cli_is_private(tmp_path):
    # `make setup` creates the data dir through `models defaults`; `models list` takes the same path
    data = tmp_path / "fresh"
    assert cli("models", "list", data_dir=str(data)).returncode == 0
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700


def test_a_name_with_a_listed_registry_host_pulls_from_that_registry(start_daemon, registry, tmp_path):
    registry.push_model("library/hosted", "v1", [(MEDIA_MODEL, tiny_gguf_bytes(tmp_path, "h.gguf"))])
    host = registry.url.removeprefix("http://")
    daemon = start_daemon(f"[models]\npreload = []\nregistries = [\"{registry.url}\"]\n", models=True)
    status, _, body = pull(daemon, f"{host}/library/hosted:v1")
    assert status == 200 and body["id"] == f"{host}/library/hosted:v1", body
    assert body["source"] == "registry"
    _, _, listing = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert f"{host}/library/hosted:v1" in {m["id"] for m in listing["data"]}
    # no models.registry configured: a plain name has nowhere to come from
    assert pull(daemon, "hosted:v1")[0] == 400


def test_a_registry_host_the_operator_did_not_list_is_refused(daemon, registry, tmp_path):
    registry.push_model("library/unlisted", "latest", [(MEDIA_MODEL, tiny_gguf_bytes(tmp_path, "u.gguf"))])
    for name in ("127.0.0.2:5000/library/unlisted", "registry.ollama.ai/library/qwen2.5:0.5b",
                 "hf.co/bartowski/x:Q4_K_M"):
        status, _, body = pull(daemon, name)
        assert status == 403 and body["error"]["type"] == "permission_error", body
        assert "models.registries" in body["error"]["message"]
    # the configured registry named by its host is that registry: the model keeps its plain id
    host = registry.url.removeprefix("http://")
    status, _, body = pull(daemon, f"{host}/unlisted")
    assert status == 200 and body["id"] == "unlisted:latest", body
