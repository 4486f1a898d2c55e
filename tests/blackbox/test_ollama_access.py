"""Who may use the Ollama port: the same keys as port 8080, and, only where the operator lists
networks (ollama.anonymous_networks), requests without a key from them as one inference-only
principal with its own rate limit. Daemons without models: access is decided before any."""
import pytest

from testing.daemon import Daemon

pytestmark = pytest.mark.slow

NO_MODELS = "[models]\npreload = []\n"


def start(tmp_path, extra: str) -> Daemon:
    return Daemon(str(tmp_path / "data"), NO_MODELS + extra, ollama=True)


def test_without_listed_networks_every_request_but_the_probes_needs_a_key(tmp_path):
    daemon = start(tmp_path, "")
    try:
        assert daemon.request("GET", "/", port="ollama")[0] == 200
        assert daemon.request("HEAD", "/", port="ollama")[0] == 200
        assert daemon.request("GET", "/api/version", port="ollama")[0] == 200
        status, _, body = daemon.request("GET", "/api/tags", port="ollama")
        assert status == 401 and isinstance(body["error"], str)
        assert daemon.request("GET", "/api/tags", port="ollama", key=daemon.admin_key)[0] == 200
        status, _, body = daemon.request("GET", "/api/tags", port="ollama", key="sk-wrong")
        assert status == 401 and isinstance(body["error"], str)
    finally:
        daemon.stop()


def test_a_listed_network_gets_inference_alone_with_its_own_rate_limit(tmp_path):
    daemon = start(tmp_path, "[ollama]\nanonymous_networks = [\"127.0.0.0/8\"]\nanonymous_rate_limit = 5\n"
                             "[rate_limits]\ninference = 0\n")
    try:
        status, headers, body = daemon.request("GET", "/api/tags", port="ollama")
        assert status == 200 and "models" in body and headers["x-ratelimit-limit"] == "5"
        status, _, body = daemon.request("DELETE", "/api/delete", port="ollama", body={"model": "x"})
        assert status == 403 and "inference" in body["error"]
        statuses = [daemon.request("GET", "/api/ps", port="ollama")[0] for _ in range(6)]
        assert 429 in statuses                                    # its own limit, not the keys'
        assert daemon.request("GET", "/api/ps", port="ollama", key=daemon.admin_key)[0] == 200
    finally:
        daemon.stop()


def test_a_network_not_listed_still_needs_a_key(tmp_path):
    daemon = start(tmp_path, "[ollama]\nanonymous_networks = [\"10.0.0.0/8\"]\n")
    try:
        assert daemon.request("GET", "/api/tags", port="ollama")[0] == 401
    finally:
        daemon.stop()
