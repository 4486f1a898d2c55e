"""Local GGUF files into a real daemon's store: POST /v1/models/import (admin keys, the import
directory only), `stackd models add`, and `stackd serve --model PATH`."""
import os
import shutil
import time

import pytest

from stackd.store.defaults import smollm2_path
from testing.daemon import cli, create_key, http_request, start_process, stackd_command
from tests.store.crafted import crafted
from tests.store.tiny import vocabulary, write_tiny

pytestmark = pytest.mark.slow


@pytest.fixture
def daemon(start_daemon, tmp_path):
    import_dir = tmp_path / "import"
    import_dir.mkdir()
    started = start_daemon(f"[models]\npreload = []\nimport_dir = \"{import_dir}\"\n"
                           "[rate_limits]\ncluster = 0\n", models=True)
    started.import_dir = str(import_dir)
    return started


def import_(daemon, body, key="admin"):
    return daemon.request("POST", "/v1/models/import", key=daemon.admin_key if key == "admin" else key,
                          body=body)


def assert_error(answer, status, kind, words):
    got, _, body = answer
    assert got == status, body
    assert set(body["error"]) >= {"code", "message", "type"} and body["error"]["code"] == status
    assert body["error"]["type"] == kind and words in body["error"]["message"], body


def test_an_imported_model_is_listed_loads_and_answers(daemon):
    shutil.copy(smollm2_path(), os.path.join(daemon.import_dir, "SmolLM2-135M-Instruct.Q4_1.gguf"))
    status, _, body = import_(daemon, {"path": "SmolLM2-135M-Instruct.Q4_1.gguf", "name": "mine:q4_1"})
    assert status == 200 and body["status"] == "success", body
    assert (body["id"], body["source"], body["kind"], body["state"]) == ("mine:q4_1", "local", "chat", "available")
    status, _, answer = daemon.request("POST", "/v1/chat/completions", port="inference", key=daemon.admin_key,
                                       body={"model": "mine:q4_1", "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and answer["model"] == "mine:q4_1", answer


@pytest.mark.parametrize("permissions", ["models:manage", "inference,cluster:read,cluster:write"])
def test_only_admin_keys_may_import(daemon, permissions):
    write_tiny(os.path.join(daemon.import_dir, "t.gguf"))
    key = create_key(daemon.data_dir, permissions.replace(",", "-").replace(":", "-"), permissions)
    for _ in range(100):                              # a new key is known within half a second
        answer = import_(daemon, {"path": "t.gguf"}, key=key)
        if answer[0] != 401:
            break
        time.sleep(0.1)
    assert_error(answer, 403, "permission_error", "admin")
    assert_error(import_(daemon, {"path": "t.gguf"}, key=None), 401, "authentication_error", "")
    assert import_(daemon, {"path": "t.gguf"})[0] == 200          # the admin key may


def test_a_request_cannot_name_a_file_outside_the_import_directory(daemon, tmp_path):
    outside = write_tiny(tmp_path / "outside.gguf")
    os.symlink(outside, os.path.join(daemon.import_dir, "link.gguf"))
    for path in (outside, "../outside.gguf", "link.gguf", "/etc/passwd", "."):
        assert_error(import_(daemon, {"path": path}), 403, "permission_error", "outside the import directory")
    _, _, listing = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert listing["data"] == [] or all(m["source"] != "local" for m in listing["data"])


@pytest.mark.parametrize("kind", ["truncated", "not gguf", "duplicate token", "unknown architecture"])
def test_a_crafted_file_is_refused_with_the_reason_and_leaves_nothing(daemon, kind):
    store = os.path.join(daemon.data_dir, "models")
    before = {folder: os.listdir(os.path.join(store, folder)) for folder in ("blobs", "manifests")}
    path = os.path.join(daemon.import_dir, "bad.gguf")
    if kind == "duplicate token":
        tokens, _, _ = vocabulary()
        tokens[-1] = tokens[-2]
        write_tiny(path, tokens=tokens)
        reason = "cannot be loaded by llama.cpp"
    elif kind == "unknown architecture":
        write_tiny(path, arch="nosucharch")
        reason = "unknown model architecture"
    else:
        good = open(write_tiny(os.path.join(daemon.import_dir, "good.gguf")), "rb").read()
        open(path, "wb").write(crafted(good, kind))
        reason = "not a valid GGUF model"
    assert_error(import_(daemon, {"path": "bad.gguf"}), 400, "invalid_request_error", reason)
    assert {folder: os.listdir(os.path.join(store, folder)) for folder in before} == before
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200


def test_names_and_missing_files(daemon):
    write_tiny(os.path.join(daemon.import_dir, "a.gguf"))
    write_tiny(os.path.join(daemon.import_dir, "b.gguf"), rows=32)
    assert import_(daemon, {"path": "a.gguf", "name": "m:1"})[0] == 200
    assert_error(import_(daemon, {"path": "b.gguf", "name": "m:1"}), 409, "conflict_error", "already has")
    assert_error(import_(daemon, {"path": "missing.gguf"}), 404, "not_found_error", "No such file")
    assert_error(import_(daemon, {"path": "a.gguf", "name": "../x"}), 400, "invalid_request_error", "names")
    assert_error(import_(daemon, {"path": 5}), 400, "invalid_request_error", "path")
    assert_error(import_(daemon, {}), 400, "invalid_request_error", "path")


def test_cli_models_add(tmp_path):
    data = str(tmp_path / "data")
    good = write_tiny(tmp_path / "Good-Model.gguf")
    done = cli("models", "add", good, data_dir=data)
    assert done.returncode == 0 and done.stdout.startswith("added good-model\t"), done.stderr
    assert "good-model" in cli("models", "list", data_dir=data).stdout
    other = write_tiny(tmp_path / "other.gguf", rows=32)
    clash = cli("models", "add", other, "--name", "good-model", data_dir=data)
    assert clash.returncode == 1 and "already has a model named 'good-model'" in clash.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(crafted(open(good, "rb").read(), "truncated"))
    refused = cli("models", "add", str(bad), data_dir=data)
    assert refused.returncode == 1 and "not a valid GGUF model" in refused.stderr
    missing = cli("models", "add", str(tmp_path / "nope.gguf"), data_dir=data)
    assert missing.returncode == 1 and "cannot open nope.gguf" in missing.stderr
    assert sorted(os.listdir(os.path.join(data, "models", "blobs"))) == [
        "sha256-" + __import__("hashlib").sha256(open(good, "rb").read()).hexdigest()]


def test_serve_model_adds_and_loads_the_file(tmp_path):
    shipped = tmp_path / "firmware" / "Assistant.gguf"
    shipped.parent.mkdir()
    shutil.copy(smollm2_path(), shipped)
    data = str(tmp_path / "data")
    stdout, stderr = [], []
    proc, ports = start_process(stackd_command("serve", "--data-dir", data, "--inference-port", "0",
                                               "--cluster-port", "0", "--model", str(shipped)),
                                dict(os.environ), stdout, stderr, until={"inference", "cluster"})
    try:
        assert "stackd: loaded chat model assistant (context 2048, 16 slots)\n" in stdout
        key = open(os.path.join(data, "admin.key")).read().strip()
        status, _, body = http_request("127.0.0.1", ports["inference"], "POST", "/v1/chat/completions", key=key,
                                       body={"model": "assistant", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "Hi"}]})
        assert status == 200, body
        _, _, listing = http_request("127.0.0.1", ports["inference"], "GET", "/v1/models", key=key)
        loaded = {m["id"] for m in listing["data"] if m["state"] == "loaded"}
        assert loaded == {"assistant"}                     # --model replaces models.preload
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_model_with_a_bad_file_stops_with_the_reason(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    done = cli("serve", "--inference-port", "0", "--cluster-port", "0", "--model", str(bad),
               data_dir=str(tmp_path / "data"))
    assert done.returncode == 1
    assert "cannot load the models: import refused: broken.gguf is not a valid GGUF model" in done.stderr
