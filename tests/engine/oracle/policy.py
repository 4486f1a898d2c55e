"""The scheduling policy's Python twin (native/engine/scheduler.cpp is the one that runs).

Same interface as stackd._engine.Scheduler, same decisions: tests/engine/test_scheduler.py
runs against both, so a change to the policy has to agree in both languages. Handy, too,
for trying a policy change before writing it in C++.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from stackd.engine.core import STATUS_ABORTED, STATUS_ERROR, STATUS_LENGTH, STATUS_RUNNING
from .time_share import Candidate, TimeShare

STATUS_WAITING = 0


@dataclass
class _Request:
    id: int
    prompt: list[int]
    max_tokens: int
    owner: int = 0
    status: int = STATUS_WAITING
    slot: int = -1
    n_cached: int = 0
    n_prompt_done: int = 0
    n_generated: int = 0
    last_token: int = -1
    cancel_requested: bool = False
    step_last: int = 0          # the last step it took part in
    cost_us: int = 0            # what one of its decode steps cost lately
    preempted: bool = False     # gave its slot back once: a re-admission resumes it


@dataclass
class _Slot:
    request: int = -1
    cache: list[int] = field(default_factory=list)
    last_used: int = 0


def _finished(status: int) -> bool:
    return status > STATUS_RUNNING


class Scheduler:
    def __init__(self, n_slots: int, n_batch: int, n_ctx_seq: int, n_max_waiting: int = 256,
                 n_max_slots_per_owner: int = 0, share_time: bool = False):
        self.n_batch, self.n_ctx_seq, self.n_max_waiting = n_batch, n_ctx_seq, n_max_waiting
        self.n_max_slots_per_owner = n_max_slots_per_owner
        self._share = TimeShare() if share_time else None
        self._held: dict[int, int] = {}                    # owner -> slots held
        self._active_slots = 0                             # power budget: 0 = all slots
        self._slots = [_Slot() for _ in range(n_slots)]
        self._waiting: deque[int] = deque()
        self._running: list[int] = []
        self._requests: dict[int, _Request] = {}
        self._steps = 0
        self._last: dict | None = None

    # ---- the interface of stackd._engine.Scheduler -------------------------------------------

    def enqueue(self, id_request: int, prompt: list[int], max_tokens: int, owner: int = 0) -> bool:
        if len(self._waiting) >= self.n_max_waiting or not prompt:
            return False
        self._requests[id_request] = _Request(id_request, list(prompt), max_tokens, owner)
        self._waiting.append(id_request)
        return True

    def cancel(self, id_request: int) -> bool:
        req = self._requests.get(id_request)
        if req is None or _finished(req.status):
            return False
        req.cancel_requested = True
        return True

    def schedule(self) -> dict:
        plan = {"admissions": [], "items": [], "released": [], "released_waiting": [], "preempted": [],
                "n_tokens": 0}
        self._steps += 1
        self._release_cancelled(plan)
        self._preempt(plan)
        self._admit(plan, respect_share=True)
        self._admit(plan, respect_share=False)
        steps = self._stepping()
        budget = self.n_batch
        for rid, step in zip(self._running, steps):      # running streams first, one token each
            req = self._requests[rid]
            if step and req.n_prompt_done == len(req.prompt) and budget > 0:
                plan["items"].append((rid, req.slot, len(self._slots[req.slot].cache), 1, False, True))
                req.step_last = self._steps
                budget -= 1
        for rid, step in zip(self._running, steps):      # then prompt chunks, first come first served
            req = self._requests[rid]
            left = len(req.prompt) - req.n_prompt_done
            if step and left > 0 and budget > 0:
                n = min(left, budget)
                plan["items"].append((rid, req.slot, req.n_prompt_done, n, True, n == left))
                req.step_last = self._steps
                budget -= n
        plan["n_tokens"] = self.n_batch - budget
        plan["items"].sort(key=lambda item: item[1])     # by slot: one ubatch for neighbouring slots
        self._last = plan
        return plan

    def apply(self, outcomes: list[tuple[int, int, int]]) -> list[int]:
        for rid, slot, pos0, n, is_prompt, _ in self._last["items"]:
            req = self._requests.get(rid)
            if req is None or req.slot != slot:
                continue
            cache = self._slots[slot].cache
            if is_prompt:
                cache.extend(req.prompt[pos0:pos0 + n])
                req.n_prompt_done += n
            else:
                cache.append(req.last_token)
            self._slots[slot].last_used = self._steps
        finished = []
        for rid, token, status in outcomes:
            req = self._requests.get(rid)
            if req is None or _finished(req.status):
                continue
            req.last_token = token
            req.n_generated += 1
            if not _finished(status):
                n_cached = len(self._slots[req.slot].cache)
                if req.n_generated >= req.max_tokens or n_cached + 1 >= self.n_ctx_seq:
                    status = STATUS_LENGTH
            if _finished(status):
                self._finish(req, status)
                finished.append(rid)
        return finished

    def charge(self, decode_us: int, sample_us: list[int]) -> None:
        plan = self._last
        if self._share is None or plan is None or plan["n_tokens"] <= 0:
            return
        for i, (rid, _, _, n, is_prompt, _) in enumerate(plan["items"]):
            req = self._requests.get(rid)
            if req is None:
                continue
            us = decode_us * n // plan["n_tokens"] + (sample_us[i] if i < len(sample_us) else 0)
            req.cost_us = self._share.charge(req.owner, us, not is_prompt, req.cost_us)

    def slot_cache(self, id_slot: int) -> list[int]:
        return list(self._slots[id_slot].cache)

    def request(self, id_request: int) -> dict | None:
        req = self._requests.get(id_request)
        if req is None:
            return None
        return {"status": req.status, "slot": req.slot, "n_cached": req.n_cached,
                "n_prompt_done": req.n_prompt_done, "n_generated": req.n_generated}

    def release(self, id_request: int) -> None:
        self._requests.pop(id_request, None)

    def set_active_slots(self, n: int) -> None:
        self._active_slots = n

    def fail(self, id_request: int) -> None:
        req = self._requests.get(id_request)
        if req is None or req.slot < 0:
            return
        self._slots[req.slot].cache.clear()
        self._finish(req, STATUS_ERROR)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting)

    @property
    def n_running(self) -> int:
        return len(self._running)

    # ---- the phases ------------------------------------------------------------------------------

    def _finish(self, req: _Request, status: int) -> None:
        req.status = status
        if req.slot >= 0:
            self._slots[req.slot].request = -1            # the cache stays for later prefix reuse
            req.slot = -1
            self._held[req.owner] -= 1
            if not self._held[req.owner]:
                del self._held[req.owner]
        self._running = [r for r in self._running if r != req.id]

    def _release_cancelled(self, plan: dict) -> None:
        for rid in [r for r in self._waiting if self._requests[r].cancel_requested]:
            self._requests[rid].status = STATUS_ABORTED
            self._waiting.remove(rid)
            plan["released"].append(rid)
            plan["released_waiting"].append(rid)
        for rid in list(self._running):
            req = self._requests[rid]
            if req.cancel_requested:
                self._finish(req, STATUS_ABORTED)
                plan["released"].append(rid)

    def _stepping(self) -> list[bool]:
        if self._share is None:
            return [True] * len(self._running)
        return self._share.select([Candidate(r.owner, r.step_last, r.cost_us)
                                   for r in map(self._requests.__getitem__, self._running)])

    def _pick_slot(self, prompt: list[int]) -> tuple[int, int]:
        """The longest shared prefix among the free slots the prompt keeps at least half of, the
        least recently used on a tie; when none is, the least recently used free slot."""
        best, best_common = -1, 0
        lru, lru_common = -1, 0
        for i, slot in enumerate(self._slots):
            if slot.request >= 0:
                continue
            common = 0
            for a, b in zip(slot.cache, prompt):
                if a != b:
                    break
                common += 1
            if lru < 0 or slot.last_used < self._slots[lru].last_used:
                lru, lru_common = i, common
            if 2 * common < len(slot.cache):
                continue
            if best < 0 or common > best_common or (
                    common == best_common and slot.last_used < self._slots[best].last_used):
                best, best_common = i, common
        return (best, best_common) if best >= 0 else (lru, lru_common)

    def _may_admit(self, req: _Request, respect_share: bool) -> bool:
        cap = self.n_max_slots_per_owner
        return not respect_share or cap <= 0 or self._held.get(req.owner, 0) < cap

    def _preempt(self, plan: dict) -> None:
        cap = self.n_max_slots_per_owner
        if cap <= 0 or not self._waiting:
            return
        n_free = sum(1 for s in self._slots if s.request < 0)
        if self._active_slots > 0:
            n_free = min(n_free, self._active_slots - len(self._running))
        held = dict(self._held)
        for rid in list(self._waiting):
            owner = self._requests[rid].owner
            if held.get(owner, 0) >= cap:
                continue
            held[owner] = held.get(owner, 0) + 1
            if n_free > 0:
                n_free -= 1
                continue
            over = [o for o, n in held.items() if n > cap]
            if not over:
                return
            victim_owner = min(over, key=lambda o: (-held[o], o))
            held[victim_owner] -= 1
            self._suspend(self._requests[self._victim_of(victim_owner)], plan)

    def _victim_of(self, owner: int) -> int:
        victim, fewest = -1, None
        for rid in self._running:
            req = self._requests[rid]
            n = len(self._slots[req.slot].cache)
            if req.owner == owner and (fewest is None or n <= fewest):
                victim, fewest = rid, n
        return victim

    def _suspend(self, req: _Request, plan: dict) -> None:
        if req.n_prompt_done == len(req.prompt) and req.n_generated > 0:
            req.prompt = self._slots[req.slot].cache + [req.last_token]
        self._finish(req, STATUS_WAITING)
        req.n_prompt_done = 0
        req.preempted = True
        self._waiting.appendleft(req.id)
        plan["preempted"].append(req.id)

    def _admit(self, plan: dict, respect_share: bool) -> None:
        for rid in list(self._waiting):
            req = self._requests[rid]
            if not self._may_admit(req, respect_share):
                continue                                  # keeps its place in the queue
            if self._active_slots > 0 and len(self._running) >= self._active_slots:
                return
            slot, common = self._pick_slot(req.prompt)
            if slot < 0:
                return
            self._waiting.remove(rid)
            self._held[req.owner] = self._held.get(req.owner, 0) + 1
            n_keep = min(common, len(req.prompt) - 1)     # the last prompt token is decoded again
            s = self._slots[slot]
            del s.cache[n_keep:]
            s.request, s.last_used = req.id, self._steps
            req.status, req.slot, req.n_prompt_done = STATUS_RUNNING, slot, n_keep
            if not req.preempted:                         # a resumed one keeps its first admission's reuse
                req.n_cached = n_keep
            self._running.append(req.id)
            plan["admissions"].append((req.id, slot, n_keep))
