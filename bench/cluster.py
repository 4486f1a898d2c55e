"""A model over several nodes (ggml RPC on loopback): decode tokens/s with one client and with
16, one node against two nodes with layer split (the leader's layers on its CPU, or with
`pipeline` on its own loopback RPC server, where llama.cpp's pipeline parallelism turns on)
and with tensor split, and against llama.cpp's
own `llama-server --rpc` over the same kind of RPC server; then the time from a follower's
death to the first 503 a streaming client sees (kill -9 of the follower daemon and its RPC
server), and from its freezing (SIGSTOP of both) to that 503.

    .venv/bin/python bench/cluster.py [--clients 16] [--seconds 20] [--threads 1] [--followers real] [--netns]
                                      [--pin] [--balanced 18,12] [--rows '1 node,2 nodes layer'] [--no-node-loss]
    .venv/bin/python bench/cluster.py --tensor 5 --pin --seconds 10 --kernels auto [--netns] [--trace] [--free-links]

One thread per node. The follower is a second daemon on this machine (`--followers real`, the
default: its own data dir, on 127.0.0.2, the cluster secret; it starts its RPC server child when
the leader asks), or simulated (`--followers simulated`: testing/serve.py's --loopback-peers, the
leader starts the RPC server child, behind its relay, as a follower would; no freeze is measured
then). Either way "two nodes" share this machine's cores: on a 2-core machine, 1 thread each is
the fair setting. `--netns` (root; real followers): the leader and the follower each in a
network namespace of its own, joined by a veth link that the RPC traffic crosses (the bench's
clients run in the leader's namespace); llama-server --rpc there reaches the same kind of RPC
server child in the follower's namespace through a plain forwarder (one pipe, as our relay,
without the handshake). `--pin` (real followers, two or more cores) gives each node a core of
its own: the leader's processes (daemon, worker; llama-server) on CPU 0, the follower's (daemon,
RPC server child; llama-server's rpc server) on CPU 1, the bench's clients where the kernel puts
them. `--balanced L,F` adds a layer split with those layer counts (`options.layers`) and two
lanes (`options.lanes`), the in-engine pipeline: the follower
also computes the output layer, several layers' worth on this model, so halves of the layers are
not halves of the work. "2 nodes layer" is the default placement over the two nodes (real
followers: once both have measured their compute, so its counts follow compute and it takes
a lane per node, docs/cluster.md), "2 nodes layer 1 lane" the same counts with one lane.
`--rows` runs only the rows named. With --pin, each --replicas/--tensor round first says how
fast CPUs 0 and 1 compute and read memory when both are busy, against one alone
(cores_together): two nodes on one machine share its memory, which a single stream's decode
is bound by, and a host may run the two vCPUs on one physical core. `--trace` adds the leader engine's step phases (decode,
sample, the gap between steps) for each c=1 row. `--free-links` measures the tensor split's
ceiling on this machine: every node computes its shard and no partial sum or logits row goes on
the wire (wrong answers; the memory the nodes share, the per-layer work and the daemons' still
in it), so what the exchanges cost is the split's rows against it. Same
model (SmolLM2-135M Q4_1, 30 layers), same requests as bench/inference.py (a fixed prompt,
128 tokens each, end of generation suppressed, greedy).
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager

import orjson

import loadgen
from inference import PROMPT, Server, body, free_port, row, spawn_stackd

from stackd.store import defaults
from stackd.store.store import ModelStore
from stackd.system import relay
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing import netns as topology  # noqa: E402
from testing.cluster_nodes import Node  # noqa: E402
from testing.netns import CLUSTER_PORT, INFERENCE_PORT  # noqa: E402
from testing.processes import cpu_seconds, pin_tree, process_tree, rpc_server_pids  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FOLLOWER = "f1"                        # the simulated follower's id
MODEL_FILE_NAME = "bench-model"        # --model-file's name in both stores
OFFER_MIB = 2000                       # leader and follower offer the same: a 15 / 15 layer split
SECRET = os.urandom(16).hex()
FOLLOWER_HOST = "127.0.0.2"
LEADER_CPUS, FOLLOWER_CPUS = {0}, {1}   # --pin


def start_stackd(slots: int, context: int, threads: int, kernels: str, peers: str, env: dict | None = None,
                 injected: dict | None = None) -> Server:
    return spawn_stackd(f"[http]\naccess_log = false\n[rate_limits]\ninference = 0\ncluster = 0\n"
                        f"[engine]\nslots = {slots}\ncontext_length = {context}\nthreads = {threads}\n"
                        f"kernels = \"{kernels}\"\n"
                        f"[models]\npreload = []\nmemory_reserve_mb = 0\nmemory_limit_mb = {OFFER_MIB}\n",
                        prefix="stackd-cluster-bench-", env=env,
                        injected={"loopback_peers": peers, **(injected or {})})


def call(server: Server, method: str, path: str, payload: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    conn.request(method, path, body=orjson.dumps(payload) if payload is not None else None,
                 headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    answer = orjson.loads(response.read())
    conn.close()
    return response.status, answer


def load(server: Server, **options) -> dict:
    status, answer = call(server, "POST", "/v1/models/load", {"model": server.model, "options": options})
    if status != 200:
        sys.exit(f"load {options}: {status} {answer}")
    return answer


def leader_id(server: Server) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=60)
    conn.request("GET", "/v1/topology", headers={"Authorization": f"Bearer {server.key}"})
    leader = orjson.loads(conn.getresponse().read())["leader"]
    conn.close()
    return leader


def wait_measured(server: Server) -> dict[str, float]:
    """Every node's compute figure (/v1/nodes), once each has measured it: a split placed before
    that follows memory, with one lane (docs/cluster.md, "Compute, measured")."""
    deadline = time.monotonic() + 120
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=60)
        conn.request("GET", "/v1/nodes", headers={"Authorization": f"Bearer {server.key}"})
        nodes = orjson.loads(conn.getresponse().read()).get("data", [])
        conn.close()
        computes = {n["id"]: n.get("compute", 0) for n in nodes}
        if (len(computes) > 1 and all(computes.values())) or time.monotonic() > deadline:
            return computes
        time.sleep(0.2)


def rpc_child(marker: bytes) -> int:
    """The RPC server child whose command line holds `marker` (its cache dir names its node)."""
    pids = rpc_server_pids(marker)
    if not pids:
        sys.exit(f"no RPC child with {marker!r}")
    return pids[0]


class Namespaces:
    """--netns: the leader's and the follower's network namespaces, on one veth link."""

    def __init__(self):
        reason = topology.available()
        if reason:
            sys.exit(f"--netns: {reason}")
        topology.sweep()
        self.net = topology.Topology()
        self.leader_ns = self.net.add_node("leader")[0]
        self.follower_ns = self.net.add_node("follower")[0]
        self.leader_ip, self.follower_ip = self.net.connect(self.leader_ns, self.follower_ns)


class NamespacedLeader:
    """The leader daemon in its namespace, where the bench's clients run too, as a Server."""

    def __init__(self, net: Namespaces, slots: int, context: int, threads: int, kernels: str,
                 env: dict | None = None, injected: dict | None = None):
        self.data = tempfile.mkdtemp(prefix="stackd-cluster-bench-")
        self.node = Node(os.path.join(self.data, "data"), host="0.0.0.0", secret=SECRET,
                         advertise=f"http://{net.leader_ip}:{CLUSTER_PORT}", ports=(INFERENCE_PORT, CLUSTER_PORT),
                         env={"STACKD_ENGINE_SLOTS": str(slots), "STACKD_ENGINE_CONTEXT_LENGTH": str(context),
                              "STACKD_ENGINE_THREADS": str(threads), "STACKD_ENGINE_KERNELS": kernels,
                              "STACKD_RATE_LIMITS_INFERENCE": "0", "STACKD_RATE_LIMITS_CLUSTER": "0",
                              "STACKD_MODELS_MEMORY_RESERVE_MB": "0", "STACKD_MODELS_MEMORY_LIMIT_MB": str(OFFER_MIB),
                              **(env or {})}, injected=injected)
        self.port, self.cluster_port, self.key = INFERENCE_PORT, CLUSTER_PORT, self.node.admin_key
        self.model = defaults.CHAT_MODEL

    def stop(self) -> None:
        self.node.stop()


