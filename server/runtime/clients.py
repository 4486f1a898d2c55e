"""One engine interface, two places to run it: in this process, or in a worker process.

Both give the runner the same surface: `submit_jobs` / `submit_text` / `submit_embedding`
(coroutines that answer with a SUBMIT_* verdict; submit_text also tokenizes, engine/submit.py), `cancel`, `fileno` + `take_events` (the loop watches the fd
and drains events in batches), `stats`, `aclose`, and the model's facts (`n_vocab`,
`template_facts`, ...). Tokenizing differs (ModelRunner.tokenize takes either): an inline
engine's `tokenize` and `piece` answer in this process; a worker's facts come in its ready
message and its own vocabulary answers (`tokens_of`, `text_of`): the daemon keeps no second
copy (for SmolLM2 ~17 MB of the daemon's memory, half of the rest of its Python).
"""
from __future__ import annotations

import asyncio
import itertools
import signal
import socket
import subprocess
import time
from array import array
from typing import Iterator

from ..engine.errors import EndedEvent, EngineError, ErrorCode
from ..engine import accel
from ..engine.core import (SAMPLING_FIELDS, STATUS_ERROR, SUBMIT_ACCEPTED, Engine, SamplingParams, template_facts)
from ..engine.submit import submit_all, submit_text
from ..engine.wire import FrameReader, WireError, chunks_of, decode_events, decode_trace, frame
from .worker_process import spawn

RECV_SIZE = 1 << 20                # a short read drained the socket; more wakes the loop again


def sampling_fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in SAMPLING_FIELDS}


class InlineEngine:
    """The native engine in this process (engine.isolation = inline: for profiling)."""

    isolation = "inline"
    lost = False
    pid = None

    def __init__(self, engine: Engine):
        self.engine = engine
        # Counted in this process, where each inline model's weights add up (a worker: its own).
        self.kernels = accel.report()

    def __getattr__(self, name):                  # the model's facts, fileno, take_events, ...
        return getattr(self.engine, name)

    @property
    def template_facts(self) -> dict:
        return template_facts(self.engine)

    async def submit_jobs(self, jobs, stop: list[str], owner: int) -> tuple[int, str | None]:
        return submit_all(self.engine, jobs, stop, owner)

    async def submit_text(self, ids: list[int], text_jobs, stop: list[str], owner: int,
                          made: dict | None = None) -> dict:
        """`made`: the text already tokenized (the runner does it off the loop when long)."""
        return submit_text(self.engine, ids, text_jobs, stop, owner, made)

    async def submit_embedding(self, rid: int, inputs, owner: int) -> int:
        return self.engine.submit_embedding(rid, inputs, owner)

    async def trace_start(self) -> bool:
        return self.engine.trace_start()

    async def trace_stop(self) -> tuple[Iterator[list[dict]], int]:
        """The same shape as a worker's: the records in chunks, each built when the caller
        takes it (between turns of the loop), none dropped."""
        return chunks_of(self.engine.trace_stop()), 0

    async def aclose(self, grace: float = 0.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.engine.close)


async def send_start(loop, sock: socket.socket, message: dict, tensor: dict | None = None,
                     listener: socket.socket | None = None) -> None:
    """A worker's start message; a tensor split's worker also gets its mesh listener, passed as
    a file descriptor on the same socket right after (SCM_RIGHTS: the port was bound, and told
    to the peers, before the worker existed)."""
    if tensor is not None:
        message = {**message, "tensor": tensor}
    await loop.sock_sendall(sock, frame(message))
    if listener is not None:
        sock.setblocking(True)          # one byte and a descriptor: the buffer is empty
        try:
            socket.send_fds(sock, [b"L"], [listener.fileno()])
        finally:
            sock.setblocking(False)


