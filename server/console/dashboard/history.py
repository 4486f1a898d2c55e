"""Each device's samples: the last `samples` of them in memory at full resolution, and a row a
minute in the database for `days` (so a chart has data the moment it opens, also after the
console restarts). Bounded both ways: a deque per device, rows older than `days` deleted."""
from __future__ import annotations

import time
from collections import deque

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from ..db.schema import device_minutes
from .samples import GAP, NAMES, combine

MINUTE = 60


class History:
    def __init__(self, engine: AsyncEngine, samples: int, days: int):
        self.engine = engine
        self.samples = samples
        self.days = days
        self.recent: dict[str, deque] = {}              # device id -> deque of (t, values)
        self.minute: dict[str, tuple[int, list]] = {}   # device id -> (minute, its samples so far)

    def add(self, device_id: str, t: float, values: tuple) -> tuple[int, tuple] | None:
        """Keep a sample. Returns (minute, its combined values) when it closed a minute, for
        `write`; a minute of gaps alone is written too, so the gap shows after a restart."""
        kept = self.recent.get(device_id)
        if kept is None:
            kept = self.recent[device_id] = deque(maxlen=self.samples)
        kept.append((t, values))
        minute = int(t // MINUTE) * MINUTE
        current = self.minute.get(device_id)
        if current is None or current[0] == minute:
            if current is None:
                self.minute[device_id] = current = (minute, [])
            current[1].append(values)
            return None
        self.minute[device_id] = (minute, [values])
        return current[0], combine(current[1])

    def pending(self) -> list[tuple[str, int, tuple]]:
        """The minutes not closed yet, combined: what `close` writes so a restart keeps them."""
        return [(device_id, minute, combine(rows)) for device_id, (minute, rows) in self.minute.items()]

    def forget(self, keep: set[str]) -> None:
        for device_id in [d for d in self.recent if d not in keep]:
            self.recent.pop(device_id, None)
            self.minute.pop(device_id, None)

    async def write(self, rows: list[tuple[str, int, tuple]]) -> None:
        """Store minutes; one already there (a restart within the same minute) is replaced."""
        if not rows:
            return
        async with self.engine.begin() as conn:
            for device_id, minute, values in rows:
                fields = dict(zip(NAMES, values))
                done = await conn.execute(update(device_minutes).where(and_(
                    device_minutes.c.device_id == device_id, device_minutes.c.minute == minute))
                    .values(**fields))
                if done.rowcount == 0:
                    await conn.execute(insert(device_minutes).values(
                        device_id=device_id, minute=minute, **fields))

    async def prune(self, now: float | None = None) -> int:
        oldest = int((now or time.time()) - self.days * 86400)
        async with self.engine.begin() as conn:
            done = await conn.execute(delete(device_minutes).where(device_minutes.c.minute < oldest))
        return done.rowcount

    async def since(self, device_id: str, since: float) -> tuple[list[tuple], str]:
        """Samples after `since`, oldest first: the database's minutes up to where memory
        starts, then memory's. -> (samples, the resolution of the first one)."""
        kept = list(self.recent.get(device_id, ()))
        start = kept[0][0] if kept else time.time() + 1
        out: list[tuple] = []
        resolution = "full"
        if since < start:
            columns = [device_minutes.c[name] for name in NAMES]
            async with self.engine.connect() as conn:
                rows = await conn.execute(select(device_minutes.c.minute, *columns).where(and_(
                    device_minutes.c.device_id == device_id, device_minutes.c.minute > since,
                    device_minutes.c.minute < start)).order_by(device_minutes.c.minute))
                out = [(float(row[0]), tuple(row[1:])) for row in rows]
            if out:
                resolution = "minute"
        out += [(t, values) for t, values in kept if t > since]
        return out, resolution


__all__ = ["History", "GAP"]
