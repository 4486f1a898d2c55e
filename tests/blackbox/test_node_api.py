"""The node daemon from the outside: the real process, its ports, its key file."""
import os
import signal
import stat
import time
import uuid

import pytest

from testing.daemon import cli, create_key

pytestmark = pytest.mark.slow


def test_first_start_writes_an_admin_key(daemon):
    path = os.path.join(daemon.data_dir, "admin.key")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert any("admin API key written to" in line and path in line for line in daemon.stdout)
    status, _, _ = daemon.request("GET", "/v1/health", key=daemon.admin_key)
    assert status == 200


def test_health(daemon):
    status, headers, body = daemon.request("GET", "/v1/health", key=daemon.admin_key)
    assert status == 200 and headers["content-type"] == "application/json"
    assert body["status"] == "ok"
    assert isinstance(body["uptime_seconds"], int) and body["uptime_seconds"] >= 0
    assert body["temperature_c"] is None or isinstance(body["temperature_c"], float)


def test_topology_and_ids_survive_a_restart(start_daemon, tmp_path):
    first = start_daemon()
    _, _, topology = first.request("GET", "/v1/topology", key=first.admin_key)
    assert topology["node_count"] == 1 == len(topology["nodes"])
    node = topology["nodes"][0]
    assert node["role"] == "leader" and topology["leader"] == node["id"]
    assert isinstance(node["ram_gb"], int) and node["ram_gb"] >= 1
    assert first.stop() == 0
    second = start_daemon()
    _, _, again = second.request("GET", "/v1/topology", key=first.admin_key)
    assert (again["cluster_id"], again["leader"]) == (topology["cluster_id"], topology["leader"])


def test_cluster_status_and_nodes(daemon):
    _, _, cluster = daemon.request("GET", "/v1/cluster", key=daemon.admin_key)
    assert cluster["status"] == "healthy" and cluster["active_model"] is None
    assert isinstance(cluster["total_ram_gb"], int) and cluster["total_ram_gb"] >= 1
    _, _, nodes = daemon.request("GET", "/v1/nodes", key=daemon.admin_key)
    [node] = nodes["data"]
    for field in ("id", "role", "status", "cpu_cores", "load_average", "memory_total_bytes",
                  "memory_available_bytes", "disk_free_bytes", "uptime_seconds", "loaded_models"):
        assert field in node, field
    assert 0 < node["memory_available_bytes"] <= node["memory_total_bytes"]
    assert node["disk_free_bytes"] > 0 and node["loaded_models"] == []


def test_metrics_are_prometheus_text(daemon):
    daemon.request("GET", "/v1/health", key=daemon.admin_key)
    daemon.request("GET", "/v1/health")
    status, headers, body = daemon.request("GET", "/metrics", key=daemon.admin_key)
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'stackd_http_requests_total{app="cluster",route="GET /v1/health",status="200"} 1' in text
    assert 'route="GET /v1/health",status="401"} 1' in text
    assert "stackd_http_request_duration_seconds_bucket" in text
    assert "stackd_http_open_connections" in text


# ---- authentication and permissions --------------------------------------------------------

@pytest.mark.parametrize("path,port", [("/v1/health", "cluster"), ("/v1/models", "inference"),
                                       ("/metrics", "cluster"), ("/v1/models/load", "inference")])
def test_every_route_needs_a_key(daemon, path, port):
    method = "POST" if path.endswith("load") else "GET"
    status, headers, body = daemon.request(method, path, port=port)
    assert status == 401 and headers["www-authenticate"].startswith("Bearer")
    assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == 401


@pytest.mark.parametrize("header", ["Bearer sk-wrong", "Basic abc", "Bearer", "sk-nokeyword", ""])
def test_bad_credentials_are_401(daemon, header):
    status, _, body = daemon.request("GET", "/v1/health", headers={"Authorization": header})
    assert status == 401 and body["error"]["type"] == "authentication_error"


