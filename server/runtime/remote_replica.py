"""A replica of a model on a follower, as the leader sees it: started and stopped through signed
internal calls, and each request streamed over its own signed connection to the follower's
cluster port:

    POST /internal/v1/replica/start  {"replica_id", "model", "sha256", "context_length"} -> {"pid", "n_slots"}
    POST /internal/v1/replica/stop   {"replica_id"}                                       -> {"stopped"}
    POST /internal/v1/replica/generate {"replica_id", "owner", "stop", "jobs": [[prompt ids,
         max_tokens, sampling fields]]} -> a stream of engine wire frames (engine/wire.py):
         {"op": "accepted", "ids"} or {"op": "refused", "code", "message"}, then `events` frames
         (the native event wire, as a worker sends them) and {"op": "ended", "id", "code",
         "message"} for a request the follower ended itself.

Token ids and sampling parameters go in (the leader renders and tokenizes once); the engine's
own events come out, decoded into the same Event objects a local worker's give, so the answers
the leader builds from them are byte for byte a local engine's. The request is signed like
every internal call (cluster/signing.py), the answer's head carries the follower's signature
over the request's nonce; user keys never travel.

No read on the stream has a deadline: a follower that freezes is found by the membership (no
heartbeat for 3 s: node down), which ends the replica and with it its streams.
"""
from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import orjson

from ..cluster import signing
from ..engine.core import STATUS_ERROR, STATUS_RUNNING, SUBMIT_ACCEPTED
from ..engine.errors import EndedEvent, EngineError, ErrorCode
from ..engine.wire import FrameReader, WireError, decode_events
from .clients import sampling_fields
from .runner import Generation

START_TIMEOUT = 300.0          # a follower loading a model in a worker on a busy machine
GENERATE_PATH = "/internal/v1/replica/generate"
READ_SIZE = 1 << 16


