"""The engine worker: one model's llama.cpp engine in a process of its own.

    python -I -S .../stackd/engine/worker_boot.py stackd FD PARENT_PID   (worker_boot.py says why)

FD is this end of a socketpair with the daemon. The first frame is the engine's parameters;
the worker loads the model, answers `ready` with the model's facts, then serves frames
(submit, submit_text, embed, cancel, close, trace_start, trace_stop, tokenize, detokenize) and
forwards the engine's events,
waking on the socket and on the engine's eventfd (poll, no busy loop, no thread per request).
Most steps' events do not pass through here: the engine thread writes them to the socket
itself (native/engine/frame_sink.h), and every frame of this process goes through that sink.
Stats go out at once, with every request's end, and at least once a second.

It exits when the daemon says close (after closing the engine), when the daemon's end of the
socket closes, or when the daemon dies (PR_SET_PDEATHSIG, set here at start).

A tensor split's worker (issue 36; docs/cluster.md, "Tensor parallelism") has a `tensor` dict in
its start message: {rank, size, addresses [[host, port], ...] (index = rank), mesh_id, secret
(hex), deadline_ms, spin_us, vocab_cut}, and its mesh listener comes right after the start frame
on the same socket (one byte b"L" carrying the descriptor, SCM_RIGHTS: the daemon bound it, so
its port was told to the peers before this process existed). Before the engine loads, the worker
forms the mesh (engine/exchange/mesh.py: dial the lower ranks, accept the higher, each link
proving the cluster secret), hands every link's socket and session key to the kernels
(accel.tp_attach), then loads its shard with tp_rank/tp_size. Rank 0 serves as any worker; a
follower (rank > 0) says ready, then only mirrors rank 0's steps (Engine.follow) and exits 0 on
its leader's stop, EXIT_TENSOR_PEER_LOST on a lost link or a message out of step. A leader whose
group fails exits EXIT_TENSOR_PEER_LOST at once, without relaying the failed requests' ends: the
daemon ends every request in flight as it does for a lost node (503, worker_lost) and places the
model again. It imports only
what it needs: not llama-cpp-python, not the HTTP layer, not orjson (its frames go through the
standard library's json, wire.use_standard_json).
"""
from __future__ import annotations

import _socket
import collections
from array import array
import os
import select
import signal
import sys
import time

from ..faults import Faults
from ..system.process import die_with_parent
from .wire import FrameReader, encode_trace, frame, use_standard_json

# Texts (or token lists) up to this size are tokenized (or joined) on the worker's loop
# (microseconds); longer ones beside it (Worker.answer).
ON_LOOP_BYTES = 16 * 1024

STATS_INTERVAL = 1.0
EXIT_RPC_PEER_LOST = 75                # a node holding some of the model's layers went away
EXIT_TENSOR_PEER_LOST = 76             # a tensor split's group failed (a node gone, a link cut)
MESH_TIMEOUT = 30.0                    # seconds the mesh has to form (every peer's worker starting)
LISTENER_TIMEOUT = 10.0                # seconds the mesh listener may come after the start frame


def receive_start(sock) -> tuple[FrameReader, list, list[int]]:
    """The start frame (and anything after it), and the descriptors that came with the bytes.
    Read with room for descriptors: a plain recv would take the listener's marker byte with the
    start frame and close the descriptor it carries. A chunk that brought descriptors ends with
    their marker byte (the kernel ends a read after such a message), which is not frame data."""
    reader, frames, fds = FrameReader(), [], []
    while not frames:
        data, got = recv_with_fds(sock)
        if not data:
            break
        if got:
            if data[-1:] != b"L":               # not the listener's marker: not ours to keep
                for extra in got:
                    os.close(extra)
            else:
                fds.extend(got)
            data = data[:-1]
        frames = reader.feed(data)
    return reader, frames, fds


def recv_with_fds(sock, size: int = 1 << 20) -> tuple[bytes, list[int]]:
    data, ancillary, _flags, _addr = sock.recvmsg(size, _socket.CMSG_SPACE(4 * 4))
    fds = array("i")
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return data, list(fds)


def mesh_listener(sock, tensor: dict, fds: list[int]) -> int | None:
    """The listener the daemon passes after the start frame (receive_start may have it already);
    the last rank accepts no one, but is given one all the same, and it is taken off the socket."""
    if not fds:
        sock.settimeout(LISTENER_TIMEOUT)
        try:
            data, fds = recv_with_fds(sock, 1)
        except TimeoutError:
            data = b""
        finally:
            sock.settimeout(None)
        if data != b"L" or not fds:
            raise ValueError("a tensor split's worker needs its mesh listener right after its start frame")
    for extra in fds[1:]:
        os.close(extra)
    return fds[0] if fds else None