class RealFollower:
    """A follower daemon that offers as much as the leader, with its RPC children: on 127.0.0.2,
    or in its namespace across the link from the leader's."""

    def __init__(self, leader: Server, threads: int, net: Namespaces | None = None):
        self.data = tempfile.mkdtemp(prefix="stackd-cluster-bench-follower-")
        if net is None:
            where = {"host": FOLLOWER_HOST, "reach": FOLLOWER_HOST, "leader": f"http://127.0.0.1:{leader.cluster_port}"}
        else:
            where = {"host": "0.0.0.0", "reach": net.follower_ip, "netns": net.follower_ns,
                     "advertise": f"http://{net.follower_ip}:{CLUSTER_PORT}", "ports": (INFERENCE_PORT, CLUSTER_PORT),
                     "leader": f"http://{net.leader_ip}:{CLUSTER_PORT}"}
        self.node = Node(os.path.join(self.data, "data"), role="follower", secret=SECRET, **where, env={
            "STACKD_ENGINE_THREADS": str(threads), "STACKD_MODELS_MEMORY_RESERVE_MB": "0",
            "STACKD_MODELS_MEMORY_LIMIT_MB": str(OFFER_MIB)})
        self.id = self.node.node_id
        deadline = time.monotonic() + 60
        while statuses_of(leader).get(self.id) != "up":
            if time.monotonic() > deadline:
                sys.exit("the follower did not join the leader")
            time.sleep(0.05)

    def rpc_child(self) -> int:
        return rpc_child(os.path.join(self.data, "data", "rpc-cache").encode())

    def kill(self) -> None:
        """kill -9 of the node: its daemon and its RPC server child."""
        child = self.rpc_child()
        self.node.proc.send_signal(signal.SIGKILL)
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass                                       # gone with its parent already

    def freeze(self) -> list[int]:
        frozen = [self.node.proc.pid, self.rpc_child()]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        return frozen

    def stop(self) -> None:
        if self.node.proc.poll() is None:
            self.node.proc.send_signal(signal.SIGCONT)
        self.node.kill()
        shutil.rmtree(self.data, ignore_errors=True)


