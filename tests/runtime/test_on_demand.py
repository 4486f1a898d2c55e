"""The bookkeeping of models on demand (runtime/on_demand.py) on a real event loop: a request
task uses its model until it ends, the keep-alive clock runs only while nobody does, pins and
"never" stop it, and eviction takes the least recently used first."""
from __future__ import annotations

import asyncio

from stackd.runtime.on_demand import KEEP_ALIVE, MEMORY, OnDemand
from stackd.system.durations import NEVER


def on_demand(loop, keep_alive=3600.0, pinned=frozenset()):
    fired, idle = [], []
    made = OnDemand(loop, keep_alive, pinned, fired.append, idle.append)
    return made, fired, idle


def test_a_task_uses_its_model_until_it_ends(loop):
    demand, _, idle = on_demand(loop)
    release = asyncio.Event()

    async def request():
        demand.use("m")
        demand.use("m")                      # the same task twice is one user
        await release.wait()

    async def scenario():
        task = loop.create_task(request())
        await asyncio.sleep(0)
        assert demand.in_use("m") == 1 and demand.why_kept("m") == "in use by 1 request"
        release.set()
        await task
        await asyncio.sleep(0)               # the done callbacks
        assert demand.in_use("m") == 0 and demand.why_kept("m") is None and idle == ["m"]
    loop.run_until_complete(scenario())


def test_the_clock_runs_while_idle_and_a_request_stops_it(loop):
    demand, fired, idle = on_demand(loop)
    demand.loaded("m", None)
    demand.idle("m")
    assert demand.expiry("m") is not None and "m" in demand.timers
    seen = []

    async def request():
        demand.use("m")
        seen.append((demand.expiry("m"), "m" in demand.timers))
    loop.run_until_complete(loop.create_task(request()))
    loop.run_until_complete(asyncio.sleep(0))
    assert seen == [(None, False)]           # while the request ran, no clock
    assert idle == ["m"] and fired == []     # its end: the registry's idle callback starts it
    demand.idle("m")
    assert demand.expiry("m") is not None


def test_a_zero_keep_alive_fires_as_soon_as_idle(loop):
    demand, fired, _ = on_demand(loop, keep_alive=0.0)
    demand.loaded("m", None)
    demand.idle("m")
    loop.run_until_complete(asyncio.sleep(0.01))
    assert fired == ["m"] and demand.expiry("m") is None


def test_never_and_pinned_never_start_the_clock(loop):
    demand, _, _ = on_demand(loop, keep_alive=NEVER, pinned=frozenset({"p"}))
    for model in ("m", "p"):
        demand.loaded(model, None)
        demand.idle(model)
        assert demand.expiry(model) is None and model not in demand.timers
    demand.loaded("m", 10.0)                 # a load's own keep-alive beats the setting
    demand.idle("m")
    assert demand.expiry("m") is not None
    demand.loaded("p", 10.0)
    demand.idle("p")
    assert demand.expiry("p") is None and demand.why_kept("p") == "pinned"


def test_an_unload_forgets_the_clock_and_the_loads_own_keep_alive(loop):
    demand, fired, _ = on_demand(loop, keep_alive=NEVER)
    demand.loaded("m", 0.0)
    demand.idle("m")
    demand.unloaded("m", MEMORY)
    loop.run_until_complete(asyncio.sleep(0.01))
    assert fired == [] and demand.keep_alive_of("m") == NEVER
    demand.unloaded("m", KEEP_ALIVE)
    assert demand.evictions == {("m", MEMORY): 1, ("m", KEEP_ALIVE): 1}
    assert demand.loads == {"m": 1}


def test_the_least_recently_used_comes_first(loop):
    """Used: a request's arrival or its end, whichever came last."""
    demand, _, _ = on_demand(loop)

    async def request(model):
        demand.use(model)

    async def uses():
        for model in ("a", "b", "c", "a"):
            await loop.create_task(request(model))
            await asyncio.sleep(0.01)     # the loop's clock ticks in milliseconds
    loop.run_until_complete(uses())
    assert demand.least_recent_first(["a", "b", "c", "never-used"]) == ["never-used", "b", "c", "a"]


def test_a_load_is_counted_with_its_time_and_a_new_keep_alive_is_not_a_load(loop):
    demand, _, _ = on_demand(loop)
    demand.loaded("m", None, 2.5)
    demand.kept("m", 10.0)                   # the same model asked again with a keep-alive
    demand.loaded("m", None, 1.5)            # unloaded and loaded again
    assert demand.loads["m"] == 2 and demand.load_seconds["m"] == 4.0
    assert demand.keep_alives["m"] == 10.0