def numpy_for_mesh() -> None:
    """mesh.py imports numpy (its reference all-reduce), which a worker started without
    site-packages (worker_boot.py) cannot: the folder llama.cpp's package is in holds it."""
    try:
        import numpy  # noqa: F401
    except ImportError:
        from . import llama_library
        sys.path.append(os.path.dirname(os.path.dirname(llama_library.library_dir())))


def join_tensor_group(tensor: dict, listener_fd: int | None) -> None:
    """Form the mesh and hand its links to the kernels (accel.tp_attach), before the engine loads."""
    import socket

    from . import accel
    numpy_for_mesh()
    from .exchange.mesh import Mesh
    rank, size = int(tensor["rank"]), int(tensor["size"])
    addresses = [(str(host), int(port)) for host, port in tensor["addresses"]]
    if len(addresses) != size or not 0 <= rank < size or len(tensor["vocab_cut"]) != size + 1:
        raise ValueError("the tensor split's rank, addresses and vocab_cut do not agree on its size")
    if accel.registered() is None:
        raise ValueError("a tensor split needs our kernels (engine.kernels: auto) on a CPU with AVX2 "
                         "or the dot-product instructions (aarch64)")
    listener = socket.socket(fileno=listener_fd) if listener_fd is not None else None
    deadline_ms, spin_us = int(tensor["deadline_ms"]), int(tensor.get("spin_us", 0))
    try:
        mesh = Mesh(rank, addresses, bytes.fromhex(tensor["secret"]), str(tensor["mesh_id"]), listener=listener,
                    deadline=deadline_ms / 1000.0, spin_us=spin_us)
        mesh.connect(MESH_TIMEOUT)
    finally:
        if listener is not None:
            listener.close()
    links = [mesh.links.get(i) for i in range(size)]
    accel.tp_attach(rank, [None if link is None else link.sock for link in links],
                    [None if link is None else link.key for link in links],
                    [int(v) for v in tensor["vocab_cut"]], deadline_ms, spin_us)


def follow(engine) -> int:
    """A follower's life after ready: its leader's steps until a stop or a loss."""
    reason = engine.follow()
    print(f"stackd worker: tensor follower ends: {reason}", file=sys.stderr, flush=True)
    engine.close()
    from . import accel
    accel.tp_detach()
    return 0 if reason in ("stop", "closed") else EXIT_TENSOR_PEER_LOST


def connect_devices(rpc: dict | None) -> list[str]:
    """The RPC endpoints llama.cpp will use, each checked to answer first (ggml's RPC client
    aborts the process on one it cannot reach). A relayed peer gets a local dialer that proves
    the cluster secret to its relay; losing it ends this process at once, with a word."""
    if not rpc:
        return []
    from ..system.relay import Dialer, dial_direct

    def lost(endpoint: str) -> None:
        print(f"stackd worker: lost the RPC peer at {endpoint}", file=sys.stderr, flush=True)
        os._exit(EXIT_RPC_PEER_LOST)

    endpoints = []
    secret = bytes.fromhex(rpc.get("secret") or "")
    # The dialers copy in Python: a lost peer must be reported (EXIT_RPC_PEER_LOST) before the
    # local socket closes and ggml aborts the process, and the native pump shuts both sockets
    # down before it returns. The relay on the RPC server's side copies natively.
    for peer in rpc["peers"]:
        host, port = peer["host"], int(peer["port"])
        if peer.get("relay"):
            dialer = Dialer(host, port, secret, peer["placement_id"], on_lost=lost)
            dialer.probe()
            endpoints.append(dialer.start().endpoint)
        else:
            dial_direct(host, port)
            endpoints.append(f"{host}:{port}")
    return endpoints


