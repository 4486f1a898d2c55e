"""Who is in the cluster, and who is up.

One leader (the node configured as leader), any number of followers. A follower heartbeats to
the leader every HEARTBEAT_INTERVAL (server/cluster/heartbeat.py); its first heartbeat
registers it, so a leader that restarts learns its followers again within a second.

* The leader judges liveness by its own monotonic clock, when a heartbeat arrives, never by the
  sender's: a follower silent for DOWN_AFTER seconds is `down` (the `on_node_down` callbacks
  run), and `up` again with its next heartbeat. A follower that shuts down says `leave` and is
  forgotten.
* A follower keeps the leader's view from the last heartbeat answer, and answers the cluster
  read routes with it. Without a successful heartbeat for DOWN_AFTER seconds it fences itself
  (the `on_fenced` callbacks run: stop serving the leader's RPC) and reports `unavailable`;
  the next successful heartbeat unfences it.
* A node without a cluster secret is a one-node cluster: a leader with no followers and no
  internal routes.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..errors import Code, DomainError, invalid
from . import views
from .heartbeat import Heartbeat
from .links import LinkProbe, checked_links
from .node_facts import LocalState, NodeFacts, NothingYet
from .peers import PeerClient, PeerError

log = logging.getLogger("stackd.cluster")

DOWN_AFTER = 3.0                    # seconds of silence: the leader marks a follower down,
                                    # a follower without its leader fences itself
MAX_ADDRESS = 256
OFFER_GROWTH = 64 << 20             # bytes: a follower's offer to models grown this much is news


@dataclass(frozen=True)
class PeerNode:
    id: str
    role: str                       # leader | follower
    status: str                     # up | down
    address: str                    # its cluster URL, e.g. http://10.0.0.2:5381
    host: str                       # the host part of address (for the RPC relay)
    memory_total_bytes: int
    memory_available_bytes: int
    model_memory_bytes: int         # what it offers to models: min(memory_limit_mb, available - reserve)
    cpu_cores: int | None
    threads: int                    # engine.threads it runs with
    last_seen_ago_ms: int
    detail: dict                    # its /v1/nodes entry as last received
    compute: float = 0.0            # its measured compute (compute_speed.py), 0: not measured


def peer_node(entry: dict) -> PeerNode:
    address = entry.get("address") or ""
    return PeerNode(
        id=entry["id"], role=entry["role"], status=entry["status"], address=address,
        host=urlsplit(address).hostname or "" if address else "",
        memory_total_bytes=entry.get("memory_total_bytes", 0),
        memory_available_bytes=entry.get("memory_available_bytes", 0),
        model_memory_bytes=entry.get("model_memory_bytes", 0), cpu_cores=entry.get("cpu_cores"),
        threads=entry.get("threads", 1), last_seen_ago_ms=entry.get("last_seen_ago_ms", 0),
        detail=entry, compute=float(entry.get("compute") or 0.0))


@dataclass
class Member:
    """The leader's record of one follower."""
    id: str
    address: str
    entry: dict                     # its own /v1/nodes entry, as last received
    last_seen: float                # the leader's monotonic clock at its last heartbeat
    status: str = "up"
    timer: object = None            # loop.call_later handle: marks it down
    memory_mark: int = 0            # its lowest offer to models since it joined or its offer grew


@dataclass
class FollowerState:
    """A follower's knowledge of its leader."""
    leader_address: str
    leader_id: str | None = None
    inference_url: str | None = None
    view: dict | None = None        # the leader's view, as last received
    view_received: float = 0.0      # this node's monotonic clock when it arrived
    fenced: bool = True             # until the first successful heartbeat
    fence_timer: object = None
    compute_scale: float = 1.0
    power: dict | None = None       # this node's allocation, from the leader


class NodeEvents:
    """The contract placement and supervision use (the real membership, or the simulated one
    of testing/loopback_peers.py, outside the package): the nodes, and callbacks when one goes
    down or this follower loses its leader."""

    def __init__(self):
        self._down_callbacks: list = []
        self._fenced_callbacks: list = []

    def nodes(self) -> list[PeerNode]:
        raise NotImplementedError

    def nodes_up(self) -> list[PeerNode]:
        return [n for n in self.nodes() if n.status == "up"]

    def on_node_down(self, callback) -> None:
        """callback(node_id), on the loop, when a follower goes silent or leaves."""
        self._down_callbacks.append(callback)

    def on_fenced(self, callback) -> None:
        """callback(), on the loop, when this follower loses its leader."""
        self._fenced_callbacks.append(callback)


