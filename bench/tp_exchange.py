"""The tensor split's exchange alone: the round trip of one all-reduce of a 576-value vector
(SmolLM2's hidden size, one token's partial sum, float64: 4,608 bytes each way) between node processes,
over loopback and over a veth link between network namespaces, against a plain TCP ping-pong
of the same bytes on the same link (no handshake, no tags, no sums): what the exchange's
protocol costs over the link itself. This is the link model the planner will use: a tensor
split's step costs 2 x layers + 2 of these exchanges on top of its compute.

    .venv/bin/python bench/tp_exchange.py [--nodes 2] [--floats 576] [--count 2000] [--rounds 3]
                                          [--links loopback,netns] [--pin] [--native] [--spin US]

Each node is a process of its own (python, server/engine/exchange/mesh.py: the reference
implementation, with Python's costs per exchange). `--native` adds the rows of the exchange the
engine runs: the same mesh handed to the kernels' library (accel.tp_attach), each all-reduce
timed inside it in C++ (kernels/src/tp.h, stackd_tp_time_allreduce), with --spin microseconds of
polling before it sleeps. Rounds alternate the links; each row gives
the median over the rounds of each round's median and 99th percentile, with the range of the
medians. `--pin` puts node i on CPU i (mod the cores). netns needs root.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

from stackd.engine.exchange import Mesh, listen

PORT = 47611                      # in namespaces: every node listens here on its own addresses
WARMUP = 200


# ---- one node (a child process) -------------------------------------------------------------------

def node_main(args) -> None:
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    addresses = [(host, int(port)) for host, port in (a.rsplit(":", 1) for a in args.addresses.split(","))]
    index = args.node
    listener = listen(args.bind, addresses[index][1]) if index < len(addresses) - 1 else None
    vector = np.random.default_rng(index).standard_normal(args.floats)      # float64, as partial sums travel
    out = {}
    if args.mode == "exchange":
        mesh = Mesh(index, addresses, bytes.fromhex(args.secret), "bench", listener, deadline=10.0,
                    spin_us=args.spin)
        mesh.connect(timeout=30.0)
        times = []
        for step in range(WARMUP + args.count):
            t0 = time.perf_counter_ns()
            mesh.allreduce(step, vector)
            times.append(time.perf_counter_ns() - t0)
        mesh.close()
        out["us"] = [t / 1000 for t in times[WARMUP:]]
    elif args.mode == "native":
        import ctypes

        from stackd.cluster.shard import vocab_cut
        from stackd.engine import accel
        mesh = Mesh(index, addresses, bytes.fromhex(args.secret), "bench", listener)
        mesh.connect(timeout=30.0)
        if accel.register("auto") is None:
            sys.exit("--native: the kernels do not register on this CPU")
        n = len(addresses)
        accel.tp_attach(index, [mesh.links[i].sock if i != index else None for i in range(n)],
                        [mesh.links[i].key if i != index else None for i in range(n)],
                        vocab_cut(49152, [1.0] * n), deadline_ms=10_000, spin_us=int(args.spin))
        mesh.close()
        lib = accel.library()
        lib.stackd_tp_time_allreduce.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_double)]
        times = (ctypes.c_double * (WARMUP + args.count))()
        if lib.stackd_tp_time_allreduce(args.floats, WARMUP + args.count, times) != 0:
            sys.exit(f"--native: {accel.tp_error()}")
        accel.tp_detach()
        out["us"] = list(times)[WARMUP:]
    else:                                       # ping-pong: node 0 sends, node 1 echoes
        payload = vector.tobytes()
        if index == 0:
            sock = None
            deadline = time.monotonic() + 30
            while sock is None:
                try:
                    sock = socket.create_connection(addresses[1], timeout=30)
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = bytearray(len(payload))
            times = []
            for _ in range(WARMUP + args.count):
                t0 = time.perf_counter_ns()
                sock.sendall(payload)
                _recv_into(sock, buf)
                times.append(time.perf_counter_ns() - t0)
            out["us"] = [t / 1000 for t in times[WARMUP:]]
        else:
            server = listen(args.bind, addresses[1][1])
            sock, _ = server.accept()
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = bytearray(len(payload))
            for _ in range(WARMUP + args.count):
                _recv_into(sock, buf)
                sock.sendall(buf)
        sock.close()
    print(json.dumps(out), flush=True)


def _recv_into(sock: socket.socket, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < len(buf):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("closed")
        got += n


# ---- the driver -----------------------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    socks = [listen("127.0.0.1", 0) for _ in range(n)]
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Links:
    """Where node i listens and how node j reaches it, per kind of link."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n, self.topology = kind, n, None
        if kind == "loopback":
            ports = free_ports(n)
            self.views = [[("127.0.0.1", p) for p in ports] for _ in range(n)]
            self.netns = [None] * n
            self.bind = ["127.0.0.1"] * n
            return
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/
        from testing import netns as topology
        reason = topology.available()
        if reason:
            sys.exit(f"netns: {reason}")
        topology.sweep()
        self.topology = topology.Topology()
        self.netns = [self.topology.add_node(f"x{i}")[0] for i in range(n)]
        self.views = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                a, b = self.topology.connect(self.netns[i], self.netns[j])
                self.views[i][j], self.views[j][i] = (b, PORT), (a, PORT)
        for i in range(n):
            self.views[i][i] = ("0.0.0.0", PORT)
        self.bind = ["0.0.0.0"] * n

    def close(self) -> None:
        if self.topology is not None:
            self.topology.close()