class Worker:
    def __init__(self, sock: _socket.socket, engine):
        self.sock = sock
        self.sock_fd = sock.fileno()
        self.engine = engine
        self.reader = FrameReader()
        self.running = True
        # Long texts are tokenized on a thread (answer, submit_text); what is left to do with
        # the result comes back here through `answers` (a callable each, run on this loop),
        # and a byte on the pipe wakes this loop to run it.
        self.beside = None
        self.answers: collections.deque = collections.deque()
        self.wake_read, self.wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.tokenizing: dict[int, bool] = {}   # ids of text submits beside the loop -> cancelled
        self.tensor = False                    # the leader of a tensor split (check_tensor_group)
        engine.attach_sink(self.sock_fd)       # every frame from here on goes through the engine

    # ---- messages from the daemon --------------------------------------------------------------

    def handle(self, message: dict, tail: bytes = b"") -> None:
        op = message.get("op")
        if op == "submit":
            self.submit(message)
        elif op == "submit_text":
            self.submit_text(message, tail)
        elif op == "embed":
            verdict = self.engine.submit_embedding(message["id"], message["inputs"], message["owner"])
            self.send({"op": "verdict", "seq": message["seq"], "verdict": verdict})
        elif op == "cancel":
            self.engine.cancel(message["id"])
            if message["id"] in self.tokenizing:      # its submit comes after: cancelled there
                self.tokenizing[message["id"]] = True
        elif op == "compute":
            self.engine.set_compute_scale(message["scale"])
        elif op == "close":
            self.running = False
        elif op == "trace_start":
            self.send({"op": "trace_started", "seq": message["seq"], "started": self.engine.trace_start()})
        elif op == "trace_stop":
            self.send_trace(message["seq"])
        elif op == "tokenize":
            self.answer(self.tokens_of, message, tail)
        elif op == "detokenize":
            self.answer(self.text_of, message, tail)

    # ---- the vocabulary: the daemon keeps none, it asks here --------------------------------------

    def answer(self, produce, message: dict, tail: bytes) -> None:
        """`produce(message, tail)`'s answer, sent."""
        self.beside_if_long(len(tail), lambda: produce(message, tail), lambda answer: self.send(*answer))

    def beside_if_long(self, size: int, work, then) -> None:
        """then(work()): at once for a short input, else work() on a thread beside this loop
        (tokenizing releases the GIL; a 1 MiB prompt takes ~0.3 s, which other requests'
        submits, cancels and ends would otherwise wait through here) and then() back on it."""
        if size <= ON_LOOP_BYTES:
            then(work())
            return
        if self.beside is None:
            from concurrent.futures import ThreadPoolExecutor
            self.beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stackd-tokenize")

        def beside() -> None:
            result = work()
            self.answers.append(lambda: then(result))
            os.write(self.wake_write, b"\0")

        self.beside.submit(beside)

    def tokens_of(self, message: dict, tail: bytes) -> tuple[dict, bytes]:
        """The `tokens` answer to a `tokenize` message (its header and tail)."""
        ids, counts, at = array("i"), [], 0
        try:
            for size in message["sizes"]:
                tokens = self.engine.tokenize(tail[at:at + size].decode("utf-8", "replace"),
                                              message["add_special"], message["parse_special"])
                at += size
                counts.append(len(tokens))
                ids.extend(tokens)
        except Exception as exc:                # never the worker's end: the request's error
            return {"op": "tokens", "seq": message["seq"], "error": str(exc)}, b""
        return {"op": "tokens", "seq": message["seq"], "counts": counts}, ids.tobytes()

    def send_answers(self) -> None:
        try:
            os.read(self.wake_read, 4096)
        except BlockingIOError:
            pass
        while self.answers:
            self.answers.popleft()()

    def close_beside(self) -> None:
        """Before the engine closes: the thread reads its vocabulary."""
        if self.beside is not None:
            self.beside.shutdown(wait=True, cancel_futures=True)

    def text_of(self, message: dict, tail: bytes) -> tuple[dict, bytes]:
        """The `text` answer to a `detokenize` message: the tokens' pieces, joined."""
        ids = array("i")
        ids.frombytes(tail)
        n_vocab = self.engine.n_vocab
        special = bool(message.get("special", False))
        return {"op": "text", "seq": message["seq"]}, b"".join(
            self.engine.piece(t, special) for t in ids if 0 <= t < n_vocab)

    def submit(self, message: dict) -> None:
        """Jobs of token ids: [[id, prompt, max_tokens, sampling fields], ...]."""
        from .submit import submit_all
        jobs = ((rid, prompt, max_tokens, sampling_of(fields))
                for rid, prompt, max_tokens, fields in message["jobs"])
        verdict, error = submit_all(self.engine, jobs, message["stop"], message["owner"])
        self.send({"op": "verdict", "seq": message["seq"], "verdict": verdict, "error": error})

    def submit_text(self, message: dict, tail: bytes) -> None:
        """A prompt as text (engine/submission.py): tokenized here, beside this loop when long,
        checked against the context, submitted; the verdict carries the prompt's token count."""
        from .submission import TextJobs
        from .submit import jobs_of_text, submit_text
        text_jobs = TextJobs.from_header(message, tail.decode("utf-8", "replace"),
                                         [sampling_of(fields) for fields in message["samplings"]])

        ids = message["ids"]
        self.tokenizing.update((rid, False) for rid in ids)

        def submit(made: dict) -> None:
            answer = submit_text(self.engine, ids, text_jobs, message["stop"], message["owner"], made)
            for rid in ids:                           # a cancel that came while it was tokenized
                if self.tokenizing.pop(rid, False):
                    self.engine.cancel(rid)
            self.send({"op": "verdict", "seq": message["seq"], **answer})

        self.beside_if_long(len(tail), lambda: jobs_of_text(self.engine, text_jobs), submit)

    def send_trace(self, seq: int) -> None:
        """The recording so far, as a frame tail; the socket takes it at its own pace (poll)."""
        sizes, n_dropped, tail = encode_trace(self.engine.trace_stop())
        self.send({"op": "trace", "seq": seq, "chunks": sizes, "n_dropped": n_dropped}, tail)

    # ---- to the daemon ---------------------------------------------------------------------------

    def send(self, message: dict, tail: bytes = b"") -> None:
        self.engine.send_frame(frame(message, tail))

    def forward_events(self) -> None:
        # Most steps' events left the engine thread on their own (frame_sink.h); what it left
        # here is a step that ended a request, or one behind bytes the socket had not taken.
        if self.tensor:
            self.check_tensor_group()
        if self.engine.relay_events():
            self.send_stats()                  # a request ended: its counts follow its end

    def check_tensor_group(self) -> None:
        """A tensor split's leader whose group failed ends here: its requests' error events stay
        unsent, so the daemon ends them as a lost node's (503) and places the model again."""
        from . import accel
        lost = self.engine.tensor_lost or (accel.tp_failed() and f"the tensor-parallel group failed: "
                                                                  f"{accel.tp_error()}")
        if lost:
            self.engine.flush_sink()           # the steps before the loss, as far as the socket takes them
            print(f"stackd worker: {lost}", file=sys.stderr, flush=True)
            os._exit(EXIT_TENSOR_PEER_LOST)

    def send_stats(self) -> None:
        stats = self.engine.stats()
        if self.tensor:                        # the exchanges a tensor split's steps made (/metrics)
            from . import accel
            counters = accel.tp_counters()
            stats.update(tensor_exchanges=counters["exchanges"], tensor_exchange_bytes=counters["bytes_sent"],
                         tensor_exchange_seconds=counters["exchange_us"] / 1e6)
        self.send({"op": "stats", "stats": stats, "metrics": self.engine.metrics()})

    def flush(self) -> None:
        self.engine.flush_sink()

    # ---- the loop -------------------------------------------------------------------------------

    def serve(self) -> None:
        poller = select.poll()
        sock_fd, events_fd = self.sock_fd, self.engine.fileno()
        poller.register(events_fd, select.POLLIN)
        poller.register(self.wake_read, select.POLLIN)
        next_stats = time.monotonic()
        watching = None
        while self.running:
            now = time.monotonic()
            if now >= next_stats:              # the first at once: /metrics has every series
                if self.tensor:
                    self.check_tensor_group()  # a link may fail between requests too
                self.send_stats()
                next_stats = now + STATS_INTERVAL
            wanted = select.POLLIN | (select.POLLOUT if self.engine.sink_pending() else 0)
            if wanted != watching:             # the mask rarely changes: no work a token
                poller.register(sock_fd, wanted)
                watching = wanted
            for fd, _ in poller.poll(STATS_INTERVAL * 1000):
                if fd == events_fd:
                    self.forward_events()
                elif fd == self.wake_read:
                    self.send_answers()
                elif not self.receive():
                    return                     # the daemon closed its end: nothing to serve
            self.flush()

    def receive(self) -> bool:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return True
        except ConnectionError:
            return False
        if not data:
            return False
        for message, tail in self.reader.feed(data):
            self.handle(message, tail)
        return True


