import asyncio

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


# The `slow` marker comes from the tests themselves: each module that starts real daemons,
# servers, engine workers or RPC servers says `pytestmark = pytest.mark.slow` (`-m "not slow"`
# leaves the suites that run in seconds).


def pytest_collection_modifyitems(config, items):
    # `netns` tests need network namespaces (root and iproute2): skipped, with the reason,
    # where they cannot be made.
    no_namespaces = netns.available()
    for item in items:
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