def run_round(links: Links, mode: str, args) -> list[float]:
    nodes = 2 if mode == "pingpong" else links.n
    secret = os.urandom(32).hex()
    procs = []
    for i in range(nodes):
        command = [sys.executable, os.path.abspath(__file__), "--node", str(i), "--mode", mode,
                   "--addresses", ",".join(f"{h}:{p}" for h, p in links.views[i][:nodes]),
                   "--bind", links.bind[i], "--secret", secret, "--floats", str(args.floats),
                   "--count", str(args.count), "--spin", str(args.spin)]
        if args.pin:
            command += ["--cpu", str(i % os.cpu_count())]
        if links.netns[i] is not None:
            command = ["ip", "netns", "exec", links.netns[i], *command]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    outs = [json.loads(p.communicate(timeout=600)[0] or "{}") for p in procs]
    if any(p.returncode for p in procs):
        sys.exit(f"{mode} over {links.kind}: a node failed")
    return outs[0]["us"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--floats", type=int, default=576)
    parser.add_argument("--count", type=int, default=2000, help="exchanges per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--links", default="loopback,netns")
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--native", action="store_true",
                        help="also the kernels' C++ exchange (the engine's), on the same mesh")
    parser.add_argument("--spin", type=float, default=0.0,
                        help="microseconds an exchange tries its sockets before sleeping in poll")
    # a node's own arguments (the driver starts it)
    parser.add_argument("--node", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="exchange", help=argparse.SUPPRESS)
    parser.add_argument("--addresses", help=argparse.SUPPRESS)
    parser.add_argument("--bind", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--secret", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.node is not None:
        node_main(args)
        return
    kinds = args.links.split(",")
    links = {kind: Links(kind, args.nodes) for kind in kinds}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for round_ in range(args.rounds):
            for kind in kinds:
                for mode in ("pingpong", "exchange", *(("native",) if args.native else ())):
                    us = run_round(links[kind], mode, args)
                    q = statistics.quantiles(us, n=100, method="inclusive")
                    results.setdefault((kind, mode), []).append((statistics.median(us), q[98]))
                    print(f"  round {round_ + 1} {kind:9s} {mode:9s} median {statistics.median(us):7.1f} us  "
                          f"p99 {q[98]:7.1f} us", flush=True)
    finally:
        for link in links.values():
            link.close()
    print(f"\nall-reduce of {args.floats} float64 ({args.floats * 8} bytes each way) over {args.nodes} nodes, "
          f"{args.count} exchanges a round, medians of {args.rounds} alternating rounds"
          f"{', a core per node' if args.pin else ''}{f', spinning {args.spin:g} us' if args.spin else ''}; ping-pong: the same bytes there and back, plain TCP, 2 nodes")
    for (kind, mode), rows in results.items():
        medians = [m for m, _ in rows]
        print(f"  {kind:9s} {mode:9s} {statistics.median(medians):7.1f} us [{min(medians):.1f}-{max(medians):.1f}]"
              f"  p99 {statistics.median(p for _, p in rows):7.1f} us")


if __name__ == "__main__":
    main()