class Membership(NodeEvents):
    def __init__(self, facts: NodeFacts, role: str, secret: bytes | None, leader: str = "",
                 advertise: str = ""):
        super().__init__()
        self.facts = facts
        self.local: LocalState = NothingYet()   # what this node runs: report_local() sets it
        self.role = role
        self.self_id = facts.node_id
        self.secret = secret
        self.address = advertise    # completed by start() when it depends on the bound port
        self.inference_url: str | None = None
        self.members: dict[str, Member] = {}
        self.follower = FollowerState(leader) if role == "follower" else None
        self.client = PeerClient(secret, self.self_id) if secret else None
        self.loop = None
        self.heartbeat: Heartbeat | None = None
        self.links = LinkProbe(self)  # this node's round trip to each peer (links.py)
        self.rpc_state = None       # () -> JSON-able: the RPC children, carried by heartbeats
        self.placements_on = None   # (node_id) -> placement ids a leader holds RPC servers for there
        self._listed_callbacks: list = []
        self._grown_callbacks: list = []
        self._change_callbacks: list = []

    @classmethod
    def from_settings(cls, facts: NodeFacts, settings) -> "Membership":
        cluster = settings["cluster"]
        return cls(facts, cluster["role"], settings.cluster_secret, leader=cluster["leader"],
                   advertise=cluster["advertise"])

    @property
    def is_leader(self) -> bool:
        return self.role == "leader"

    def start(self, loop, host: str, cluster_port: int, inference_port: int, heartbeat: bool = True) -> None:
        """Called once both ports listen: the advertised URLs can be completed now, and a
        follower starts heartbeating."""
        self.loop = loop
        host = _url_host(urlsplit(self.address).hostname if self.address else host)
        if not self.address:
            self.address = f"http://{host}:{cluster_port}"
        self.inference_url = f"http://{host}:{inference_port}"
        if self.client is not None:
            self.links.start(loop)
        if self.follower is not None:
            self._arm_fence()
            if heartbeat:
                self.heartbeat = Heartbeat(self)
                self.heartbeat.start(loop)

    async def aclose(self) -> None:
        """A follower stops heartbeating and tells its leader it leaves."""
        await self.links.stop()
        if self.heartbeat is not None:
            await self.heartbeat.stop()
            await self.leave()
        for member in self.members.values():
            if member.timer is not None:
                member.timer.cancel()
        if self.follower is not None and self.follower.fence_timer is not None:
            self.follower.fence_timer.cancel()
        if self.client is not None:
            await self.client.aclose()

    # ---- the contract other modules use ---------------------------------------------------------

    def nodes(self) -> list[PeerNode]:
        """Every known node, this one included, the leader first."""
        return [peer_node(entry) for entry in self.node_entries()]

    def on_change(self, callback) -> None:
        """callback(), on the loop, when a node joins, leaves, goes down or comes back."""
        self._change_callbacks.append(callback)

    def on_offer_grown(self, callback) -> None:
        """callback(), on the loop, when a follower that stays up can take more than before: a
        model file arrived in its store, or its offer to models rose OFFER_GROWTH (a model
        unloaded there). A leader's replica sets grow on it, as on a join."""
        self._grown_callbacks.append(callback)

    def report_local(self, local: LocalState) -> None:
        """What this node runs (its models, its power share), once the daemon has built them:
        heartbeats, views and the power contract's answers report it."""
        self.local = local

    def provide_rpc_state(self, provider) -> None:
        self.rpc_state = provider

    def provide_placements(self, provider) -> None:
        """A leader's heartbeat answers list, to each follower, the placements it still holds
        RPC servers for there: provider(node_id) -> [placement id]."""
        self.placements_on = provider

    def on_placements_listed(self, callback) -> None:
        """callback(listed: set of placement ids, asked_before: monotonic time), on the loop,
        when a follower learns which of its RPC servers the leader still holds: any child it was
        asked for before `asked_before` and not listed is an orphan (its rpc/stop never came)."""
        self._listed_callbacks.append(callback)

    async def call(self, node_id: str, method: str, path: str, body: dict | None = None,
                   timeout: float | None = None) -> dict:
        """A signed request to /internal/v1/... on that node (within `timeout` seconds, else
        the client's deadline); raises PeerError."""
        if self.client is None:
            raise PeerError("a one-node cluster has no peers to call")
        address = self.address_of(node_id)
        if address is None:
            raise PeerError(f"no such node: {node_id}", 404)
        return await self.client.call(address, method, path, body, timeout=timeout)

    def address_of(self, node_id: str) -> str | None:
        if node_id == self.self_id:
            return self.address
        if node_id in self.members:
            return self.members[node_id].address
        if self.follower is not None and node_id == self.follower.leader_id:
            return self.follower.leader_address
        return next((e.get("address") for e in self.node_entries() if e["id"] == node_id), None)

    # ---- what every node reports ------------------------------------------------------------------

    def own_entry(self) -> dict:
        return views.own_entry(self)

    def node_entries(self) -> list[dict]:
        """/v1/nodes's entries: the leader's live view, or the one a follower last received."""
        if self.follower is None:
            return [self.own_entry()] + [self._member_entry(m) for m in sorted(self.members.values(),
                                                                               key=lambda m: m.id)]
        view = self.follower.view
        if view is None:
            return [self.own_entry()]
        age = self.view_age_ms()
        return [{**entry, "last_seen_ago_ms": entry.get("last_seen_ago_ms", 0) + age}
                for entry in view["nodes"]["data"]]

    def _member_entry(self, member: Member) -> dict:
        ago = int((time.monotonic() - member.last_seen) * 1000)
        power = self.local.power_allocation(member.id)
        return {**member.entry, "id": member.id, "role": "follower", "status": member.status,
                "address": member.address, "last_seen_ago_ms": ago, "power": power}

    def power_budgets(self) -> list[tuple[str, int, int]]:
        """(node id, idle_mw, max_mw) of every node that is up: the power contract's demand and
        minimum. Read from settings and heartbeats, never through the power contract itself."""
        power = self.facts.settings["power"]
        own = (self.self_id, power["idle_mw"], power["max_mw"])
        if self.follower is None:
            return [own] + [(m.id, m.entry["power_budget"]["idle_mw"], m.entry["power_budget"]["max_mw"])
                            for m in sorted(self.members.values(), key=lambda m: m.id) if m.status == "up"]
        if self.follower.view is None:
            return [own]
        return [(e["id"], e["power_budget"]["idle_mw"], e["power_budget"]["max_mw"])
                for e in self.follower.view["nodes"]["data"] if e["status"] == "up" and e.get("power_budget")]

    def view_age_ms(self) -> int:
        if self.follower is None or self.follower.view is None:
            return 0
        return int((time.monotonic() - self.follower.view_received) * 1000)

    @property
    def compute_scale(self) -> float:
        """This node's share of full compute under the power contract (a follower's comes with
        the leader's heartbeat answers): RPC server children started now take it."""
        if self.follower is not None:
            return self.follower.compute_scale
        allocation = self.local.power_allocation(self.self_id)
        return allocation["compute_scale"] if allocation else 1.0

    @property
    def fenced(self) -> bool:
        return self.follower is not None and self.follower.fenced

    # ---- the leader's side -------------------------------------------------------------------------

    def receive_heartbeat(self, sender: str, body: dict) -> dict:
        if not self.is_leader:
            raise DomainError(Code.STATE, "this node is a follower: heartbeats go to the leader")
        entry = _checked_entry(sender, body, self.self_id)
        member = self.members.get(sender)
        if member is not None and member.status == "up" and member.address != entry["address"]:
            raise DomainError(Code.TAKEN, f"node id {sender} is in use by another node "
                           f"({member.address}): give each node its own data dir")
        joined = member is None or member.status != "up"
        if member is None:
            member = self.members[sender] = Member(sender, entry["address"], entry, time.monotonic())
            log.info("cluster: node %s joined from %s", sender, entry["address"])
        elif joined:
            log.info("cluster: node %s is up again", sender)
        grew = not joined and _offer_grew(member, entry)
        if joined:
            member.memory_mark = entry["model_memory_bytes"]
        member.address, member.entry, member.last_seen, member.status = (
            entry["address"], entry, time.monotonic(), "up")
        self._arm_down_timer(member)
        if joined:
            self._changed()
        elif grew:
            for callback in list(self._grown_callbacks):
                _run(callback)
        return {**self._answer(sender), "rejoined": joined}

    def _answer(self, sender: str) -> dict:
        power = self.local.power_allocation(sender)
        answer = {"leader_id": self.self_id, "cluster_id": self.facts.identity.cluster_id,
                  "inference_url": self.inference_url, "view": views.leader_view(self),
                  "power": power, "compute_scale": power["compute_scale"] if power else 1.0}
        if self.placements_on is not None:
            answer["placements"] = list(self.placements_on(sender))
        return answer

    def _arm_down_timer(self, member: Member) -> None:
        if member.timer is not None:
            member.timer.cancel()
        member.timer = self.loop.call_later(DOWN_AFTER, self._silent, member.id)

    def _silent(self, node_id: str) -> None:
        member = self.members.get(node_id)
        if member is None or member.status == "down":
            return
        member.status, member.timer = "down", None
        log.warning("cluster: node %s is down (no heartbeat for %g s)", node_id, DOWN_AFTER)
        self._node_down(node_id)

    def receive_leave(self, sender: str) -> dict:
        member = self.members.pop(sender, None)
        if member is not None:
            if member.timer is not None:
                member.timer.cancel()
            log.info("cluster: node %s left", sender)
            self._node_down(sender)
        return {"left": member is not None}

    def _node_down(self, node_id: str) -> None:
        for callback in list(self._down_callbacks):
            _run(callback, node_id)
        self._changed()

    def _changed(self) -> None:
        for callback in list(self._change_callbacks):
            _run(callback)

    # ---- a follower's side -------------------------------------------------------------------------

    def heartbeat_body(self) -> dict:
        return {"entry": self.own_entry()}

    def accept_answer(self, answer: dict, sent_at: float | None = None) -> None:
        """A successful heartbeat (sent at monotonic `sent_at`): keep the leader's view, unfence,
        apply the compute scale, stop the RPC servers the leader no longer holds."""
        state = self.follower
        if not isinstance(answer.get("view"), dict) or not isinstance(answer.get("leader_id"), str):
            raise PeerError("the leader's answer lacks its view")
        self._fence_if_overdue()
        state.leader_id, state.inference_url = answer["leader_id"], answer.get("inference_url")
        state.view, state.view_received = answer["view"], time.monotonic()
        state.power = answer.get("power")
        scale = answer.get("compute_scale")
        if isinstance(scale, (int, float)) and 0 <= scale <= 1 and scale != state.compute_scale:
            state.compute_scale = float(scale)
            self.local.set_compute_scale(state.compute_scale)
        self._arm_fence()
        if answer.get("rejoined") is True and not state.fenced:
            self._drop_leader_work()
        elif sent_at is not None and isinstance(answer.get("placements"), list):
            listed = {p for p in answer["placements"] if isinstance(p, str)}
            for callback in list(self._listed_callbacks):
                _run(callback, listed, sent_at)
        if state.fenced:
            state.fenced = False
            log.info("cluster: joined leader %s at %s", state.leader_id, state.leader_address)
            self._changed()

    def _fence_if_overdue(self) -> None:
        # A loop that was frozen past the window (SIGSTOP, swap) may wake with an answer and its
        # fencing timer both due; whichever runs first, a node silent that long has fenced.
        timer = self.follower.fence_timer
        if timer is not None and timer.when() <= self.loop.time():
            timer.cancel()
            self._fence()

    def _arm_fence(self) -> None:
        state = self.follower
        if state.fence_timer is not None:
            state.fence_timer.cancel()
        state.fence_timer = self.loop.call_later(DOWN_AFTER, self._fence)

    def _fence(self) -> None:
        state = self.follower
        state.fence_timer = None
        if state.fenced:
            return
        state.fenced = True
        log.warning("cluster: lost the leader at %s (no successful heartbeat for %g s): fenced",
                    state.leader_address, DOWN_AFTER)
        for callback in list(self._fenced_callbacks):
            _run(callback)
        self._changed()

    def _drop_leader_work(self) -> None:
        """The leader counts us as new or back, yet we never fenced: it restarted, or marked us
        down, within our fencing window. Either way it has dropped every placement it had on us
        (they lived in its processes, or it killed them when we went down), so what we still
        serve for it is orphaned: the fencing callbacks stop it, as if we had fenced."""
        log.warning("cluster: the leader at %s had lost this node: its RPC servers stop",
                    self.follower.leader_address)
        for callback in list(self._fenced_callbacks):
            _run(callback)

    async def leave(self) -> None:
        """A follower shutting down tells its leader (best effort, short)."""
        if self.follower is None or self.client is None:
            return
        try:
            await self.client.call(self.follower.leader_address, "POST", "/internal/v1/leave", {},
                                   timeout=1.0)
        except PeerError:
            pass

    def leader_inference_url(self) -> str | None:
        return self.follower.inference_url if self.follower is not None else self.inference_url


