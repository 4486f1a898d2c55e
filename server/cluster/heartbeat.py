"""A follower's heartbeat: every HEARTBEAT_INTERVAL, its own /v1/nodes entry (memory, load,
temperature, models, RPC state, power budget) to the leader; the answer is the leader's view
(membership.accept_answer).

One heartbeat is in flight at a time and each has a deadline shorter than DOWN_AFTER, so a
leader that is gone, frozen or partitioned away costs nothing but this task's waiting: the
fence timer (membership.py) fires on its own when no heartbeat succeeds for DOWN_AFTER.
"""
from __future__ import annotations

import asyncio
import logging
import time

from .peers import PeerError

log = logging.getLogger("stackd.cluster")

HEARTBEAT_INTERVAL = 1.0            # seconds between a follower's heartbeats
CALL_TIMEOUT = 2.0                  # seconds for one heartbeat's answer (under membership.DOWN_AFTER)


class Heartbeat:
    def __init__(self, membership):     # membership.Membership, a follower's
        self.membership = membership
        self.task: asyncio.Task | None = None
        self.failures = 0

    def start(self, loop) -> None:
        self.task = loop.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
            self.task = None

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            await self.beat()
            await asyncio.sleep(max(0.0, HEARTBEAT_INTERVAL - (time.monotonic() - started)))

    async def beat(self) -> bool:
        membership = self.membership
        leader = membership.follower.leader_address
        sent = time.monotonic()
        try:
            answer = await membership.client.call(leader, "POST", "/internal/v1/heartbeat",
                                                  membership.heartbeat_body(), timeout=CALL_TIMEOUT)
            membership.accept_answer(answer, sent_at=sent)
        except PeerError as exc:
            self._failed(exc)
            return False
        except Exception:                 # a bug here must not end the heartbeats
            log.exception("cluster: heartbeat failed")
            return False
        if self.failures:
            log.info("cluster: heartbeats reach the leader again after %d failures", self.failures)
        self.failures = 0
        return True

    def _failed(self, exc: PeerError) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 60 == 0:   # said once, then once a minute
            log.warning("cluster: heartbeat to the leader failed (%d in a row): %s", self.failures, exc)
