"""A model's replicas on the leader's side: one full copy of the model per node, each in that
node's own engine worker; the leader's own copy is a ModelRunner, a follower's a RemoteReplica
(remote_replica.py). `ReplicaSet` stands where a model's runner stands (`LoadedModel.runner`), with
the runner's surface (generate, cancel, lease, engine, end_all, close), so the inference handlers
read the same events whichever replica answers.

Routing (`ReplicaSet.pick`), for each API request:
- prefix affinity first: a prompt that shares its first AFFINITY_BLOCK-token blocks with earlier
  traffic (a conversation, a shared system prompt) goes to the replica that served them, whose
  KV cache holds that prefix, unless that replica carries AFFINITY_SLACK more requests per slot
  than the least busy one (then the prefix is recomputed elsewhere: cheaper than waiting);
- else the replica with the most free capacity: free slots, then the shortest queue (what the
  leader has in flight there, against its slots).
A key's fair share holds over the whole set: a key may hold at most key_share of the set's
slots and queues together (inference.limits.key_share), wherever its requests run; a replica
whose own engine refuses (its queue or the key's share there) passes the request to the next.

Retry before the first token: when a replica is lost (its node went down, its worker died, its
stream broke) every request it holds that has not sent an event yet is submitted again on
another replica; the client sees nothing. A request that has streamed already ends with the
replica's 503 error event, as a local engine's loss ends it.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib

from ..engine.core import STATUS_ERROR, STATUS_RUNNING, SamplingParams
from ..engine.errors import EndedEvent, EngineError, ErrorCode
from ..engine.submission import TextJobs
from .runner import LOST, Generation, ModelRunner, Resubmitted, token_jobs

AFFINITY_BLOCK = 64            # tokens a prefix block holds (hashed for affinity)
AFFINITY_BLOCKS = 16           # blocks of a prompt considered (a prefix of up to 1,024 tokens)
AFFINITY_MEMORY = 4096         # prefix blocks remembered per model (least recently used go)
AFFINITY_SLACK = 0.25          # requests per slot beyond the least busy replica that void affinity
# Errors of a replica that is gone (runner.LOST) are retried on another replica before the first
# token. The refusals of one replica's engine (queue, share) pass to the next one at submit.
REFUSED = frozenset({ErrorCode.QUEUE_FULL, ErrorCode.OVER_SHARE})


class LocalReplica:
    """The leader's own copy: its runner."""

    remote = False

    def __init__(self, node_id: str, runner: ModelRunner):
        self.node_id = node_id
        self.runner = runner
        self.in_flight = 0
        self.alive = True

    @property
    def pid(self):
        return self.runner.engine.pid

    @property
    def n_slots(self) -> int:
        return self.runner.engine.n_slots

    async def generate(self, jobs, stop, owner) -> Generation:
        return await self.runner.generate(jobs, stop, owner)

    def cancel(self, stream: Generation) -> None:
        self.runner.cancel(stream)

    def describe(self) -> dict:
        return {"node": self.node_id, "state": "loaded" if self.alive else "lost", "pid": self.pid,
                "in_flight": self.in_flight}


class Routed(Resubmitted):
    """One API request's events over the replica set: the events of the replica it runs on,
    submitted again on another replica if the first is lost before any event came."""

    __slots__ = ("replicas", "replica", "tried")

    def __init__(self, replicas: "ReplicaSet", jobs, stop, owner):
        super().__init__(replicas.loop, jobs, stop, owner)
        self.replicas = replicas
        self.replica = None
        self.tried: set = set()

    async def resubmit(self, error: EngineError) -> bool:
        if self.replica is None:
            return False
        return await self.replicas.retry(self, error)

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.replicas.finished(self)


