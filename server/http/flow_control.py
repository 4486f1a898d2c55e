"""Write-side back-pressure for one connection.

The transport calls pause_writing when its buffer passes the high-water mark and
resume_writing when it drains below the low-water mark. A producer awaits
`drain()` between chunks, so a client that reads slowly slows the producer
instead of growing the buffer.
"""
from __future__ import annotations

import asyncio


class FlowControl:
    __slots__ = ("loop", "paused", "paused_at", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.paused = False
        self.paused_at = 0.0
        self._waiter: asyncio.Future | None = None

    def pause_writing(self) -> None:
        if not self.paused:
            self.paused = True
            self.paused_at = self.loop.time()

    def resume_writing(self) -> None:
        self.paused = False
        self._wake()

    def connection_lost(self) -> None:
        """A closed connection never drains: release whoever waits."""
        self.paused = False
        self._wake()

    async def drain(self) -> None:
        if not self.paused:
            return
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = self.loop.create_future()
        await waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
