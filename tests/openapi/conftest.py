import time

import pytest

from ..blackbox.daemon import Daemon, create_key

# Real default models with a small context, few slots, no rate limit (schemathesis sends
# hundreds of requests; 429 is documented but would hide everything behind it).
LIVE_CONFIG = ("[rate_limits]\ninference = 0\ncluster = 0\n"
               "[engine]\nslots = 4\ncontext_length = 128\nisolation = \"inline\"\n")
# inline: against the worker-process engine (the default since 01bb829) this run did not
# finish within 15 minutes on a loaded machine (a request waiting on the worker, not yet
# diagnosed); reported, and to be switched back once that is found.


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
