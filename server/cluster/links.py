"""Each node's measured round trip to every other node: the planner's figure for links, as
`compute` is its figure for nodes (docs/cluster.md, "Links, measured").

A node of a cluster (one with the secret) times a TCP connect to each peer's cluster port, the
best of SAMPLES: a connect is one SYN out and one SYN-ACK back, answered by the peer's kernel,
so it is the link's round trip without either daemon's scheduling or Python in it (the
all-reduce's own costs on top of it are bench/tp_exchange.py's). Each peer is measured when it
first appears and every LINK_INTERVAL seconds after, off the event loop (a thread of the
loop's executor); a peer that cannot be reached has no figure. The node reports its figures
in its /v1/nodes entry as `links` ({peer id: microseconds}), so heartbeats carry a follower's
to the leader, and `/v1/cluster` lists every link measured (`links`: from, to, rtt_us).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from urllib.parse import urlsplit

log = logging.getLogger("stackd.cluster")

LINK_INTERVAL = 10.0          # seconds between two measurements of one peer
TICK = 1.0                    # how often new peers are looked for
SAMPLES = 3                   # connects per measurement; the best counts
CONNECT_TIMEOUT = 1.0         # a peer that does not answer a connect this long has no figure
MAX_LINKS = 64                # figures a node's entry may carry (a heartbeat's check)


def connect_rtt_us(host: str, port: int, samples: int = SAMPLES, timeout: float = CONNECT_TIMEOUT) -> float | None:
    """The best TCP connect time to (host, port) of `samples` tries, in microseconds; None when
    no try connects."""
    best = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError:
        return None
    for _ in range(samples):
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout)
        try:
            started = time.perf_counter()
            sock.connect(address)
            took = (time.perf_counter() - started) * 1e6
        except OSError:
            continue
        finally:
            sock.close()
        best = took if best is None else min(best, took)
    return None if best is None else round(best, 1)


class LinkProbe:
    """This node's figures, kept fresh while the membership runs."""

    def __init__(self, membership):
        self.membership = membership
        self.rtts: dict[str, tuple[float, float]] = {}     # peer id -> (rtt_us, measured at)
        self.task: asyncio.Task | None = None

    def start(self, loop) -> None:
        self.task = loop.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None

    def entry(self) -> dict[str, float]:
        return {peer: rtt for peer, (rtt, _) in sorted(self.rtts.items())}

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:                  # a bug here must not end the measurements
                log.exception("cluster: measuring links failed")
            await asyncio.sleep(TICK)

    async def sweep(self) -> None:
        """Measure each peer that is up and has no fresh figure; forget the peers gone."""
        membership = self.membership
        peers = {e["id"]: e.get("address") for e in membership.node_entries()
                 if e["id"] != membership.self_id and e.get("status") == "up"}
        for gone in set(self.rtts) - set(peers):
            del self.rtts[gone]
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        for peer, address in peers.items():
            if peer in self.rtts and now - self.rtts[peer][1] < LINK_INTERVAL:
                continue
            try:
                url = urlsplit(address or "")
                host, port = url.hostname, url.port
            except ValueError:
                continue
            if not host or not port:
                continue
            rtt = await loop.run_in_executor(None, connect_rtt_us, host, port)
            if rtt is None:
                self.rtts.pop(peer, None)
            else:
                self.rtts[peer] = (rtt, time.monotonic())


def checked_links(entry: dict) -> dict[str, float] | None:
    """A heartbeat entry's `links`, or None when its shape is wrong (the caller refuses it)."""
    links = entry.get("links", {})
    if not isinstance(links, dict) or len(links) > MAX_LINKS:
        return None
    for peer, rtt in links.items():
        if not isinstance(peer, str) or not 0 < len(peer) <= 128:
            return None
        if type(rtt) not in (int, float) or not 0 <= rtt < 1e9:
            return None
    return links


def cluster_links(entries: list[dict]) -> list[dict]:
    """/v1/cluster's `links`: every figure the nodes that are up report."""
    return [{"from": e["id"], "to": peer, "rtt_us": rtt}
            for e in entries if e.get("status") == "up"
            for peer, rtt in sorted((e.get("links") or {}).items())]
