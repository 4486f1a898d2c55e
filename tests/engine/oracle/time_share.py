"""The Python twin of native/engine/time_share.cpp: the engine's time shared equally between
the owners (API keys) whose requests are running. The header there says why and how; this copy
makes the same decisions in the same integer microseconds (tests/engine/test_scheduler.py runs
both)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_LEAD_US = 1_000_000     # the most debt an owner back from a pause keeps
SLACK_DIVISOR = 8           # an owner ahead may spend an eighth of the step more than the one behind


def _blend(average: int, us: int) -> int:
    return us if average == 0 else (3 * average + us) // 4


@dataclass
class Candidate:
    owner: int
    step_last: int          # the step it last took part in
    cost_us: int            # what one step of it cost lately; 0 when not known yet


@dataclass
class _Usage:
    used_us: int = 0
    cost_us: int = 0


class TimeShare:
    def __init__(self) -> None:
        self._owners: dict[int, _Usage] = {}
        self._min_used_us = 0
        self._cost_us = 0

    def select(self, candidates: list[Candidate]) -> list[bool]:
        active = list(dict.fromkeys(c.owner for c in candidates))
        self._enter(active)
        take = [True] * len(candidates)
        if len(active) < 2:
            return take
        spend = dict.fromkeys(active, 0)                   # what each owner would spend in this step
        for c in candidates:
            spend[c.owner] += self._estimate(c)
        # the owner furthest behind; among equals the one that spends least (a tie must not let
        # the heavier owner run everything beside the light one); then the earliest admitted
        behind = active[0]
        for owner in active:
            used, used_behind = self._owners[owner].used_us, self._owners[behind].used_us
            if used < used_behind or (used == used_behind and spend[owner] < spend[behind]):
                behind = owner
        floor = self._owners[behind].used_us
        step = spend[behind]
        for owner in active:
            if owner == behind:
                continue
            mine = sorted((i for i, c in enumerate(candidates) if c.owner == owner),
                          key=lambda i: candidates[i].step_last)
            # an eighth of the step in hand: equal loads a few microseconds apart all run
            allowance = floor + step + step // SLACK_DIVISOR - self._owners[owner].used_us
            spent = 0
            for i in mine:
                cost = self._estimate(candidates[i])
                if spent + cost > allowance:
                    take[i] = False
                else:
                    spent += cost
        return take

    def charge(self, owner: int, us: int, decode_item: bool, cost_us: int) -> int:
        usage = self._owners.setdefault(owner, _Usage())
        usage.used_us += us
        if not decode_item:
            return cost_us
        usage.cost_us = _blend(usage.cost_us, us)
        self._cost_us = _blend(self._cost_us, us)
        return _blend(cost_us, us)

    def _estimate(self, c: Candidate) -> int:
        if c.cost_us > 0:
            return c.cost_us
        usage = self._owners.get(c.owner)
        return usage.cost_us if usage is not None and usage.cost_us > 0 else self._cost_us

    def _enter(self, active: list[int]) -> None:
        floor = None
        for owner in active:
            usage = self._owners.get(owner)
            if usage is None:
                usage = self._owners[owner] = _Usage(used_us=self._min_used_us)
            usage.used_us = min(max(usage.used_us, self._min_used_us), self._min_used_us + MAX_LEAD_US)
            floor = usage.used_us if floor is None else min(floor, usage.used_us)
        if floor is not None:
            self._min_used_us = max(self._min_used_us, floor)
        for owner in [o for o, u in self._owners.items() if u.used_us <= self._min_used_us and o not in active]:
            del self._owners[owner]
