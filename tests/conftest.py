import asyncio
import os

import pytest
import uvloop

from testing import netns


@pytest.fixture
def loop():
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    asyncio.set_event_loop(None)


# The `slow` marker, by where a test lives: these start real daemons, servers, engine workers
# or RPC servers (`-m "not slow"` leaves the suites that run in seconds). One list, here.
SLOW = ("blackbox/", "placement/", "openapi/", "observe/test_metrics.py", "observe/test_trace.py",
        "observe/test_worker_mode.py", "observe/test_dashboard.py", "cluster/test_membership.py",
        "cluster/test_netns.py", "console/", "kernels/", "engine/test_engine.py",
        "engine/test_hardening.py", "engine/test_lanes.py", "engine/test_frame_sink.py",
        "engine/test_grammar_fallback.py", "store/test_oci.py", "store/test_vocab_check.py",
        "image/test_cross_build.py", "image/test_boot.py")
TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    # `netns` tests need network namespaces (root and iproute2): skipped, with the reason,
    # where they cannot be made.
    no_namespaces = netns.available()
    for item in items:
        where = os.path.relpath(str(item.path), TESTS)
        if where.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        if no_namespaces and item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.skip(reason=no_namespaces))


@pytest.fixture
def namespaces():
    """Network namespaces for a test's nodes (testing/netns.py), removed once the daemons
    in them are gone: list it before the fixture that starts them."""
    netns.sweep()
    net = netns.Topology()
    try:
        yield net
    finally:
        net.close()
