"""What a split over ggml RPC costs per step, and where it goes. Engine level, no HTTP:
SmolLM2 (30 layers), our kernels on both nodes (the follower's RPC server serves our device),
one thread per node, loopback, the rows of bench/cluster_pipeline.py's `measure` (16 clients of
64 greedy tokens, then one client):

  1 node               every layer on the worker's CPU
  layer, direct        the follower's RPC server reached without its relay (what the relay's
                       cost is measured against: no relay at all)
  layer, native relay  through the relay and the dialer, bytes pumped by native/splice.cpp
  layer, python relay  the same with STACKD_RELAY=python: Python threads copy (before)

(llama.cpp's tensor split over RPC, measured here until 2026-11-28 (bench/README.md, "What changed"), is gone: a
tensor split is now a shard per node with its own exchange, bench/cluster.py's tensor rows.)

    .venv/bin/python bench/rpc_split.py [--rounds 3] [--pin] [--follower-layers 11]
                                        [--rows layer-direct,layer-native,...] [--tap]

--pingpong: no engine; the relay alone, in one process: a layer split's per-step exchange (5 KiB
to the follower, 198 KiB of logits back, bench --tap) through dialer and relay to an
answering server, direct / Python pump / native pump, medians of 400 exchanges.
--tap: no timing table; one stream of 32 tokens through a Python tap in front of each RPC
server that parses ggml's RPC protocol, and per decode step: commands by type, round trips
(commands the client waits an answer for), bytes each way. --pin: the leader's processes on
CPU 0, the follower's on CPU 1 (as cluster_pipeline.py). Figures on a shared machine move by
tens of percent: compare rows of one run.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import socket
import statistics
import struct
import tempfile
import threading
import time
from collections import Counter

import uvloop

import cluster_pipeline as pipeline
from stackd.engine.core import SamplingParams
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.rpc_workers import Peers, chat_prompt, engine_params, start_worker  # noqa: E402

N_LAYER = 30
# ggml-rpc.cpp's rpc_cmd, in order; the ones whose answer the client waits for are round trips.
COMMANDS = ["ALLOC_BUFFER", "GET_ALIGNMENT", "GET_MAX_SIZE", "BUFFER_GET_BASE", "FREE_BUFFER", "BUFFER_CLEAR",
            "SET_TENSOR", "SET_TENSOR_HASH", "GET_TENSOR", "COPY_TENSOR", "GRAPH_COMPUTE", "GET_DEVICE_MEMORY",
            "INIT_TENSOR", "GET_ALLOC_SIZE", "HELLO", "DEVICE_COUNT", "GRAPH_RECOMPUTE", "MEMSET_TENSOR"]
NO_ANSWER = {"SET_TENSOR", "GRAPH_COMPUTE", "GRAPH_RECOMPUTE", "FREE_BUFFER", "BUFFER_CLEAR", "INIT_TENSOR",
             "MEMSET_TENSOR"}


def split_params(follower_layers: int) -> dict:
    return dict(split_mode=1, tensor_split=[float(follower_layers + 1)], n_gpu_layers=follower_layers + 1)


class Tap:
    """127.0.0.1:<port> in front of an RPC server: forwards both ways, parses what the client
    sends (command byte, 8-byte size, payload) and counts it."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self.commands, self.bytes_out, self.bytes_in = Counter(), 0, 0
        self.command_bytes = Counter()
        self.graph_nodes = []
        threading.Thread(target=self._accept, daemon=True).start()

    def snapshot(self):
        return Counter(self.commands), self.bytes_out, self.bytes_in, Counter(self.command_bytes)

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._back, args=(server, client), daemon=True).start()
            threading.Thread(target=self._forth, args=(client, server), daemon=True).start()

    def _back(self, src, dst):
        try:
            while data := src.recv(1 << 20):
                self.bytes_in += len(data)
                dst.sendall(data)
        except OSError:
            pass
        self._end(src, dst)

    @staticmethod
    def _end(*socks):
        """One side ended: so does the other (ggml's server serves one client at a time)."""
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _forth(self, src, dst):
        def exactly(n):
            buf = bytearray()
            while len(buf) < n:
                chunk = src.recv(min(n - len(buf), 1 << 20))
                if not chunk:
                    raise EOFError
                buf += chunk
            return bytes(buf)
        try:
            while True:
                head = exactly(9)
                cmd, size = struct.unpack("<BQ", head)
                payload = exactly(size)
                name = COMMANDS[cmd] if cmd < len(COMMANDS) else str(cmd)
                self.commands[name] += 1
                if name == "GRAPH_COMPUTE" and size >= 8:
                    self.graph_nodes.append(struct.unpack_from("<I", payload, 4)[0])
                self.bytes_out += 9 + size
                self.command_bytes[name] += 9 + size
                dst.sendall(head + payload)
        except (EOFError, OSError):
            pass
        self._end(src, dst)


