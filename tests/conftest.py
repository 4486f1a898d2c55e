import asyncio
import os
import time

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


# CI's budget (the Makefile sets STACKD_SUITE_DEADLINE, a Unix time, when CI is set): CI has 90
# minutes for the whole run, on whatever machine it gets, and a run it ends reports nothing. Past
# the deadline the tests not yet run are skipped, each with a reason that says so, and the summary
# counts them: a slow machine's run ends short, and says where, instead of being cut off.
SUITE_DEADLINE = float(os.environ.get("STACKD_SUITE_DEADLINE") or 0)
BUDGET_REASON = "CI's time budget (STACKD_SUITE_DEADLINE) had passed"


def pytest_runtest_setup(item):
    if SUITE_DEADLINE and time.time() > SUITE_DEADLINE:
        pytest.skip(BUDGET_REASON)


def pytest_terminal_summary(terminalreporter):
    cut = [r for r in terminalreporter.stats.get("skipped", [])
           if isinstance(r.longrepr, tuple) and BUDGET_REASON in str(r.longrepr[2])]
    if cut:
        terminalreporter.write_line(f"make test: {len(cut)} tests skipped: {BUDGET_REASON}")


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
