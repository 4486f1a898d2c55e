import time

import pytest

from testing.daemon import Daemon, create_key

# Real default models with a small context, few slots, no rate limit (schemathesis sends
# hundreds of requests; 429 is documented but would hide everything behind it).
# The engines run in worker processes, the default (on a machine at load 17 this run once took
# over 15 minutes: slow, not stuck; at load 2 it takes about 6).
LIVE_CONFIG = ("[rate_limits]\ninference = 0\ncluster = 0\n"
               "[engine]\nslots = 4\ncontext_length = 128\n")


@pytest.fixture(scope="package")
def live(tmp_path_factory):
    daemon = Daemon(str(tmp_path_factory.mktemp("openapi") / "data"), LIVE_CONFIG, models=True)
    daemon.inference_key = create_key(daemon.data_dir, "reader", "inference")
    deadline = time.monotonic() + 60                # the daemon picks new keys up on its sweep
    while daemon.request("GET", "/openapi.json", key=daemon.inference_key)[0] == 401:
        assert time.monotonic() < deadline, "the daemon never picked up the new key"
        time.sleep(0.2)
    yield daemon
    daemon.stop()