def statuses_of(server: Server) -> dict[str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=60)
    conn.request("GET", "/v1/topology", headers={"Authorization": f"Bearer {server.key}"})
    nodes = orjson.loads(conn.getresponse().read())["nodes"]
    conn.close()
    return {n["id"]: n["status"] for n in nodes}


def start_rpc_server(threads: int, netns: str | None = None) -> tuple[subprocess.Popen, int]:
    """ggml's RPC server as our children run it (direct: 127.0.0.1, no relay), for llama-server;
    in `netns` when given."""
    where = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*where, sys.executable, "-m", "stackd.cluster.rpc_server", "--direct", "--threads",
                             str(threads), "--placement-id", "bench", "--parent", str(os.getpid())],
                            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write(b"\n")
    proc.stdin.close()
    line = proc.stdout.readline().decode()
    if not line.startswith("ready "):
        sys.exit(f"rpc server: {line!r}")
    return proc, int(line.split()[1])


def forward_across(net: Namespaces, upstream_port: int) -> int:
    """A plain forwarder on the follower's link address to its namespace's 127.0.0.1:upstream_port
    (llama-server's RPC client cannot prove the secret to a relay): the same copying as our
    relay, without the handshake. Returns its port."""
    listener = topology.inside(net.follower_ns, socket.create_server, (net.follower_ip, 0))

    def accept():
        while True:
            conn, _ = listener.accept()
            upstream = topology.inside(net.follower_ns, socket.create_connection, ("127.0.0.1", upstream_port))
            relay.tune(conn)
            relay.tune(upstream)
            threading.Thread(target=relay.pipe, args=(conn, upstream), daemon=True).start()
    threading.Thread(target=accept, daemon=True, name="rpc forwarder").start()
    return listener.getsockname()[1]


def start_llama_server_rpc(binary: str, slots: int, context: int, threads: int, rpc_port: int,
                           rpc_host: str = "127.0.0.1") -> Server:
    port = free_port()
    # 15 of 30 layers and the output on the RPC device (-ngl counts the output as a layer)
    return Server("llama-server --rpc", [binary, "-m", defaults.smollm2_path(), "--host", "127.0.0.1",
                                         "--port", str(port), "-np", str(slots), "-c", str(slots * context),
                                         "-t", str(threads), "-tb", str(threads), "--no-webui",
                                         "--rpc", f"{rpc_host}:{rpc_port}", "-ngl", "16"],
                  port, "smollm2")


class CpuUse:
    """Where the cores go during a measurement (--replicas): CPU seconds (user + system, every
    thread, from /proc) of each process of the leader's tree (its daemon, its engine worker), of
    the follower's (daemon, worker) and of this process (the load generator), as shares of one
    core over the wall time and per 1,000 tokens decoded."""

    def __init__(self, roots: dict[str, int]):
        self.roots = roots                      # name -> a daemon's pid

    def processes(self) -> dict[str, int]:
        """{'leader daemon': pid, 'leader worker': pid, ..., 'load generator': pid}"""
        out = {}
        for name, root in self.roots.items():
            tree = process_tree(root)
            out[f"{name} daemon"] = root
            for i, child in enumerate(tree[1:]):
                out[f"{name} worker" + (f" {i + 1}" if i else "")] = child
        out["load generator"] = os.getpid()
        return out

    def start(self) -> None:
        self.pids = self.processes()
        self.before = {name: self._cpu(pid) for name, pid in self.pids.items()}
        self.machine = machine_ticks()
        self.t0 = time.monotonic()

    def stop(self, tokens: int) -> dict[str, tuple[float, float]]:
        """name -> (share of a core, CPU seconds per 1,000 tokens); then the machine's: 'other
        processes' (every core's busy time not ours: the other jobs on this machine) and
        'steal' (time the hypervisor gave the cores to other guests)."""
        wall = time.monotonic() - self.t0
        out, ours = {}, 0.0
        for name, pid in self.pids.items():
            used = self._cpu(pid) - self.before[name]
            ours += used
            out[name] = (used / wall, used / max(tokens, 1) * 1000)
        busy, steal = (after - before for after, before in zip(machine_ticks(), self.machine))
        others = busy / os.sysconf("SC_CLK_TCK") - ours
        out["other processes"] = (others / wall, others / max(tokens, 1) * 1000)
        out["steal"] = (steal / os.sysconf("SC_CLK_TCK") / wall, 0.0)
        return out

    @staticmethod
    def _cpu(pid: int) -> float:
        try:
            return cpu_seconds([pid])
        except OSError:
            return 0.0


