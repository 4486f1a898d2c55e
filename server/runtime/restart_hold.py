"""Requests held while a model's worker restarts (engine.restart_hold).

A worker that dies costs only what it had in flight: a request that arrives while its model is
`restarting` waits for the restart (registry.get), and a request the death caught before its
first event waits too and is submitted again on the restarted worker (runner.Held; a replica
set's Routed tries another replica first). The wait is bounded by engine.restart_hold seconds
from the request's arrival and by engine.max_queue requests held per model; past either, or
when the restart ends with the model `failed`, the answer is the 503 it always was, with
Retry-After.
"""
from __future__ import annotations

import asyncio
import collections

from ..engine.errors import EngineError
from .runner import LOST

# Between two lookups of a model whose worker was lost under a request (RestartHold.across).
LOOKUP_PAUSE = 0.05


class RestartHold:
    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, max_held: int, state):
        self.loop = loop
        self.seconds = seconds
        self.max_held = max_held
        self.state = state                       # model id -> its state (the registry's)
        self.restarts: dict[str, asyncio.Task] = {}   # model id -> its restart (supervisor.py)
        self.held = collections.Counter()        # model id -> requests waiting for it now

    def deadline(self) -> float:
        """How long a request that arrives now may wait for a restart."""
        return self.loop.time() + self.seconds

    def restarting(self, model_id: str, restart: asyncio.Task) -> None:
        self.restarts[model_id] = restart
        restart.add_done_callback(lambda _: self._over(model_id, restart))

    def _over(self, model_id: str, restart: asyncio.Task) -> None:
        if self.restarts.get(model_id) is restart:
            del self.restarts[model_id]

    async def across(self, model_id: str, submit):
        """`submit()` (from the model's lookup to its jobs' submit) again if the model's worker
        died under it: looked up just before, the model's engine went away while the request
        was rendered. A later lookup waits for the restarted worker (registry.get's wait). The
        worker's loss can reach the request (its engine closed) a loop turn before the registry
        says `restarting`, so a lookup may still find the dead engine: tried again after a pause
        while the hold's bound has not passed (a lookup begun before it may itself hold for the
        restart, so a request waits at most about twice engine.restart_hold). A model unloaded
        meanwhile is not loaded again for it. Once submitted, a request lost before its first
        event is the runner's to submit again (runner.Held, replicas.Routed)."""
        until = self.deadline()
        while True:
            try:
                return await submit()
            except EngineError as exc:
                if (exc.code not in LOST or self.state(model_id) not in ("restarting", "loaded")
                        or self.loop.time() >= until):
                    raise
            await asyncio.sleep(LOOKUP_PAUSE)

    async def wait(self, model_id: str, until: float) -> None:
        """Until the model is no longer `restarting`, `until` passes, or more requests than
        max_held wait for it (then at once); the caller looks at the state afterwards."""
        if self.held[model_id] >= self.max_held:
            return
        self.held[model_id] += 1
        try:
            while self.state(model_id) == "restarting":
                remaining = until - self.loop.time()
                restart = self.restarts.get(model_id)
                if remaining <= 0 or restart is None:
                    return
                await asyncio.wait([restart], timeout=remaining)
        finally:
            self.held[model_id] -= 1
            if not self.held[model_id]:
                del self.held[model_id]