class RemoteReplica:
    remote = True

    def __init__(self, loop, membership, node_id: str, replica_id: str, on_lost=None):
        self.loop = loop
        self.membership = membership
        self.node_id = node_id
        self.replica_id = replica_id
        self.on_lost = on_lost          # on_lost(replica, why): its stream broke
        self.in_flight = 0
        self.alive = True
        self.pid = None
        self.n_slots = 1
        self.streams: dict[Generation, tuple[asyncio.Task, set]] = {}   # -> (pump, ids still open)
        self._gone = loop.create_future()   # done when it is lost: requests still opening give up

    # ---- start, stop ---------------------------------------------------------------------------

    async def start(self, manifest, context_length: int, kv_type: str = "f16") -> None:
        answer = await self.membership.call(self.node_id, "POST", "/internal/v1/replica/start", {
            "replica_id": self.replica_id, "model": manifest.id, "sha256": manifest.sha256,
            "context_length": context_length, "kv_type": kv_type}, timeout=START_TIMEOUT)
        self.pid, self.n_slots = answer.get("pid"), int(answer.get("n_slots") or 1)

    async def stop(self) -> None:
        self.alive = False
        with contextlib.suppress(Exception):
            await self.membership.call(self.node_id, "POST", "/internal/v1/replica/stop",
                                       {"replica_id": self.replica_id})

    def describe(self) -> dict:
        return {"node": self.node_id, "state": "loaded" if self.alive else "lost", "pid": self.pid,
                "in_flight": self.in_flight}

    # ---- requests ------------------------------------------------------------------------------

    async def generate(self, jobs, stop: list[str], owner: int) -> Generation:
        if not self.alive:
            raise EngineError(ErrorCode.WORKER_LOST, f"the model's replica on node {self.node_id} is gone")
        body = orjson.dumps({"replica_id": self.replica_id, "owner": owner, "stop": stop, "jobs": [
            [list(prompt), max_tokens, sampling_fields(sampling)] for prompt, max_tokens, sampling in jobs]})
        opening = asyncio.ensure_future(self._open(body))
        try:
            await asyncio.wait([opening, self._gone], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            opening.cancel()
            raise
        if not opening.done():              # lost (a frozen node found down) before it answered
            opening.cancel()
            raise EngineError(ErrorCode.WORKER_LOST, f"the model's replica on node {self.node_id} was lost")
        try:
            reader, writer, frames = opening.result()
        except (OSError, WireError, EngineError) as exc:
            if isinstance(exc, EngineError) and exc.code not in (ErrorCode.WORKER_LOST,):
                raise
            raise EngineError(ErrorCode.WORKER_LOST, f"the model's replica on node {self.node_id} "
                              f"cannot be reached: {exc}") from None
        stream = Generation(self.loop)
        for rid in frames.ids:
            stream.choice[rid] = len(stream.choice)
        stream.n_open = len(frames.ids)
        open_ids = set(frames.ids)
        task = self.loop.create_task(self._pump(stream, reader, writer, frames, open_ids))
        self.streams[stream] = (task, open_ids)
        task.add_done_callback(lambda _: self.streams.pop(stream, None))
        return stream

    async def _open(self, body: bytes):
        """Connect, send the signed request, read the answer's head and the verdict frame."""
        address = self.membership.address_of(self.node_id)
        if address is None:
            raise EngineError(ErrorCode.WORKER_LOST, f"node {self.node_id} is not in the cluster")
        url = urlsplit(address)
        client = self.membership.client
        headers = signing.sign(client.secret, "POST", GENERATE_PATH, body, node_id=client.self_id)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        try:
            head = [f"POST {GENERATE_PATH} HTTP/1.0", f"Host: {url.netloc}",
                    "Content-Type: application/json", f"Content-Length: {len(body)}"]
            head += [f"{name}: {value}" for name, value in headers.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            status_line = await reader.readline()
            parts = status_line.split()
            status = int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
            answer_headers = {}
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                answer_headers[name.strip().lower()] = value.strip()
            if status != 200:
                rest = await reader.read()
                raise EngineError(ErrorCode.WORKER_LOST, f"the replica on node {self.node_id} answered "
                                  f"{status}: {rest[:300].decode('utf-8', 'replace')}")
            if not signing.verify_answer(client.secret, headers[signing.NONCE], 200, b"",
                                         answer_headers.get(signing.SIGNATURE)):
                raise EngineError(ErrorCode.WORKER_LOST, f"the replica stream from node {self.node_id} is "
                                  "not signed with the cluster secret")
            frames = _Frames()
            while frames.verdict is None:
                data = await reader.read(READ_SIZE)
                if not data:
                    raise EngineError(ErrorCode.WORKER_LOST, f"the replica on node {self.node_id} closed "
                                      "the stream before its verdict")
                frames.feed(data)
        except BaseException:
            writer.close()
            raise
        if frames.verdict != SUBMIT_ACCEPTED:
            writer.close()
            raise EngineError(ErrorCode(frames.code), frames.message)
        return reader, writer, frames

    async def _pump(self, stream: Generation, reader, writer, frames: "_Frames", open_ids: set) -> None:
        """The stream's events into `stream` until every request of it ended; a stream that
        breaks first ends them with WORKER_LOST and reports the replica lost."""
        try:
            while True:
                for event in frames.take():
                    if event.status != STATUS_RUNNING:
                        open_ids.discard(event.id_request)
                    stream.push(event)
                if not open_ids:
                    return
                data = await reader.read(READ_SIZE)
                if not data:
                    raise ConnectionError("the stream ended early")
                frames.feed(data)
        except (OSError, WireError, ValueError) as exc:
            error = EngineError(ErrorCode.WORKER_LOST, f"the model's replica on node {self.node_id} was "
                                f"lost ({exc})")
            for rid in open_ids:
                stream.push(EndedEvent(rid, STATUS_ERROR, error))
            open_ids.clear()
            if self.alive and self.on_lost is not None:
                self.on_lost(self, str(exc))
        finally:
            writer.close()

    def cancel(self, stream: Generation) -> None:
        """Closing the connection cancels the requests on the follower."""
        entry = self.streams.pop(stream, None)
        if entry is not None:
            entry[0].cancel()

    def end_all(self, error: EngineError) -> None:
        """Every stream ends with `error` (the replica is lost, or the model unloaded)."""
        self.alive = False
        if not self._gone.done():
            self._gone.set_result(None)
        streams, self.streams = self.streams, {}
        for stream, (task, open_ids) in streams.items():
            task.cancel()
            for rid in open_ids:
                stream.push(EndedEvent(rid, STATUS_ERROR, error))
            open_ids.clear()


class _Frames:
    """The stream's frames: its verdict, then events."""

    def __init__(self):
        self.reader = FrameReader()
        self.verdict = None
        self.code = self.message = None
        self.ids: list[int] = []
        self.events: list = []

    def feed(self, data: bytes) -> None:
        for header, tail in self.reader.feed(data):
            op = header.get("op")
            if op == "events":
                self.events += decode_events(tail)
            elif op == "accepted":
                self.verdict, self.ids = SUBMIT_ACCEPTED, [int(i) for i in header["ids"]]
            elif op == "refused":
                self.verdict, self.message = -1, str(header.get("message"))
                self.code = header.get("code") if header.get("code") in {c.value for c in ErrorCode} \
                    else ErrorCode.WORKER_LOST.value
            elif op == "ended":
                code = header.get("code")
                code = ErrorCode(code) if code in {c.value for c in ErrorCode} else ErrorCode.WORKER_LOST
                self.events.append(EndedEvent(int(header["id"]), STATUS_ERROR,
                                              EngineError(code, str(header.get("message")))))

    def take(self) -> list:
        events, self.events = self.events, []
        return events
