"""Requests held while a model's worker restarts (engine.restart_hold): until it is back, until
the bound, and never more than max_held at once."""
import asyncio

from stackd.runtime.restart_hold import RestartHold


def hold_of(loop, seconds=600.0, max_held=2):
    states = {"m": "restarting"}
    return RestartHold(loop, seconds, max_held, states.__getitem__), states


def test_a_held_request_goes_on_when_the_restart_is_over(loop):
    hold, states = hold_of(loop, seconds=600)

    async def run():
        async def restart():
            await asyncio.sleep(0.05)
            states["m"] = "loaded"
        hold.restarting("m", asyncio.ensure_future(restart()))
        deadline = hold.deadline()
        await hold.wait("m", deadline)
        return loop.time() < deadline                 # woken by the restart, not by the bound
    assert loop.run_until_complete(run())
    assert states["m"] == "loaded" and not hold.restarts and not hold.held


def test_a_held_request_waits_no_longer_than_its_bound(loop):
    hold, states = hold_of(loop, seconds=0.05)

    async def run():
        restart = asyncio.ensure_future(asyncio.sleep(60))
        hold.restarting("m", restart)
        await hold.wait("m", hold.deadline())
        restart.cancel()
    loop.run_until_complete(run())
    assert states["m"] == "restarting"                # the caller answers 503


def test_no_more_than_max_held_requests_wait(loop):
    hold, states = hold_of(loop, max_held=2)

    async def run():
        restart = asyncio.ensure_future(asyncio.sleep(60))
        hold.restarting("m", restart)
        waiting = [asyncio.ensure_future(hold.wait("m", hold.deadline())) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert hold.held["m"] == 2
        await asyncio.wait_for(hold.wait("m", hold.deadline()), 1.0)   # the third: at once
        restart.cancel()
        await asyncio.gather(*waiting)
    loop.run_until_complete(run())


def test_the_bound_ends_a_wait_for_a_restart_that_never_ends(loop):
    """The restart never finishes: only the bound (engine.restart_hold) lets the request go.
    The outer wait_for is a hang guard, far past the bound, never the measure."""
    hold, states = hold_of(loop, seconds=0.05)

    async def run():
        restart = loop.create_future()                # a restart that never ends
        hold.restarting("m", restart)
        deadline = hold.deadline()
        await asyncio.wait_for(hold.wait("m", deadline), 30.0)
        gone_at = loop.time()
        assert not restart.done() and gone_at >= deadline
        restart.cancel()
    loop.run_until_complete(run())
    assert states["m"] == "restarting" and not hold.held
