"""Models on demand: who uses each model now, when it was last used, when an idle one expires,
which ones are pinned, and what was loaded and unloaded for it (the registry's bookkeeping for
loads on demand, eviction and keep-alive; registry.py acts on it).

A model is in use while a request task holds it: registry.get registers the task that asked
(each HTTP request is answered by a task of its own, streaming included), and the task's end
releases it. A model with no user is idle; its keep-alive clock starts then (Ollama's rule: the
timer runs from the end of the last request), and a request stops it. A model being loaded for
a request counts that request as a user from the moment it asked, so a model loaded for a
waiting request is never the one evicted before that request runs.
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Callable

from ..system.durations import NEVER

# Why a model was unloaded without being asked to (stackd_model_evictions_total's reasons).
MEMORY, KEEP_ALIVE = "memory", "keep_alive"


class OnDemand:
    def __init__(self, loop: asyncio.AbstractEventLoop, keep_alive: float, pinned: frozenset[str],
                 expire: Callable[[str], None], now_idle: Callable[[str], None]):
        self.loop = loop
        self.keep_alive = keep_alive              # models.keep_alive, seconds (NEVER: < 0)
        self.pinned = set(pinned)                 # models.pinned, and serve --model's
        self.expire = expire                      # the registry's: unload an idle model now
        self.now_idle = now_idle                  # the registry's: nobody uses the model any more
        self.users: dict[str, set[asyncio.Task]] = {}
        self.last_used: dict[str, float] = {}     # model id -> loop time it was last asked for or freed
        self.keep_alives: dict[str, float] = {}   # model id -> its load's own keep_alive
        self.timers: dict[str, asyncio.TimerHandle] = {}
        self.expires_at: dict[str, float] = {}    # model id -> wall-clock time its timer fires
        self.loads = collections.Counter()        # model id -> loads
        self.load_seconds = collections.Counter() # model id -> seconds its loads took, summed
        self.evictions = collections.Counter()    # (model id, reason) -> unloads not asked for

    # ---- use -------------------------------------------------------------------------------------

    def use(self, model_id: str) -> None:
        """The running task uses the model until it ends; its keep-alive clock stops."""
        self.last_used[model_id] = self.loop.time()
        self._disarm(model_id)
        task = asyncio.current_task()
        if task is None:
            return
        users = self.users.setdefault(model_id, set())
        if task not in users:
            users.add(task)
            task.add_done_callback(lambda done: self._release(model_id, done))

    def _release(self, model_id: str, task: asyncio.Task) -> None:
        users = self.users.get(model_id)
        if users is None:
            return
        users.discard(task)
        self.last_used[model_id] = self.loop.time()
        if not users:
            del self.users[model_id]
            self.now_idle(model_id)

    def in_use(self, model_id: str) -> int:
        return len(self.users.get(model_id, ()))

    # ---- keep-alive ------------------------------------------------------------------------------

    def keep_alive_of(self, model_id: str) -> float:
        return self.keep_alives.get(model_id, self.keep_alive)

    def idle(self, model_id: str) -> None:
        """The model is loaded and nobody uses it: its keep-alive starts (unless pinned, never
        expiring, or already running). The registry checks that it is loaded."""
        seconds = self.keep_alive_of(model_id)
        if model_id in self.users or model_id in self.pinned or seconds == NEVER or model_id in self.timers:
            return
        self.timers[model_id] = self.loop.call_later(seconds, self._fire, model_id)
        self.expires_at[model_id] = time.time() + seconds

    def _fire(self, model_id: str) -> None:
        self.timers.pop(model_id, None)
        self.expires_at.pop(model_id, None)
        self.expire(model_id)

    def _disarm(self, model_id: str) -> None:
        timer = self.timers.pop(model_id, None)
        if timer is not None:
            timer.cancel()
        self.expires_at.pop(model_id, None)

    def loaded(self, model_id: str, keep_alive: float | None, seconds: float = 0.0) -> None:
        """A load put the model into service (`seconds`: its engine's start): counted with its
        time, and its keep-alive set (kept)."""
        self.loads[model_id] += 1
        self.load_seconds[model_id] += seconds
        self.kept(model_id, keep_alive)

    def kept(self, model_id: str, keep_alive: float | None) -> None:
        """A model in service: its keep-alive (the load's own, else the setting), its clock
        stopped until it is idle. Asking to load a model already in service comes here alone."""
        if keep_alive is not None:
            self.keep_alives[model_id] = keep_alive
        self._disarm(model_id)                    # a new keep-alive restarts the clock
        self.last_used[model_id] = self.loop.time()

    def unloaded(self, model_id: str, reason: str | None = None) -> None:
        """Out of memory: no clock, no keep-alive of its own (a new load sets one); `reason`:
        an eviction's."""
        self._disarm(model_id)
        self.keep_alives.pop(model_id, None)
        if reason is not None:
            self.evictions[(model_id, reason)] += 1

    def expiry(self, model_id: str) -> int | None:
        """When the idle model will be unloaded (unix seconds), None while it is used, pinned or
        kept for ever."""
        at = self.expires_at.get(model_id)
        return int(at) if at is not None else None

    # ---- eviction --------------------------------------------------------------------------------

    def least_recent_first(self, model_ids) -> list[str]:
        return sorted(model_ids, key=lambda m: self.last_used.get(m, 0.0))

    def why_kept(self, model_id: str) -> str | None:
        """Why an eviction may not take the model now (None: it may)."""
        if model_id in self.pinned:
            return "pinned"
        n = self.in_use(model_id)
        if n:
            return f"in use by {n} request{'s' if n != 1 else ''}"
        return None