def sampling_of(fields: dict):
    from .core import SamplingParams
    sampling = SamplingParams()
    for name, value in fields.items():
        setattr(sampling, name, value)
    return sampling


def shard_runs(engine) -> tuple[int, int] | None:
    """A shard's chunked-form runs, from the whole model's widths it records (cluster/shard.py's
    runs_of reads the same keys from a file); None for a whole model."""
    from . import accel

    def number(key: str) -> int:
        value = engine.meta(key)
        return int(value) if value.isdigit() else 0

    return accel.shard_runs(number("stackd.shard.q_total"), number("stackd.shard.ffn_total"))


def main(fd: int, parent: int) -> int:
    die_with_parent(parent)
    use_standard_json()                            # orjson's imports: ~1.3 MiB of a worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the daemon's terminal: the daemon decides
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    # The C socket type that socket.socket wraps: the socket module turns hundreds of constants
    # into enums at import (~0.3 MB of a worker's memory, measured), and nothing here needs them.
    sock = _socket.socket(fileno=fd)
    # llama.cpp from the very file the daemon maps (engine/core.py), so the two
    # processes share its code pages: the wheel ships libllama.so and .so.0 as two copies.
    # Loaded before the start message: a spare worker (runtime/worker_process.py) has it
    # loaded by the time its model is chosen.
    from .core import Engine, template_facts
    from . import accel
    reader, frames, fds = receive_start(sock)
    if not frames:
        return 1
    config = frames[0][0]
    tensor = config.get("tensor")
    if not tensor:
        for extra in fds:                          # none is expected: none is kept
            os.close(extra)
    faults = Faults(**config.get("faults", {}))    # a test configuration's (server/faults.py)
    if faults.worker_crashes():
        os.abort()                                 # a crash loop

    os.nice(config.get("nice", 0))                 # engine.embedding_nice: this worker's threads too
    try:
        # both before the model loads
        accel.commit_on_write(config.get("kv_commit", "lazy"))
        accel.register(config.get("kernels", "off"), config.get("batch_invariant", False))
        faults.in_worker(accel)
        params = accel.keyed(dict(config["engine"], rpc_endpoints=connect_devices(config.get("rpc"))))
        if tensor:
            join_tensor_group(tensor, mesh_listener(sock, tensor, fds))
            params.update(tp_rank=int(tensor["rank"]), tp_size=int(tensor["size"]))
        engine = Engine(**params)
        faults.in_engine(engine)
        runs = shard_runs(engine) if accel.registered() is not None and tensor else None
        if runs:
            accel.set_runs(*runs)
    except Exception as exc:                        # a model that does not load: say why, exit
        failed = {"op": "failed", "error": str(exc)}
        if config.get("rpc"):                       # relay.py only where a placement dials one
            from ..system.relay import RelayError
            if isinstance(exc, RelayError):         # a node of the placement does not answer
                failed["code"] = "peer_unreachable"
        if tensor:
            numpy_for_mesh()
            from .exchange.mesh import ExchangeError
            if isinstance(exc, ExchangeError):      # a peer of the group did not join the mesh
                failed["code"] = "peer_unreachable"
        sock.sendall(frame(failed))
        return 2
    sock.sendall(frame({"op": "ready", "facts": {
        "n_vocab": engine.n_vocab, "n_embd": engine.n_embd, "n_ctx_train": engine.n_ctx_train,
        "n_slots": engine.n_slots, "n_ctx_seq": engine.n_ctx_seq, "pid": os.getpid(),
        "kernels": accel.report(), **template_facts(engine)}}))
    from ..system.memory import release_free_heap
    release_free_heap()                            # what loading freed, once the model serves
    if tensor and int(tensor["rank"]) > 0:
        return follow(engine)                      # a follower has no requests: it mirrors rank 0
    sock.setblocking(False)
    worker = Worker(sock, engine)
    worker.tensor = bool(tensor)
    worker.reader = reader
    for message, tail in frames[1:]:
        worker.handle(message, tail)
    try:
        worker.serve()
    finally:
        worker.close_beside()
        engine.close()
        worker.forward_events()
        worker.send({"op": "closed"})
        drain(sock.fileno(), engine)
    return 0


def drain(fd: int, engine) -> None:
    """Everything still waiting in the sink, before the worker exits (a daemon that stopped
    reading gets ten seconds, then the bytes are lost with the process)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + 10.0
    while engine.flush_sink() and not engine.sink_broken() and time.monotonic() < deadline:
        poller.poll(100)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