def test_permissions_are_enforced(daemon):
    inference = create_key(daemon.data_dir, "app", "inference")
    reader = create_key(daemon.data_dir, "probe", "cluster:read")
    time.sleep(1.2)                     # the daemon picks up the key file on its sweep
    status, _, body = daemon.request("GET", "/v1/health", key=inference)
    assert status == 403 and body["error"]["type"] == "permission_error"
    assert "cluster:read" in body["error"]["message"]
    assert daemon.request("GET", "/v1/models", port="inference", key=inference)[0] == 200
    assert daemon.request("GET", "/v1/models", port="inference", key=reader)[0] == 403
    status, _, body = daemon.request("POST", "/v1/power/contract", key=reader, body={})
    assert status == 403 and "cluster:write" in body["error"]["message"]
    status, _, body = daemon.request("POST", "/v1/models/load", key=reader, body={"model": "m"})
    assert status == 403 and "models:manage" in body["error"]["message"]


def test_keys_take_effect_and_are_revoked_without_restart(daemon):
    key = create_key(daemon.data_dir, "late", "cluster:read")
    assert _eventually(lambda: daemon.request("GET", "/v1/health", key=key)[0] == 200)
    assert cli("keys", "revoke", "late", data_dir=daemon.data_dir).returncode == 0
    assert _eventually(lambda: daemon.request("GET", "/v1/health", key=key)[0] == 401)


def _eventually(check, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("port", ["inference", "cluster"])
def test_model_management_is_on_both_ports_and_validates(daemon, port):
    status, _, body = daemon.request("POST", "/v1/models/load", port=port, key=daemon.admin_key,
                                     body={"model": 5})
    assert status == 400 and "'model'" in body["error"]["message"]
    status, _, body = daemon.request("POST", "/v1/models/load", port=port, key=daemon.admin_key,
                                     body={"model": "m", "options": {"context_length": "big"}})
    assert status == 400 and "context_length" in body["error"]["message"]
    status, _, body = daemon.request("POST", "/v1/models/pull", port=port, key=daemon.admin_key,
                                     body={"model": "m"})
    assert status == 400 and "registry" in body["error"]["message"]


def test_inference_endpoints_reject_bad_json(daemon):
    status, _, body = daemon.request("POST", "/v1/chat/completions", port="inference",
                                     key=daemon.admin_key, body=b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    status, _, body = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert status == 200 and {m["id"]: m["state"] for m in body["data"]} == {
        "smollm2-135m-instruct": "available", "all-minilm-l6-v2": "available"}


# ---- rate limits ---------------------------------------------------------------------------

def test_inference_rate_limit_and_headers(start_daemon):
    daemon = start_daemon("[rate_limits]\ninference = 3\n")
    for remaining in (2, 1, 0):
        status, headers, _ = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
        assert status == 200
        assert headers["x-ratelimit-limit"] == "3"
        assert headers["x-ratelimit-remaining"] == str(remaining)
        assert int(headers["x-ratelimit-reset"]) >= 1
    status, headers, body = daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert status == 429 and body["error"]["type"] == "rate_limit_error"
    assert int(headers["retry-after"]) >= 1 and headers["x-ratelimit-remaining"] == "0"
    # the cluster group has its own bucket
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200


def test_a_refused_key_waits_for_its_429_while_other_keys_are_answered(start_daemon):
    """rate_limits.refusal_delay: a client that retries at once, ignoring Retry-After, gets its
    429 held back (here 2 s, the whole Retry-After at 1 a minute); the node meanwhile answers
    everyone else at once, since the wait is a timer."""
    import threading

    daemon = start_daemon("[rate_limits]\ninference = 1\nrefusal_delay = 2.0\n"
                          "[rate_limits.keys.admin]\ninference = 0\n")
    limited = create_key(daemon.data_dir, "limited", "inference")
    for _ in range(300):                             # the daemon picks up the new key file
        status = daemon.request("GET", "/v1/models", port="inference", key=limited)[0]
        if status != 401:
            break
        time.sleep(0.1)
    assert status == 200
    order = []

    def refused():
        status, headers, _ = daemon.request("GET", "/v1/models", port="inference", key=limited)
        order.append(("limited", status, headers.get("retry-after")))

    thread = threading.Thread(target=refused)
    thread.start()
    for _ in range(5):                               # another key, while the 429 is held back
        assert daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)[0] == 200
        order.append(("other", 200, None))
    thread.join()
    assert order[-1][:2] == ("limited", 429) and int(order[-1][2]) >= 1
    assert [entry[0] for entry in order[:5]] == ["other"] * 5


def test_refusal_delay_zero_answers_at_once_and_a_negative_one_is_refused(start_daemon, tmp_path):
    from stackd import config

    with pytest.raises(config.ConfigError, match="refusal_delay"):
        config.load(cli={"data_dir": str(tmp_path)}, environ={"STACKD_RATE_LIMITS_REFUSAL_DELAY": "-1"})
    daemon = start_daemon("[rate_limits]\ninference = 1\nrefusal_delay = 0\n")
    daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)
    assert daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)[0] == 429