def machine_ticks() -> tuple[int, int]:
    """(busy, steal) clock ticks of every core so far, from /proc/stat's `cpu` line."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq, steal


def cpu_line(use: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{name} {share:.0%} ({per_k:.2f} s/1k tok)" for name, (share, per_k) in use.items())


def measure(server: Server, clients: int, seconds: float, max_tokens: int,
            cpu: CpuUse | None = None) -> loadgen.LoadResult:
    # warm up, two clients: with replicas, one request each way (one client warms the leader's alone)
    asyncio.run(loadgen.run(server.port, body(server.model, 8), 2, 2.0, server.key))
    if cpu is not None:
        cpu.start()
    result = asyncio.run(loadgen.run(server.port, body(server.model, max_tokens), clients, seconds, server.key))
    if cpu is not None:
        result.cpu = cpu.stop(result.tokens)
    return result


def time_to_first_503(server: Server, lose) -> float:
    """lose() the follower mid-stream; seconds until the stream's error event."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
    payload = {**body(server.model, 4000), "prompt": PROMPT}
    conn.request("POST", "/v1/completions", body=orjson.dumps(payload),
                 headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"})
    response = conn.getresponse()
    response.readline()                                 # streaming
    lose()
    killed = time.monotonic()
    while True:
        line = response.readline()
        if not line or b'"error"' in line:
            break
    took = time.monotonic() - killed
    conn.close()
    return took


def stop_stackd(server: Server, follower: RealFollower | None) -> None:
    server.stop()
    if follower is not None:
        follower.stop()
    shutil.rmtree(server.data, ignore_errors=True)


@contextmanager
def in_leader_namespace(net: Namespaces | None):
    """--netns: this thread (the bench's clients) and what it starts in the leader's namespace."""
    if net is None:
        yield
        return
    try:
        with topology.entered(net.leader_ns):
            yield
    finally:
        net.net.close()


def node_loss(server: Server, follower: RealFollower | None, options_of) -> None:
    """Time from the follower's death (and, with a real follower, from its freezing) to the first
    503 of a stream placed over it."""
    if follower is None:
        marker = os.path.join(server.data, "test-peers", FOLLOWER).encode()
        took = time_to_first_503(server, lambda: os.kill(rpc_child(marker), signal.SIGKILL))
        print(f"  follower's RPC server killed -> first 503 (stream error event): {took * 1000:.0f} ms", flush=True)
        return
    took = time_to_first_503(server, follower.kill)
    print(f"  follower killed (kill -9, daemon and RPC server) -> first 503: {took * 1000:.0f} ms", flush=True)
    follower.node.proc.wait()
    follower.node.start()                              # back, and placed over again
    placed_again(server, follower, options_of)
    frozen = []
    took = time_to_first_503(server, lambda: frozen.extend(follower.freeze()))
    print(f"  follower frozen (SIGSTOP, daemon and RPC server) -> first 503: {took * 1000:.0f} ms", flush=True)
    for pid in frozen:
        os.kill(pid, signal.SIGCONT)
    placed_again(server, follower, options_of)         # it fenced itself, then rejoined
    child = follower.rpc_child()
    took = time_to_first_503(server, lambda: os.kill(child, signal.SIGSTOP))
    print(f"  follower's RPC server alone frozen (SIGSTOP; the daemon heartbeats) -> first 503: "
          f"{took * 1000:.0f} ms", flush=True)
    os.kill(child, signal.SIGCONT)


def placed_again(server: Server, follower: RealFollower, options_of) -> None:
    deadline = time.monotonic() + 60
    while statuses_of(server).get(follower.id) != "up":
        if time.monotonic() > deadline:
            sys.exit("the follower did not rejoin")
        time.sleep(0.05)
    load(server, **options_of(leader_id(server), follower.id))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1, help="per node")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kernels", default="off", help="stackd engine.kernels (off: ggml's, as the peers)")
    parser.add_argument("--skip-llama-server", action="store_true")
    parser.add_argument("--followers", choices=("real", "simulated"), default="real",
                        help="a second daemon (real) or the leader's loopback test hook (simulated)")
    parser.add_argument("--netns", action="store_true",
                        help="each node in a network namespace of its own, on a veth link (root; real followers)")
    parser.add_argument("--pin", action="store_true", help="a core per node: the leader's on CPU 0, the follower's on 1")
    parser.add_argument("--balanced", default="", help="L,F: also a layer split with these layer counts")
    parser.add_argument("--rows", default="", help="only these rows, by name, comma-separated "
                                                   "('1 node,2 nodes layer,2 nodes layer 1 lane')")
    parser.add_argument("--no-node-loss", action="store_true", help="skip the node loss timings")
    parser.add_argument("--speculative", choices=("ngram", "off"), default=None,
                        help="--replicas: engine.speculative on both nodes (default: the engine's, ngram)")
    parser.add_argument("--replicas", type=int, default=0, metavar="ROUNDS",
                        help="only the rows '1 node' and '2 nodes replicas' (split_mode replica), in ROUNDS "
                             "alternating rounds on the same two daemons, medians; then a replica node's death")
    parser.add_argument("--tensor", type=int, default=0, metavar="ROUNDS",
                        help="only the rows '1 node' and '2 nodes tensor' (split_mode tensor over both), in "
                             "ROUNDS alternating rounds on the same two daemons, medians")
    parser.add_argument("--link-delay-us", type=int, default=0,
                        help="--tensor: each exchange's frames held this long (a slower link one way, where "
                             "the kernel has no `tc netem`: kernels/src/tp_link.cpp)")
    parser.add_argument("--free-links", action="store_true",
                        help="--tensor: the split's ceiling: each node computes its shard and exchanges nothing "
                             "(wrong answers; the speed a link that cost nothing would leave, memory and "
                             "per-layer costs still in it)")
    parser.add_argument("--trace", action="store_true",
                        help="--replicas/--tensor: the leader engine's step phases during each c=1 row "
                             "(POST /v1/debug/trace)")
    parser.add_argument("--rate-mbit", type=int, default=0,
                        help="--netns: the veth link carries at most this many Mbit/s each way (tc tbf)")
    parser.add_argument("--model-file", default="",
                        help="--replicas/--tensor: this GGUF (in both nodes' stores) instead of the default model, "
                             "e.g. the 1B-class `python -m testing.random_model`")
    args = parser.parse_args()
    if (args.netns or args.pin) and args.followers != "real":
        parser.error("--netns and --pin place the model over a real follower")
    if args.pin and os.cpu_count() < 2:
        parser.error("--pin needs two cores")
    if args.rate_mbit and not args.netns:
        parser.error("--rate-mbit shapes the veth link of --netns")
    net = Namespaces() if args.netns else None
    if net is not None and args.rate_mbit:
        net.net.limit_rate(net.leader_ns, net.follower_ns, args.rate_mbit)
    with in_leader_namespace(net):
        if args.replicas or args.tensor:
            run_replicas(args, net)
        else:
            run(args, net)


def run(args, net: Namespaces | None) -> None:
    c, results, real = args.clients, {}, args.followers == "real"

    def run_stackd(name: str, two_nodes: bool, options_of) -> tuple[Server, RealFollower | None]:
        peers = f"{FOLLOWER}={OFFER_MIB}" if two_nodes and not real else ""
        if net is not None:
            server = NamespacedLeader(net, c, args.context, args.threads, args.kernels)
        else:
            server = start_stackd(c, args.context, args.threads, args.kernels, peers,
                                  {"STACKD_CLUSTER_SECRET": SECRET} if real else None)
        follower = None
        try:
            if two_nodes and real:
                follower = RealFollower(server, args.threads, net)
                print(f"{name}: compute (GFLOP/s) {wait_measured(server)}", flush=True)
            answer = load(server, **options_of(leader_id(server), follower.id if follower else FOLLOWER))
            print(f"{name}: placement {answer.get('placement')}", flush=True)
            if args.pin:
                pin_tree((server.proc if hasattr(server, "proc") else server.node.proc).pid, LEADER_CPUS)
                if follower is not None:
                    pin_tree(follower.node.proc.pid, FOLLOWER_CPUS)
            results[name] = {c: measure(server, c, args.seconds, args.max_tokens)}
            print(row(f"{name} c={c}", results[name][c]), flush=True)
            results[name][1] = measure(server, 1, min(args.seconds, 15.0), args.max_tokens)
            print(row(f"{name} c=1", results[name][1]), flush=True)
        except BaseException:
            stop_stackd(server, follower)
            raise
        return server, follower

    balanced = [int(k) for k in args.balanced.split(",") if k]
    for name, two_nodes, options_of in [
            ("1 node", False, lambda leader, follower: {}),
            ("2 nodes layer", True, lambda leader, follower: {"nodes": [leader, follower]}),
            ("2 nodes layer 1 lane", True, lambda leader, follower: {"nodes": [leader, follower], "lanes": 1}),
            *([(f"2 nodes layer {balanced[0]}/{balanced[1]} 2 lanes", True,
                lambda leader, follower: {"nodes": [leader, follower], "layers": balanced, "lanes": 2})]
              if balanced else []),
            ("2 nodes layer pipe", True, lambda leader, follower: {"nodes": [leader, follower], "pipeline": True}),
            ("2 nodes tensor", True, lambda leader, follower: {"nodes": [leader, follower], "split_mode": "tensor"})]:
        if args.rows and name not in args.rows.split(","):
            continue
        server, follower = run_stackd(name, two_nodes, options_of)
        try:
            if name == "2 nodes layer" and not args.no_node_loss:
                node_loss(server, follower, lambda leader, follower: {"nodes": [leader, follower]})
        finally:
            stop_stackd(server, follower)

    if not args.skip_llama_server:
        import peers as bench_peers
        binary = bench_peers.llama_server()
        rpc, rpc_port = start_rpc_server(args.threads, net.follower_ns if net else None)
        try:
            if net is not None:
                rpc_port = forward_across(net, rpc_port)
            server = start_llama_server_rpc(binary, c, args.context, args.threads, rpc_port,
                                            net.follower_ip if net else "127.0.0.1")
            if args.pin:
                pin_tree(server.proc.pid, LEADER_CPUS)
                pin_tree(rpc.pid, FOLLOWER_CPUS)
            try:
                results["llama-server --rpc"] = {c: measure(server, c, args.seconds, args.max_tokens),
                                                 1: measure(server, 1, min(args.seconds, 15.0), args.max_tokens)}
                for n in (c, 1):
                    print(row(f"llama-server --rpc c={n}", results["llama-server --rpc"][n]), flush=True)
            finally:
                server.stop()
        finally:
            rpc.kill()
            rpc.wait()

    print(f"\nSmolLM2-135M Q4_1, {args.threads} thread(s) per node, {c} slots, {args.max_tokens} tokens per "
          f"request, {args.seconds:g} s closed loop, {'network namespaces on a veth link' if net else 'loopback'}"
          f"{', a core per node' if args.pin else ''}, kernels {args.kernels}")
    one = results["1 node"]
    for name in results:
        r = results[name]
        print(f"  {name:20s} c={c}: {r[c].tokens_per_second():7.1f} tok/s ({r[c].tokens_per_second() / one[c].tokens_per_second():.2f}x one node)"
              f"   c=1: {r[1].tokens_per_second():6.1f} tok/s ({r[1].tokens_per_second() / one[1].tokens_per_second():.2f}x)")
    if "llama-server --rpc" in results:
        ours, peer = results["2 nodes layer"][c], results["llama-server --rpc"][c]
        print(f"  2 nodes layer vs llama-server --rpc at c={c}: {ours.tokens_per_second() / peer.tokens_per_second():.2f}x "
              "(target >= 1.0x)")


# ---- --replicas: one node against a replica on each of two nodes ------------------------------------

def run_replicas(args, net: Namespaces | None) -> None:
    """The same two daemons throughout (each pinned to its core with --pin, one engine thread
    each): the model loaded with one replica (the leader's: "1 node") and with a replica on each
    node ("2 nodes replicas"), alternately, ROUNDS times; medians of the rounds. --tensor: the
    second row is a tensor split over both nodes ("2 nodes tensor") instead."""
    c = args.clients
    tensor = bool(args.tensor)
    rounds = args.tensor or args.replicas
    second = "2 nodes tensor" if tensor else "2 nodes replicas"
    if args.followers != "real":
        sys.exit("--replicas and --tensor need a real follower")
    speculative = {"STACKD_ENGINE_SPECULATIVE": args.speculative} if args.speculative else {}
    # both nodes' workers hold each exchange's frames, or skip them (testing/serve.py hands these
    # to each daemon, which hands them to its workers: server/faults.py)
    link = {"link_delay_us": args.link_delay_us, "free_links": args.free_links}
    if net is not None:
        server = NamespacedLeader(net, c, args.context, args.threads, args.kernels, speculative, link)
    else:
        server = start_stackd(c, args.context, args.threads, args.kernels, "",
                              {"STACKD_CLUSTER_SECRET": SECRET, **speculative}, link)
    follower = None
    try:
        follower = RealFollower(server, args.threads, net)
        follower.node.env.update({"STACKD_ENGINE_SLOTS": str(c), "STACKD_ENGINE_CONTEXT_LENGTH": str(args.context),
                                  "STACKD_ENGINE_KERNELS": args.kernels, **speculative})
        follower.node.injected.update(link)
        follower.node.kill()                  # again, with the leader's engine settings
        follower.node.start()
        placed = time.monotonic() + 60
        while statuses_of(server).get(follower.id) != "up" and time.monotonic() < placed:
            time.sleep(0.05)
        if args.model_file:                    # the same file in both stores, loaded by that name
            for data in (server.node.data_dir if hasattr(server, "node") else server.data,
                         follower.node.data_dir):
                ModelStore(data).import_file(MODEL_FILE_NAME, args.model_file, source="local")
            server.model = MODEL_FILE_NAME
            deadline = time.monotonic() + 30          # the follower's next heartbeat lists it
            while time.monotonic() < deadline and not follower_holds(server, follower.id):
                time.sleep(0.2)
        rows = {"1 node": {c: [], 1: []}, second: {c: [], 1: []}}
        cpu = CpuUse({"leader": (server.proc if hasattr(server, "proc") else server.node.proc).pid,
                      "follower": follower.node.proc.pid})
        uses = {name: {c: [], 1: []} for name in rows}
        both = {"nodes": [leader_id(server), follower.id], "split_mode": "tensor"} if tensor else \
            {"split_mode": "replica", "replicas": "all"}
        for round_ in range(rounds):
            for name, options in (("1 node", {"split_mode": "replica", "replicas": 1}), (second, both)):
                answer = load(server, **options)
                if round_ == 0:
                    print(f"{name}: replicas {[(r['node'], r['pid']) for r in answer.get('replicas', [])]} "
                          f"placement {answer.get('placement')}", flush=True)
                if args.pin:
                    pin_tree((server.proc if hasattr(server, "proc") else server.node.proc).pid, LEADER_CPUS)
                    pin_tree(follower.node.proc.pid, FOLLOWER_CPUS)
                    print(f"  round {round_ + 1} {name:18s} {cores_together()}", flush=True)
                for n in (c, 1):
                    before = tensor_counters(server) if name == second and tensor else None
                    tracer = StepTrace(server, args.seconds) if args.trace and n == 1 else None
                    result = measure(server, n, args.seconds, args.max_tokens, cpu)
                    rows[name][n].append(result.tokens_per_second())
                    uses[name][n].append(result.cpu)
                    print(f"  round {round_ + 1} {name:18s} c={n:<3d} {result.tokens_per_second():7.1f} tok/s   "
                          f"{cpu_line(result.cpu)}", flush=True)
                    if before is not None:
                        print("    " + exchange_line(before, tensor_counters(server), result), flush=True)
                    if tracer is not None:
                        print("    " + tracer.line(), flush=True)
        print(f"\n{os.path.basename(args.model_file) or 'SmolLM2-135M Q4_1'}, {args.threads} thread(s) per node, {c} slots, {args.max_tokens} tokens per "
              f"request, {args.seconds:g} s closed loop, medians of {rounds} alternating rounds, "
              f"{'network namespaces on a veth link' if net else 'loopback'}"
              f"{f' of {args.rate_mbit} Mbit/s' if args.rate_mbit else ''}{', a core per node' if args.pin else ''}, "
              f"kernels {args.kernels}, speculative {args.speculative or 'default (ngram)'}"
              f"{f', link delay {args.link_delay_us} us' if args.link_delay_us else ''}"
              f"{', FREE LINKS (no exchange: a ceiling, wrong answers)' if args.free_links else ''}")
        one = {n: statistics.median(rows["1 node"][n]) for n in (c, 1)}
        for name, runs in rows.items():
            med = {n: statistics.median(runs[n]) for n in (c, 1)}
            spread = {n: f"{min(runs[n]):.1f}-{max(runs[n]):.1f}" for n in (c, 1)}
            targets = ("1.5x", "1.3x") if tensor else ("1.7x", "0.95x")
            print(f"  {name:18s} c={c}: {med[c]:7.1f} tok/s [{spread[c]}] ({med[c] / one[c]:.2f}x one node, "
                  f"target {targets[0]})   c=1: {med[1]:6.1f} tok/s [{spread[1]}] ({med[1] / one[1]:.2f}x, "
                  f"target {targets[1]})")
        if not tensor:   # replicas: each engine's own tokens (a tensor split's workers share theirs)
            # what the engines would give with a whole core each: tokens per CPU second of the
            # engine workers, times the workers (at c clients every worker is busy: CPU-bound)
            per_core = {name: statistics.median(
                1000 / sum(per_k for p, (_, per_k) in use.items() if " worker" in p and per_k > 0)
                for use in uses[name][c]) for name in rows}
            workers = {"1 node": 1, second: 2}
            print(f"  at a whole core per engine (tokens per worker CPU second x workers, c={c}): " + ", ".join(
                f"{name} {per_core[name] * workers[name]:.0f} tok/s "
                f"({per_core[name] * workers[name] / per_core['1 node']:.2f}x)" for name in rows))
        print("  where the cores went (median share of one core, CPU seconds per 1,000 tokens):")
        for name, by_clients in uses.items():
            for n in (c, 1):
                names = by_clients[n][0].keys() if by_clients[n] else ()
                med = {p: (statistics.median(u[p][0] for u in by_clients[n] if p in u),
                           statistics.median(u[p][1] for u in by_clients[n] if p in u)) for p in names}
                print(f"    {name:18s} c={n:<3d} {cpu_line(med)}")
        if tensor or args.no_node_loss:
            return
        load(server, split_mode="replica", replicas="all")
        took, errors = death_to_next_answer(server, follower)
        print(f"  replica node killed (kill -9 of the follower daemon and its worker) -> next answered "
              f"request: {took * 1000:.0f} ms ({errors} requests failed)", flush=True)
    except Exception:
        # what the nodes said last (a worker's crash, a lost exchange), before they are stopped
        for who, node in (("leader", getattr(server, "node", None)), ("follower", getattr(follower, "node", None))):
            if node is not None:
                print(f"--- the {who}'s last log lines:\n" + "\n".join(node.log().splitlines()[-40:]), flush=True)
        raise
    finally:
        stop_stackd(server, follower)


PROBE = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
import numpy as np
small = np.ones((192, 192), dtype=np.float32)       # in cache: compute
large = np.ones(64 << 20, dtype=np.float32)         # 256 MiB: memory reads (a decode's weights)
rates = []
for work, size in ((lambda: small @ small, 2 * 192 ** 3), (lambda: np.dot(large, large), large.nbytes)):
    work()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < float(sys.argv[2]):
        work()
        n += 1
    rates.append(n * size / (time.perf_counter() - t0) / 1e9)
print(*rates)
"""


def cores_together(seconds: float = 0.7) -> str:
    """CPUs 0 and 1 busy at once against CPU 0 alone: a small matmul's rate (~100 % on two
    cores of their own; ~60 % where the host runs both vCPUs on one physical core's two
    threads) and memory reads (what a decode step streams its weights at). Two cores reading at
    once each read less than one alone (bench/README.md, "Cluster"), which bounds what a single
    stream, reading every weight once a token, gains from two nodes on these two cores, whatever
    the exchanges cost (separate devices each have their own memory). Taken
    before each --pin round: the host may change either between rounds."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def run(cpus: list[int]) -> list[list[float]]:
        procs = [subprocess.Popen([sys.executable, "-c", PROBE, str(cpu), str(seconds)], env=env,
                                  stdout=subprocess.PIPE, text=True) for cpu in cpus]
        return [[float(v) for v in p.communicate()[0].split()] for p in procs]

    (compute, memory), = run([0])
    both = run([0, 1])
    return (f"CPUs 0 and 1 busy at once: compute each at {min(b[0] for b in both) / compute:.0%} of one alone, "
            f"memory reads {both[0][1]:.0f} + {both[1][1]:.0f} GB/s against {memory:.0f} alone")