class ReplicaSet:
    """The replicas of one model and the routing over them (see the module's docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, local: LocalReplica, key_share: float, max_queue: int):
        self.loop = loop
        self.local = local
        self.replicas: list = [local]
        self.key_share = key_share
        self.max_queue = max_queue
        self.owners: collections.Counter = collections.Counter()   # owner -> requests open over the set
        self.affinity: collections.OrderedDict = collections.OrderedDict()   # prefix hash -> replica
        self.open: set[Routed] = set()
        self.closing = False
        self.lost_nodes: dict[str, str] = {}   # node -> why its replica went (degraded until back)
        self.routed = collections.Counter()    # node id -> requests routed there (observability)
        self.restarted = None                  # waits out a restart of the model (registry.py)
        self._idle_callbacks: list = []

    # ---- the runner's surface ------------------------------------------------------------------

    @property
    def engine(self):
        """The model's facts (vocabulary, slots) from the leader's copy."""
        return self.local.runner.engine

    def lease(self):
        return self.local.runner.lease()

    async def tokenize(self, texts: list[str], add_special: bool, parse_special: bool) -> list[list[int]]:
        return await self.local.runner.tokenize(texts, add_special, parse_special)

    async def detokenize(self, tokens: list[int], special: bool = False) -> bytes:
        return await self.local.runner.detokenize(tokens, special)

    def check_open(self) -> None:
        if self.closing:
            raise EngineError(ErrorCode.UNLOADED, "the model was unloaded")

    async def embed(self, inputs, owner: int = 0) -> Generation:
        return await self.local.runner.embed(inputs, owner)

    async def generate(self, jobs: list[tuple[list[int], int, SamplingParams]], stop: list[str],
                       owner: int = 0) -> Generation:
        self.check_open()
        capacity = sum(r.n_slots + self.max_queue for r in self.live())
        if self.owners[owner] + 1 > max(1, int(self.key_share * capacity)):
            raise EngineError(ErrorCode.OVER_SHARE, "this API key already holds its share of the "
                              "model's queue over its replicas (inference.limits.key_share); retry "
                              "when some of its requests finish")
        if isinstance(jobs, TextJobs):        # a follower's engine takes token ids: tokenized here
            jobs = await token_jobs(self.local.runner, jobs)
        routed = Routed(self, jobs, stop, owner)
        await self._submit(routed, self.pick(jobs[0][0] if jobs else []))
        self.owners[owner] += 1
        self.open.add(routed)
        return routed

    def cancel(self, stream) -> None:
        if isinstance(stream, Routed):
            if stream.inner is not None and stream.replica is not None:
                stream.replica.cancel(stream.inner)
            stream._end()
        else:
            self.local.runner.cancel(stream)

    def end_all(self, error: EngineError) -> None:
        """Unloading or shutting down: every request ends with `error`, no retry."""
        self.closing = True
        for routed in list(self.open):
            routed.settle()
        self.local.runner.end_all(error)
        for replica in self.replicas:
            if replica.remote:
                replica.end_all(error)

    async def close(self, grace: float = 10.0) -> None:
        await asyncio.gather(self.local.runner.close(grace),
                             *(r.stop() for r in self.replicas if r.remote), return_exceptions=True)

    # ---- routing ---------------------------------------------------------------------------------

    def live(self) -> list:
        return [r for r in self.replicas if r.alive]

    @staticmethod
    def load_of(replica) -> float:
        """Requests in flight per slot: below 1 it has free slots, above 1 a queue."""
        return replica.in_flight / max(1, replica.n_slots)

    def pick(self, prompt: list[int], exclude: set = frozenset()):
        candidates = [r for r in self.live() if r not in exclude]
        if not candidates:
            raise EngineError(ErrorCode.WORKER_LOST, "no replica of the model is running; it is being "
                              "placed again, retry shortly")
        least = min(candidates, key=lambda r: (self.load_of(r), r.in_flight, r.remote))
        held = self._affine(prompt)
        if held is not None and held in candidates and \
                self.load_of(held) - self.load_of(least) <= AFFINITY_SLACK:
            return held
        return least

    def _prefix_keys(self, prompt: list[int]) -> list[int]:
        keys, n = [], min(len(prompt) // AFFINITY_BLOCK, AFFINITY_BLOCKS)
        for i in range(1, n + 1):
            keys.append(hash(tuple(prompt[:i * AFFINITY_BLOCK])))
        return keys

    def _affine(self, prompt: list[int]):
        for key in reversed(self._prefix_keys(prompt)):    # the longest prefix held first
            replica = self.affinity.get(key)
            if replica is not None:
                return replica
        return None

    def _remember(self, prompt: list[int], replica) -> None:
        for key in self._prefix_keys(prompt):
            self.affinity[key] = replica
            self.affinity.move_to_end(key)
        while len(self.affinity) > AFFINITY_MEMORY:
            self.affinity.popitem(last=False)

    async def _submit(self, routed: Routed, first) -> None:
        """Submit on `first`, else on the next replicas by capacity, until one takes it."""
        replica, last_error = first, None
        while replica is not None:
            routed.tried.add(replica)
            replica.in_flight += 1
            try:
                inner = await replica.generate(routed.jobs, routed.stop, routed.owner)
            except EngineError as exc:
                replica.in_flight -= 1
                if exc.code not in REFUSED and exc.code not in LOST:
                    raise
                if exc.code in LOST:
                    self.replica_lost(replica, str(exc))
                last_error = exc
                try:
                    replica = self.pick(routed.jobs[0][0], exclude=routed.tried)
                except EngineError:
                    raise last_error from None
                continue
            routed.replica, routed.inner = replica, inner
            routed.choice = inner.choice
            self.routed[replica.node_id] += 1
            if routed.jobs:
                self._remember(routed.jobs[0][0], replica)
            return
        raise last_error

    async def retry(self, routed: Routed, error: EngineError) -> bool:
        """`routed`'s replica failed it before its first event: submit it on another."""
        old, inner = routed.replica, routed.inner
        old.in_flight -= 1
        old.cancel(inner)
        routed.replica = None
        try:
            await self._submit(routed, await self._next_replica(routed))
        except EngineError:                # no replica left: the error it had stands
            routed.replica = None
            routed.inner = _ended(self.loop, inner, error)
        return True

    async def _next_replica(self, routed: Routed):
        """Another live replica; with none left, the leader's own once its worker has restarted
        (held for engine.restart_hold, restart_hold.py)."""
        try:
            return self.pick(routed.jobs[0][0], exclude=routed.tried)
        except EngineError:
            if self.restarted is None:
                raise
        await self.restarted()
        return self.pick(routed.jobs[0][0], exclude=routed.tried)

    def finished(self, routed: Routed) -> None:
        if routed in self.open:
            self.open.discard(routed)
            self.owners[routed.owner] -= 1
            if self.owners[routed.owner] <= 0:
                del self.owners[routed.owner]
            if routed.replica is not None:
                routed.replica.in_flight -= 1
            if not self.open and self._idle_callbacks:
                callbacks, self._idle_callbacks = self._idle_callbacks, []
                for callback in callbacks:
                    self.loop.call_soon(callback)

    def when_idle(self, callback) -> None:
        """callback() on the loop once no request is open (at once when none is)."""
        if not self.open:
            self.loop.call_soon(callback)
        elif callback not in self._idle_callbacks:
            self._idle_callbacks.append(callback)

    # ---- replicas come and go ------------------------------------------------------------------

    def replace_local(self, local: LocalReplica) -> None:
        """The leader's own replica, restarted."""
        self.replicas = [local if r is self.local else r for r in self.replicas]
        self.local = local

    def add(self, replica) -> None:
        self.replicas.append(replica)

    def replica_on(self, node_id: str):
        return next((r for r in self.replicas if r.node_id == node_id and r.alive), None)

    def replica_lost(self, replica, why: str) -> None:
        """A remote replica is gone: its requests end (those without an event yet are retried
        by their Routed), and it leaves the set."""
        if not replica.remote or not replica.alive:
            return
        replica.alive = False
        self.replicas = [r for r in self.replicas if r is not replica]
        self.affinity = collections.OrderedDict((k, r) for k, r in self.affinity.items() if r is not replica)
        self.lost_nodes.setdefault(replica.node_id, why)
        replica.end_all(EngineError(ErrorCode.WORKER_LOST, f"the model's replica on node {replica.node_id} "
                                    f"was lost ({why})"))
        self.loop.create_task(_quietly(replica.stop()))

    def node_down(self, node_id: str) -> bool:
        replica = self.replica_on(node_id)
        if replica is None or not replica.remote:
            return False
        self.replica_lost(replica, f"node {node_id} went down")
        return True

    def describe(self) -> list[dict]:
        return [{**r.describe(), "requests": self.routed[r.node_id]} for r in self.replicas]

    @property
    def idle(self) -> bool:
        return not self.open


def _ended(loop, inner: Generation, error: EngineError) -> Generation:
    """A generation whose every choice ends with `error` (no replica left to retry on)."""
    stream = Generation(loop)
    stream.choice = dict(inner.choice)
    stream.n_open = len(stream.choice)
    for rid in stream.choice:
        stream.push(EndedEvent(rid, STATUS_ERROR, error))
    return stream


async def _quietly(awaitable) -> None:
    with contextlib.suppress(Exception):
        await awaitable
