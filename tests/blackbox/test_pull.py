"""Pulling through the daemon's API and the CLI, from a real registry on loopback."""
import hashlib
import json
import os
import struct

import pytest

from tests.models.registry_server import MEDIA_MODEL, MEDIA_PARAMS, MEDIA_TEMPLATE, RegistryServer

from tests.models.tiny import write_tiny

from .daemon import cli


def tiny_gguf_bytes(tmp_path, name="tiny.gguf", rows=16) -> bytes:
    path = tmp_path / name
    write_tiny(path, rows=rows)
    return path.read_bytes()


def crafted(valid: bytes, kind: str) -> bytes:
    if kind == "truncated":
        return valid[: len(valid) // 2]
    if kind == "absurd tensor count":
        return valid[:8] + struct.pack("<Q", 1 << 60) + valid[16:]
    if kind == "huge string length":
        # the first metadata key's length, right after magic, version and the two counts
        return valid[:24] + struct.pack("<Q", (1 << 63) - 1) + valid[32:]
    if kind == "not gguf":
        return b"\x7fELF" + valid[4:]
    raise AssertionError(kind)


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

    from tests.models.misbehaving import MisbehavingRegistry, digest_of

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