class StepTrace:
    """--trace: the leader engine's trace (POST /v1/debug/trace) over the middle of a row's
    measurement, as one line: steps a second, the median step and its phases (schedule, batch,
    decode with a tensor split's exchanges inside, sample, emit) and the median gap between steps
    (what the engine thread did outside them: its own loop, the worker's Python)."""

    def __init__(self, server: Server, seconds: float):
        self.server, self.record = server, max(1.0, min(4.0, seconds - 3.0))
        self.events: list[dict] = []
        self.error = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        time.sleep(3.0)                          # past measure()'s 2 s warm-up and the first steps
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.server.cluster_port, timeout=120)
            conn.request("POST", "/v1/debug/trace", body=orjson.dumps({"seconds": self.record}),
                         headers={"Authorization": f"Bearer {self.server.key}", "Content-Type": "application/json"})
            answer = conn.getresponse()
            data = answer.read()
            conn.close()
            if answer.status != 200:
                self.error = f"trace: HTTP {answer.status} {data[:200]!r}"
                return
            self.events = orjson.loads(data).get("traceEvents", [])
        except (OSError, ValueError) as exc:
            self.error = f"trace: {exc}"

    def line(self) -> str:
        self.thread.join()
        steps = sorted((e for e in self.events if e.get("name") == "step" and e.get("ph") == "X"),
                       key=lambda e: e["ts"])
        if self.error or len(steps) < 3:
            return self.error or "trace: fewer than 3 steps recorded"
        phases: dict[str, list[float]] = {}
        for e in self.events:
            if e.get("ph") == "X" and e.get("name") not in ("step", None) and e.get("tid") == steps[0]["tid"]:
                phases.setdefault(e["name"], []).append(e["dur"])
        gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(steps, steps[1:])]
        span = (steps[-1]["ts"] + steps[-1]["dur"] - steps[0]["ts"]) / 1e6
        parts = ", ".join(f"{name} {statistics.median(d):.0f}" for name, d in phases.items())
        return (f"leader engine trace: {len(steps) / span:.0f} steps/s, step {statistics.median(e['dur'] for e in steps):.0f} us "
                f"({parts}), between steps {statistics.median(gaps):.0f} us (medians)")


