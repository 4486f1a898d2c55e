import pytest

from testing.daemon import Daemon


@pytest.fixture
def start_daemon(tmp_path):
    started = []

    def start(config: str = "", data_dir=None, **kwargs) -> Daemon:
        # kwargs: env=..., models=True to let the daemon load models
        daemon = Daemon(str(data_dir or tmp_path / "data"), config, **kwargs)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def daemon(start_daemon):
    return start_daemon()