def _run(callback, *args) -> None:
    try:
        callback(*args)
    except Exception:                 # one module's failing callback must not stop the others
        log.exception("cluster: a membership callback failed")


def _checked_entry(sender: str, body: dict, leader_id: str) -> dict:
    """A heartbeat is signed by a node of the cluster, but its shape is still checked: a bad
    one is a 400, never a 500 or a corrupt view."""
    entry = body.get("entry")
    if not isinstance(entry, dict):
        raise invalid("'entry' must be the node's /v1/nodes entry", "entry")
    if not sender or entry.get("id") != sender:
        raise invalid("'entry.id' must be the signing node's id", "entry.id")
    if sender == leader_id:
        raise DomainError(Code.TAKEN, f"node id {sender} is the leader's own: give each node its own data dir")
    address = entry.get("address")
    if not isinstance(address, str) or len(address) > MAX_ADDRESS or not _is_http_url(address):
        raise invalid("'entry.address' must be the node's cluster URL, http://host:port", "entry.address")
    for name in ("memory_total_bytes", "memory_available_bytes", "model_memory_bytes", "threads"):
        value = entry.get(name)
        if type(value) is not int or value < 0:
            raise invalid(f"'entry.{name}' must be a non-negative integer", f"entry.{name}")
    compute = entry.get("compute", 0)
    if type(compute) not in (int, float) or not 0 <= compute < 1e9:
        raise invalid("'entry.compute' must be a non-negative number (GFLOP/s)", "entry.compute")
    if checked_links(entry) is None:
        raise invalid("'entry.links' must map node ids to round trips in microseconds", "entry.links")
    budget = entry.get("power_budget")
    if not (isinstance(budget, dict) and all(type(budget.get(k)) is int and budget[k] > 0
                                             for k in ("idle_mw", "max_mw"))):
        raise invalid("'entry.power_budget' must hold idle_mw and max_mw", "entry.power_budget")
    return entry


def _offer_grew(member: Member, entry: dict) -> bool:
    """Whether a follower's new entry offers more than it did: a chat model its store lacked,
    or OFFER_GROWTH more memory than its low mark (which follows the offer down, so that
    growth in small steps counts too, and is reset by each growth it reports)."""
    def stored(e: dict) -> set:
        offer = e.get("replicas")
        store = offer.get("store") if isinstance(offer, dict) else None
        return {d for d in store if isinstance(d, str)} if isinstance(store, list) else set()
    memory = entry["model_memory_bytes"]
    member.memory_mark = min(member.memory_mark, memory)
    if stored(entry) - stored(member.entry) or memory >= member.memory_mark + OFFER_GROWTH:
        member.memory_mark = memory
        return True
    return False


def _is_http_url(text: str) -> bool:
    try:
        url = urlsplit(text)
        return url.scheme == "http" and bool(url.hostname) and url.port is not None
    except ValueError:
        return False


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def threads_of(settings) -> int:
    return settings["engine.threads"] or os.cpu_count() or 1