def tensor_counters(server: Server) -> dict[str, float]:
    """The leader's /metrics counters of its tensor split's exchanges (pushed once a second)."""
    time.sleep(1.2)                             # the worker's last push, after the load stopped
    conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=60)
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {server.key}"})
    text = conn.getresponse().read().decode()
    conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("stackd_tensor_exchange"):
            name = line.split("{")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def exchange_line(before: dict, after: dict, result: loadgen.LoadResult) -> str:
    """Exchanges, bytes and exchange time per generated token over one measurement (a step of
    several sequences, or of drafted tokens, makes several tokens: fewer exchanges each)."""
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)
    tokens = max(1, result.tokens)
    return (f"exchanges {delta('stackd_tensor_exchanges_total') / tokens:.1f} a token, "
            f"{delta('stackd_tensor_exchange_bytes_total') / tokens / 1024:.1f} KiB sent a token, "
            f"{delta('stackd_tensor_exchange_seconds_total') / tokens * 1e6:.0f} us in exchanges a token "
            f"({delta('stackd_tensor_exchange_seconds_total') / result.seconds:.0%} of the wall time)")


def follower_holds(server: Server, follower_id: str) -> bool:
    """Whether the follower's heartbeat lists the bench's model file in its store."""
    conn = http.client.HTTPConnection("127.0.0.1", server.cluster_port, timeout=60)
    conn.request("GET", "/v1/nodes", headers={"Authorization": f"Bearer {server.key}"})
    nodes = orjson.loads(conn.getresponse().read())["data"]
    conn.close()
    entry = next((n for n in nodes if n["id"] == follower_id), {})
    status, described = call(server, "GET", f"/v1/models/{MODEL_FILE_NAME}")
    digest = described.get("sha256") if status == 200 else None
    return bool(digest) and digest in ((entry.get("replicas") or {}).get("store") or [])


def death_to_next_answer(server: Server, follower: RealFollower) -> tuple[float, int]:
    """Two clients asking short questions in a loop; the follower killed; seconds from the
    kill to the next 200, and how many requests failed meanwhile."""
    stop, killed_at, answered, errors = threading.Event(), [], [], []

    def client() -> None:
        while not stop.is_set():
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=600)
            conn.request("POST", "/v1/completions", body=orjson.dumps(body(server.model, 16)),
                          headers={"Authorization": f"Bearer {server.key}", "Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            conn.close()
            now = time.monotonic()
            if killed_at and now > killed_at[0]:
                (answered if response.status == 200 else errors).append(now)
    workers = [threading.Thread(target=client) for _ in range(2)]
    for worker in workers:
        worker.start()
    time.sleep(3.0)
    killed_at.append(time.monotonic())
    follower.node.proc.send_signal(signal.SIGKILL)       # its worker dies with it (PDEATHSIG)
    while not answered:
        time.sleep(0.005)
    stop.set()
    for worker in workers:
        worker.join()
    return answered[0] - killed_at[0], len(errors)


if __name__ == "__main__":
    main()