async def tap(follower_layers: int, tokens: int = 32) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-rpc-tap-"), kernels="auto")
    children = [await peers.start(direct=True)]
    taps = [Tap(c.port) for c in children]
    rpc = {"secret": "", "peers": [{"host": "127.0.0.1", "port": t.port, "relay": False} for t in taps]}
    runner = await start_worker(loop, engine_params(**split_params(follower_layers)), rpc, kernels="auto")
    try:
        sampling = SamplingParams()
        sampling.temperature, sampling.ignore_eos = 0.0, True
        prompt = await chat_prompt(runner, "Tell me a story.")

        async def one(n):
            stream = await runner.generate([(prompt, n, sampling)], [])
            return sum([event.n_tokens async for event in stream])
        await one(4)                                        # warm: buffers allocated, graphs built
        await one(1)                                        # the prompt's step alone, to subtract
        before = [t.snapshot() for t in taps]
        start = time.monotonic()
        n = await one(1 + tokens)
        wall = time.monotonic() - start
        print(f"layer split, one stream, {tokens} decode steps (+ the prompt's), {wall / n * 1e3:.1f} ms/token:")
        for i, (t, (c0, o0, i0, b0)) in enumerate(zip(taps, before)):
            c1, o1, i1, b1 = t.snapshot()
            per = {k: (c1[k] - c0[k]) / tokens for k in c1 if c1[k] - c0[k]}
            trips = sum(v for k, v in per.items() if k not in NO_ANSWER)
            print(f"  server {i}: per step {trips:.1f} round trips, {(o1 - o0) / tokens / 1024:.1f} KiB out, "
                  f"{(i1 - i0) / tokens / 1024:.1f} KiB back; commands "
                  + ", ".join(f"{k} {v:.1f} ({(b1[k] - b0[k]) / tokens / 1024:.1f} KiB)"
                            for k, v in sorted(per.items(), key=lambda kv: -kv[1])))
            if t.graph_nodes:
                print(f"            graphs: {len(t.graph_nodes)} in all, last nodes per graph {t.graph_nodes[-8:]}")
    finally:
        await runner.close()
        peers.servers.stop_all()


def pingpong(rounds: int = 3, n: int = 400) -> None:
    from stackd._engine import splice as native
    from stackd.system import relay
    secret, out, back = os.urandom(32), b"x" * 5 * 1024, b"y" * 198 * 1024

    def listener():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        return sock

    def answer(sock):
        conn, _ = sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while True:
            got = 0
            while got < len(out):
                chunk = conn.recv(65536)
                if not chunk:
                    return
                got += len(chunk)
            conn.sendall(back)

    def run(splice, direct):
        upstream = listener()
        threading.Thread(target=answer, args=(upstream,), daemon=True).start()
        port = upstream.getsockname()[1]
        if not direct:
            public = listener()
            threading.Thread(target=relay.Relay(public, port, secret, "p", splice=splice).serve_forever,
                             daemon=True).start()
            dialer = relay.Dialer("127.0.0.1", public.getsockname()[1], secret, "p", splice=splice)
            threading.Thread(target=dialer._accept, daemon=True).start()
            port = dialer.port
        client = socket.create_connection(("127.0.0.1", port))
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf, times = bytearray(len(back)), []
        view = memoryview(buf)
        for _ in range(n):
            start = time.perf_counter()
            client.sendall(out)
            got = 0
            while got < len(buf):
                got += client.recv_into(view[got:])
            times.append(time.perf_counter() - start)
        client.close()
        return statistics.median(times) * 1e6

    for r in range(rounds):
        for name, splice, direct in (("direct", None, True), ("python relay", None, False),
                                     ("native relay", native, False)):
            print(f"round {r + 1}, {name:13s}: {run(splice, direct):7.1f} us per step exchange", flush=True)
    os._exit(0)          # the pumps' threads are still in their sockets: no interpreter teardown


async def main(rounds: int, follower_layers: int, rows: list[str]) -> None:
    loop = asyncio.get_running_loop()
    peers = Peers(loop, tempfile.mkdtemp(prefix="stackd-rpc-split-"), kernels="auto")
    pipeline.kernels = "auto"

    async def one_node():
        return await pipeline.measure(loop, engine_params())

    def split(mode: str, relay: str):
        async def run():
            os.environ.pop("STACKD_RELAY", None)
            if relay == "python":
                os.environ["STACKD_RELAY"] = "python"          # read by the child and the worker
            started = []
            try:
                started.append(await peers.start(direct=relay == "direct"))
                return await pipeline.measure(loop, engine_params(**split_params(follower_layers)),
                                              [peers.rpc(started)], started[-1:])
            finally:
                os.environ.pop("STACKD_RELAY", None)
                for child in started:
                    await peers.servers.stop(child.placement_id)
        return run

    table = {"one-node": ("1 node", one_node),
             "layer-direct": ("layer, direct", split("layer", "direct")),
             "layer-native": ("layer, native relay", split("layer", "native")),
             "layer-python": ("layer, python relay", split("layer", "python"))}
    chosen = [table[r] for r in ["one-node"] + [r for r in rows if r != "one-node"]]
    try:
        results = await pipeline.in_rounds(chosen, rounds)
        base = pipeline.medians(results["1 node"])
        print(f"medians of {rounds} round(s), follower {follower_layers} layers + output (layer split), "
              f"kernels auto on both nodes, pin {pipeline.pin or 'no'}:")
        for name, _ in chosen:
            many, single = pipeline.medians(results[name])
            print(f"  {name:22s} c={pipeline.CLIENTS}: {many:6.1f} tok/s ({many / base[0]:.2f}x)   "
                  f"c=1: {single:6.1f} tok/s ({single / base[1]:.2f}x), {1e3 / single:6.2f} ms/step", flush=True)
    finally:
        peers.servers.stop_all()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--follower-layers", type=int, default=15)
    parser.add_argument("--rows", default="layer-direct,layer-native,layer-python")
    parser.add_argument("--tap", action="store_true")
    parser.add_argument("--pingpong", action="store_true")
    parser.add_argument("--pin", nargs="?", const="all", default="", choices=["all", "compute"])
    args = parser.parse_args()
    pipeline.pin = args.pin
    if args.pingpong:
        pingpong(args.rounds)
    elif args.tap:
        uvloop.run(tap(args.follower_layers))
    else:
        uvloop.run(main(args.rounds, args.follower_layers, [r for r in args.rows.split(",") if r]))