class WorkerEngine:
    """The engine in a supervised child process, over a socketpair the loop watches."""

    isolation = "worker"

    def __init__(self, loop, proc: subprocess.Popen, sock: socket.socket, facts: dict):
        self.loop = loop
        self.proc = proc
        self.pid = proc.pid
        self.sock = sock
        self.template_facts = {name: facts.get(name) for name in ("chat_template", "bos_text", "eos_text")}
        self.n_vocab, self.n_embd = facts["n_vocab"], facts["n_embd"]
        self.n_ctx_train, self.n_slots, self.n_ctx_seq = facts["n_ctx_train"], facts["n_slots"], facts["n_ctx_seq"]
        self.kernels = facts.get("kernels", {"path": None, "tensors": {}})
        self.reader = FrameReader()
        self.outbox = bytearray()
        self.in_flight: set[int] = set()          # requests whose last event has not come
        self.verdicts: dict[int, asyncio.Future] = {}
        self.seq = itertools.count(1)
        self.lost = False
        self.exit_status: int | None = None
        self._stats: dict = {}
        self._metrics: dict | None = None         # histograms and gauges, pushed with the stats
        self.on_lost = None                       # called once on the loop when the worker dies
        self.killed_for: str | None = None        # why the daemon killed it, told to its requests

    # ---- starting ------------------------------------------------------------------------------

    @classmethod
    async def start(cls, loop, params: dict, kernels: str = "off", kv_commit: str = "lazy",
                    batch_invariant: bool = False, omp_wait_policy: str = "inherit", nice: int = 0,
                    rpc: dict | None = None, faults: dict | None = None,
                    process: tuple[subprocess.Popen, socket.socket] | None = None,
                    tensor: dict | None = None, listener: socket.socket | None = None) -> "WorkerEngine":
        """Start a worker for `params` (Engine's keyword arguments) and wait until it serves:
        `process`, one spawned ahead with this `omp_wait_policy` (worker_process.SpareWorker),
        or a new one. `omp_wait_policy` (engine.omp_wait_policy) is for libgomp, which reads it
        when it loads; `nice` is added to the worker's niceness before it loads the model;
        `kv_commit` is engine.kv_commit (accel.commit_on_write). `rpc` places layers on ggml RPC
        servers: {"secret": hex, "peers": [{"host", "port", "relay", "placement_id"}]}, in the
        order of params' tensor_split. `faults`: the test configuration's part for workers
        (server/faults.py), empty otherwise. `tensor` and `listener`: rank 0 of a tensor split
        (runtime/tensor_group.py), the socket its peers dial."""
        proc, ours = process or spawn(omp_wait_policy)
        try:
            await send_start(loop, ours, {"op": "start", "engine": params, "kernels": kernels,
                                          "kv_commit": kv_commit, "batch_invariant": batch_invariant,
                                          "nice": nice, "rpc": rpc, "faults": faults or {}}, tensor, listener)
            reader = FrameReader()
            while True:
                data = await loop.sock_recv(ours, 1 << 16)
                if not data:
                    raise EngineError(ErrorCode.WORKER_LOST,
                                      f"the worker exited while loading ({describe_exit(proc.wait())})")
                frames = reader.feed(data)
                if frames:
                    break
        except BaseException:
            ours.close()
            _reap(proc)
            raise
        message = frames[0][0]
        if message.get("op") != "ready":
            ours.close()
            _reap(proc)
            if message.get("code") == ErrorCode.PEER_UNREACHABLE.value:
                raise EngineError(ErrorCode.PEER_UNREACHABLE, message["error"])
            raise RuntimeError(message.get("error") or "the worker could not load the model")
        engine = cls(loop, proc, ours, message["facts"])
        engine.reader = reader
        return engine

    # ---- the vocabulary, the worker's ----------------------------------------------------------

    async def tokens_of(self, texts: list[str], add_special: bool, parse_special: bool) -> list[list[int]]:
        """Each text's token ids, from the worker's vocabulary: the texts go as one frame's
        tail, the ids come back as another's (int32)."""
        encoded = [text.encode("utf-8", "replace") for text in texts]
        reply, tail = await self._call({"op": "tokenize", "sizes": [len(e) for e in encoded],
                                        "add_special": add_special, "parse_special": parse_special},
                                       b"".join(encoded))
        if "error" in reply:
            raise EngineError(ErrorCode.DECODE_FAILED, f"the model's vocabulary could not tokenize: {reply['error']}")
        ids = array("i")
        ids.frombytes(tail)
        out, at = [], 0
        for n in reply["counts"]:
            out.append(ids[at:at + n].tolist())
            at += n
        return out

    async def text_of(self, tokens: list[int], special: bool = False) -> bytes:
        """The tokens' pieces, joined, from the worker's vocabulary (`special`: control tokens
        rendered as their text, as /detokenize shows them; else as nothing)."""
        _, tail = await self._call({"op": "detokenize", "special": special}, array("i", tokens).tobytes())
        return tail

    # ---- work ---------------------------------------------------------------------------------------

    async def submit_jobs(self, jobs, stop: list[str], owner: int) -> tuple[int, str | None]:
        ids = [job[0] for job in jobs]
        reply = await self._ask({"op": "submit", "stop": stop, "owner": owner, "jobs": [
            [rid, prompt, max_tokens, sampling_fields(sampling)] for rid, prompt, max_tokens, sampling in jobs]},
            ids)
        return reply["verdict"], reply.get("error")

    async def submit_text(self, ids: list[int], text_jobs, stop: list[str], owner: int) -> dict:
        """A prompt as text, tokenized and submitted by the worker in one exchange (the text
        goes as the frame's tail): the verdict's fields (engine/submit.py submit_text)."""
        return await self._ask({"op": "submit_text", "stop": stop, "owner": owner, "ids": ids,
                                "samplings": [sampling_fields(s) for s in text_jobs.samplings],
                                **text_jobs.header()}, ids, text_jobs.text.encode("utf-8", "replace"))

    async def submit_embedding(self, rid: int, inputs, owner: int) -> int:
        reply = await self._ask({"op": "embed", "id": rid, "owner": owner, "inputs": inputs}, [rid])
        return reply["verdict"]

    async def _ask(self, message: dict, ids: list[int], tail: bytes = b"") -> dict:
        if self.lost:
            raise EngineError(ErrorCode.WORKER_LOST, "the model's worker process is not running")
        seq = message["seq"] = next(self.seq)
        future = self.verdicts[seq] = self.loop.create_future()
        self.in_flight.update(ids)                # events may come before the verdict
        self._send(frame(message, tail))
        try:
            reply = await future
        finally:
            self.verdicts.pop(seq, None)
        if reply["verdict"] != SUBMIT_ACCEPTED:
            self.in_flight.difference_update(ids)
        return reply

    # ---- the engine trace (server/observe/trace.py) -------------------------------------------------

    async def trace_start(self) -> bool:
        """False: the engine records already."""
        reply, _ = await self._call({"op": "trace_start"})
        return reply["started"]

    async def trace_stop(self) -> tuple[Iterator[list[dict]], int]:
        """The records since trace_start, a chunk at a time (decoded as they are taken, so the
        caller can let the loop turn between chunks), and how many did not fit the frame."""
        reply, tail = await self._call({"op": "trace_stop"})
        return decode_trace(reply.get("chunks"), tail), reply.get("n_dropped", 0)

    async def _call(self, message: dict, tail: bytes = b"") -> tuple[dict, bytes]:
        """Send a request, await the worker's answer (its header and tail), matched by seq.
        The worker's death fails it with WORKER_LOST (_lose), closing with UNLOADED (aclose)."""
        if self.lost:
            how = "" if self.exit_status is None else f" ({describe_exit(self.exit_status)})"
            raise EngineError(ErrorCode.WORKER_LOST, f"the model's worker process is not running{how}")
        seq = message["seq"] = next(self.seq)
        future = self.verdicts[seq] = self.loop.create_future()
        self._send(frame(message, tail))
        try:
            return await future
        finally:
            self.verdicts.pop(seq, None)

    def cancel(self, rid: int) -> None:
        if not self.lost:
            self._send(frame({"op": "cancel", "id": rid}))

    def set_compute_scale(self, scale: float) -> None:
        self._send(frame({"op": "compute", "scale": scale}))

    def stats(self) -> dict:
        return dict(self._stats)

    def metrics(self) -> dict | None:
        """The engine's histograms and gauges as of its last push (None before the first)."""
        return self._metrics

    def fileno(self) -> int:
        return self.sock.fileno()

    # ---- the socket ---------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        """Never blocks the loop: what the socket does not take now waits for a writable event
        (a frozen worker fills its buffer; its supervisor kills it, and the bytes go with it)."""
        if self.lost:
            return
        if not self.outbox:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return                             # dead: the reader sees EOF and reports it
            data = data[sent:]
            if not data:
                return
            self.loop.add_writer(self.sock.fileno(), self._flush)
        self.outbox += data

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self.outbox)
        except BlockingIOError:
            return
        except OSError:
            sent = len(self.outbox)
        del self.outbox[:sent]
        if not self.outbox:
            self.loop.remove_writer(self.sock.fileno())

    def take_events(self) -> list:
        """Everything the worker sent since the last call; at EOF, an error event for every
        request still in flight, and the worker is reported lost."""
        events = []
        while not self.lost:
            try:
                data = self.sock.recv(RECV_SIZE)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                events += self._lose()
                break
            try:
                frames = self.reader.feed(data)
            except WireError:
                events += self._lose()
                break
            for message, tail in frames:
                events += self._dispatch(message, tail)
            if len(data) < RECV_SIZE:
                break                              # drained (a token's frame): no second recv
        return events

    def _dispatch(self, message: dict, tail: bytes) -> list:
        op = message.get("op")
        if op == "events":
            try:
                events = decode_events(tail)
            except WireError:
                return self._lose()
            for event in events:
                if event.status > 1:               # a finished kind: the request is done
                    self.in_flight.discard(event.id_request)
            return events
        if op == "verdict":
            self._answer(message, message)
        elif op in ("trace_started", "trace", "tokens", "text"):
            self._answer(message, (message, tail))
        elif op == "stats":
            self._stats = message.get("stats") or {}
            self._metrics = message.get("metrics")
        return []

    def _answer(self, message: dict, result) -> None:
        future = self.verdicts.get(message.get("seq"))
        if future is not None and not future.done():
            future.set_result(result)

    def _lost_because(self) -> str:
        from ..engine.worker import EXIT_RPC_PEER_LOST, EXIT_TENSOR_PEER_LOST
        if self.exit_status in (EXIT_RPC_PEER_LOST, EXIT_TENSOR_PEER_LOST):   # a node, not the process
            return f"the model {describe_exit(self.exit_status)}; it is being placed again"
        return f"the model's worker process died ({describe_exit(self.exit_status)}); it is being restarted"

    def _lose(self) -> list:
        self.lost = True
        self.loop.remove_reader(self.sock.fileno())
        if self.outbox:
            self.loop.remove_writer(self.sock.fileno())
            self.outbox.clear()
        if self.proc.poll() is None:               # closed its socket yet alive: of no use now
            self.proc.kill()
        self.exit_status = self.proc.wait()
        error = EngineError(ErrorCode.WORKER_LOST, self.killed_for or self._lost_because())
        for future in self.verdicts.values():
            if not future.done():
                future.set_exception(error)
        events = [EndedEvent(rid, STATUS_ERROR, error) for rid in self.in_flight]
        self.in_flight.clear()
        if self.on_lost is not None:
            self.loop.call_soon(self.on_lost, self)
        return events

    # ---- stopping -----------------------------------------------------------------------------------

    async def aclose(self, grace: float = 10.0) -> None:
        """Ask the worker to close its engine and exit; kill it after `grace` seconds."""
        if not self.lost:
            self.lost = True
            self.loop.remove_reader(self.sock.fileno())
            unloaded = EngineError(ErrorCode.UNLOADED, "the model was unloaded")
            for future in self.verdicts.values():    # nothing answers them now
                if not future.done():
                    future.set_exception(unloaded)
            try:
                self.sock.setblocking(True)
                self.sock.sendall(self.outbox + frame({"op": "close"}))
            except OSError:
                pass
        self.exit_status = await self.loop.run_in_executor(None, _reap, self.proc, grace)
        self.sock.close()

    def kill(self, why: str | None = None) -> None:
        """A frozen or misbehaving worker: no grace (its EOF then ends its requests, with `why`
        as their error when given)."""
        self.killed_for = why
        if self.proc.poll() is None:
            self.proc.kill()


def _reap(proc: subprocess.Popen, wait: float = 5.0) -> int:
    try:
        return proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def describe_exit(status: int | None) -> str:
    from ..engine.worker import EXIT_RPC_PEER_LOST, EXIT_TENSOR_PEER_LOST
    if status is None:
        return "still running"
    if status == EXIT_RPC_PEER_LOST:
        return "lost its connection to a node holding part of the model"
    if status == EXIT_TENSOR_PEER_LOST:
        return "lost a node of its tensor split (a peer's exchange failed)"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit code {status}"


def exit_record(status: int | None) -> dict:
    return {"reason": describe_exit(status),
            "signal": signal.Signals(-status).name if status is not None and status < 0 else None,
            "exit_code": status if status is not None and status >= 0 else None,
            "at": int(time.time())}