def test_model_management_counts_against_the_cluster_group(start_daemon):
    daemon = start_daemon("[rate_limits]\ncluster = 2\n")
    daemon.request("GET", "/v1/health", key=daemon.admin_key)
    daemon.request("POST", "/v1/models/unload", port="inference", key=daemon.admin_key,
                   body={"model": "m"})
    status, _, _ = daemon.request("POST", "/v1/models/unload", port="inference",
                                  key=daemon.admin_key, body={"model": "m"})
    assert status == 429


def test_per_key_override(start_daemon):
    daemon = start_daemon("[rate_limits]\ninference = 1\n[rate_limits.keys.admin]\ninference = 5\n")
    statuses = [daemon.request("GET", "/v1/models", port="inference", key=daemon.admin_key)[0]
                for _ in range(6)]
    assert statuses == [200] * 5 + [429]


# ---- request ids and the access log --------------------------------------------------------

def test_request_id_is_echoed_or_made_and_logged(daemon):
    _, headers, _ = daemon.request("GET", "/v1/health", key=daemon.admin_key,
                                   headers={"X-Request-ID": "trace-42"})
    assert headers["x-request-id"] == "trace-42"
    _, headers, _ = daemon.request("GET", "/v1/health", key=daemon.admin_key)
    assert uuid.UUID(headers["x-request-id"]).version == 4
    assert _eventually(lambda: any('"request_id":"trace-42"' in line for line in daemon.stderr))
    line = next(line for line in daemon.stderr if '"request_id":"trace-42"' in line)
    assert '"key":"admin"' in line and daemon.admin_key not in "".join(daemon.stderr)


# ---- lifecycle -----------------------------------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cleanly(daemon, signum):
    assert daemon.stop(signum) == 0
    assert _eventually(lambda: any("stopped" in line for line in daemon.stdout), 60.0)


def test_bad_config_refuses_to_start(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "config.toml").write_text("[http]\nmax_connections = -1\n")
    done = cli("serve", data_dir=str(data))
    assert done.returncode == 2 and "max_connections" in done.stderr


def test_cli_keys(tmp_path):
    data = str(tmp_path / "d")
    created = cli("keys", "create", "--name", "ci", "--permissions", "inference,cluster:read",
                  data_dir=data)
    key = created.stdout.strip().splitlines()[-1]
    assert created.returncode == 0 and key.startswith("sk-")
    listed = cli("keys", "list", data_dir=data)
    assert "ci" in listed.stdout and "cluster:read,inference" in listed.stdout
    assert key not in listed.stdout
    bad = cli("keys", "create", "--name", "x", "--permissions", "root", data_dir=data)
    assert bad.returncode != 0 and "unknown permission" in bad.stderr
    assert cli("keys", "revoke", "ci", data_dir=data).returncode == 0
    assert cli("keys", "revoke", "ci", data_dir=data).returncode != 0


def test_sigterm_while_models_load_exits_cleanly(tmp_path):
    import subprocess

    from testing.daemon import stackd_command
    proc = subprocess.Popen(stackd_command("serve", "--data-dir", str(tmp_path / "d"),
                                           "--inference-port", "0", "--cluster-port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The key file is written after the signal handlers are in place and before the models
    # load: from then on a SIGTERM must end it cleanly (on a slow machine imports take seconds).
    assert _eventually(lambda: (tmp_path / "d" / "keys.json").exists(), 120.0)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
