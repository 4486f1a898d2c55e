"""Every console test runs against SQLite and against a real PostgreSQL server."""
from __future__ import annotations

import pytest

from testing.console_harness import Harness
from .postgres import SKIP_REASON, PostgresServer

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer()
    if not server.available:
        yield None
        return
    server.start()
    yield server
    server.stop()


def database_url(backend: str, postgres) -> str:
    if backend == "sqlite":
        return ""
    if postgres is None:
        pytest.skip(SKIP_REASON)
    import asyncio
    return asyncio.run(postgres.new_database())


@pytest.fixture(scope="module", params=BACKENDS)
def shared(request, postgres, tmp_path_factory):
    """One console per module and backend, for tests that only add to its data."""
    harness = Harness(str(tmp_path_factory.mktemp("console")), database_url(request.param, postgres))
    yield harness
    harness.close()


@pytest.fixture(params=BACKENDS)
def fresh(request, postgres, tmp_path):
    """A console of its own, for tests that need a clean slate or a setting of their own."""
    made = []

    def make(**settings) -> Harness:
        harness = Harness(str(tmp_path / f"c{len(made)}"), database_url(request.param, postgres),
                          **settings)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


@pytest.fixture(scope="session")
def embedded_daemon(tmp_path_factory):
    """One real daemon with the default chat model and its embedded console, for the session."""
    from testing.console_embedded import CHAT_ONLY, EmbeddedDaemon

    daemon = EmbeddedDaemon(str(tmp_path_factory.mktemp("embedded") / "data"), CHAT_ONLY)
    yield daemon
    daemon.stop()
