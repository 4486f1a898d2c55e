"""One real daemon with the default models for the client-library suites of this folder.

Each module drives it through a library people build agents with, unchanged: the official
openai and anthropic SDKs, langchain-openai, instructor, pydantic-ai and openai-agents. The
README's client matrix lists what each test shows. Client timeouts are generous (a slow CI run
must not hit them) and retries are off (a retry would hide a failed first answer).
"""
import pytest

from testing.daemon import Daemon

CHAT = "smollm2-135m-instruct"
CLIENT_TIMEOUT = 600.0
# engine.batch_invariant: a greedy answer independent of what shared its steps or was cached
# before it, so each library's multi-turn agent sees the same answers in every run (without
# it a 135M model's near ties went another way once in a full suite run)
CONFIG = "[rate_limits]\ninference = 0\n[engine]\nslots = 4\ncontext_length = 4096\nbatch_invariant = true\n"


@pytest.fixture(scope="package")
def daemon(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("clients") / "data"), CONFIG, models=True)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="package")
def base_url(daemon) -> str:
    return f"http://127.0.0.1:{daemon.inference_port}/v1"


@pytest.fixture(scope="package")
def api_key(daemon) -> str:
    return daemon.admin_key


@pytest.fixture(scope="package")
def openai_client(daemon):
    return daemon.openai_client()


@pytest.fixture(scope="package")
def async_openai_client(daemon):
    return daemon.openai_client(asynchronous=True)
