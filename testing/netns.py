"""Nodes in their own network namespaces (iproute2), for cluster tests that need each node to
have its own address and links that can be cut.

Each node's namespace gets two links:
* a management link to the test's own namespace (10.251.<i>.2, the test at 10.251.<i>.1):
  how the test talks to the node, never cut;
* cluster links, one veth pair per pair of nodes (10.252.<k>.1 and .2): what the nodes talk
  over, and what `set_link(..., up=False)` cuts to partition them;
* optionally a second address of b on a link (10.253.<k>.2, `second_address`) that a reaches by
  a route of its own: `set_route(..., up=False)` makes it unreachable from a while b still
  reaches a from its first address (a one-way partition: a cannot call b, b can call a).
`inside(netns, fn)` runs fn with its sockets in a node's namespace (a client on that node).
Everything is named with a per-process prefix and removed by `close()` (also of a run that died:
`sweep()` removes what a killed earlier run of this module left behind).
Needs root; `available()` says why not otherwise.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import re
import shutil
import subprocess
import threading
from contextlib import contextmanager

PREFIX = "stkt"
CLONE_NEWNET = 0x40000000
# Numbers for names and addresses, unique within the process: a namespace outlives `ip netns
# del` (and keeps its veth ends) until its last process has exited, so a test's leftovers may
# still be there when the next test of the run makes its own.
_NODES, _LINKS = itertools.count(1), itertools.count(1)


def _octet(n: int) -> int:
    return (n - 1) % 250 + 1


def available() -> str | None:
    """None when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    return None


def ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")
    return done


def sweep() -> None:
    """Removes namespaces and links left by earlier runs that were killed. A namespace's veth
    end outside may outlive `ip netns del` for a while (the kernel frees a namespace lazily):
    deleting it at once keeps its address from shadowing a new run's."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not _alive(name):
            ip("netns", "del", name, check=False)
    for line in ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(PREFIX) and not _alive(name):
            ip("link", "del", name, check=False)


def _alive(name: str) -> bool:
    """A namespace of a run whose process still lives (its prefix holds the pid)."""
    try:
        pid = int(re.match(r"\d+", name[len(PREFIX):]).group())
    except AttributeError:
        return False
    return pid != os.getpid() and os.path.exists(f"/proc/{pid}")


class Topology:
    def __init__(self):
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.namespaces: list[str] = []
        self.outside: list[str] = []                       # management links' ends out here
        self.links: dict[tuple[str, str], tuple[str, str]] = {}
        self.octets: dict[tuple[str, str], int] = {}       # a link's 10.252.<octet>.0/30
        self.second: dict[tuple[str, str], str] = {}

    def add_node(self, name: str) -> tuple[str, str]:
        """A namespace for one node: (its name, the address the test reaches it at)."""
        i = next(_NODES)
        netns = f"{self.prefix}-{name}{i}"
        ip("netns", "add", netns)
        self.namespaces.append(netns)
        ip("link", "set", "lo", "up", netns=netns)
        outside, inside = f"{self.prefix}m{i}", f"{self.prefix}n{i}"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        self.outside.append(outside)
        ip("link", "set", inside, "netns", netns)
        ip("addr", "add", f"10.251.{_octet(i)}.1/30", "dev", outside)
        ip("link", "set", outside, "up")
        ip("addr", "add", f"10.251.{_octet(i)}.2/30", "dev", inside, netns=netns)
        ip("link", "set", inside, "up", netns=netns)
        return netns, f"10.251.{_octet(i)}.2"

    def connect(self, a: str, b: str) -> tuple[str, str]:
        """A cluster link between two nodes' namespaces: (a's address, b's address) on it."""
        k = next(_LINKS)
        end_a, end_b = f"{self.prefix}a{k}", f"{self.prefix}b{k}"
        ip("link", "add", end_a, "netns", a, "type", "veth", "peer", "name", end_b, "netns", b)
        ip("addr", "add", f"10.252.{_octet(k)}.1/30", "dev", end_a, netns=a)
        ip("addr", "add", f"10.252.{_octet(k)}.2/30", "dev", end_b, netns=b)
        ip("link", "set", end_a, "up", netns=a)
        ip("link", "set", end_b, "up", netns=b)
        self.links[(a, b)] = (end_a, end_b)
        self.octets[(a, b)] = _octet(k)
        return f"10.252.{_octet(k)}.1", f"10.252.{_octet(k)}.2"

    def limit_rate(self, a: str, b: str, mbit: int) -> None:
        """The link between a and b carries at most `mbit` Mbit/s each way (a token bucket on both
        ends; `tc netem`, which would also delay, is not in every kernel, tbf is). The bucket holds
        ten 1,500-byte packets, so a burst goes at the link's rate, not loopback's."""
        for end, netns in zip(self.links[(a, b)], (a, b)):
            subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", end, "root", "tbf",
                            "rate", f"{mbit}mbit", "burst", "15000", "latency", "50ms"],
                           check=True, capture_output=True, text=True)

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Cuts (or restores) the cluster link between a and b, from b's side."""
        ip("link", "set", self.links[(a, b)][1], "up" if up else "down", netns=b)

    def second_address(self, a: str, b: str) -> str:
        """Another address of b on the link a-b, which a reaches through a route of its own."""
        end_a, end_b = self.links[(a, b)]
        address = self.second[(a, b)] = f"10.253.{self.octets[(a, b)]}.2"
        ip("addr", "add", f"{address}/32", "dev", end_b, netns=b)
        ip("route", "add", f"{address}/32", "dev", end_a, netns=a)
        return address

    def set_route(self, a: str, b: str, up: bool) -> None:
        """Cuts (or restores) a's way to b's second address: a's connections to it fail at once
        (an `unreachable` route), b's connections to a go on as before."""
        address, end_a = self.second[(a, b)], self.links[(a, b)][0]
        route = ["dev", end_a] if up else []
        ip("route", "replace", *([] if up else ["unreachable"]), f"{address}/32", *route, netns=a)

    def close(self) -> None:
        """Deleting a namespace deletes its veth ends, and so their peers outside, but only once
        the kernel frees it: the ends outside go first, so that none lingers."""
        for link in self.outside:
            ip("link", "del", link, check=False)
        for netns in self.namespaces:
            ip("netns", "del", netns, check=False)
        self.outside.clear()
        self.namespaces.clear()


def _setns(fd: int) -> None:
    """The calling thread into the network namespace `fd` refers to (setns applies to one
    thread; threads and processes it starts afterwards are born in it)."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def _join(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _setns(fd)
    finally:
        os.close(fd)


def inside(netns: str, fn, *args):
    """fn(*args) on a thread that has joined the namespace, so the sockets it opens are that
    node's (and stay so on any thread); its value, or its exception raised here."""
    outcome: dict = {}

    def run():
        try:
            _join(f"/run/netns/{netns}")
            outcome["value"] = fn(*args)
        except BaseException as exc:         # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
    thread = threading.Thread(target=run, name=f"in {netns}")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@contextmanager
def entered(netns: str):
    """The calling thread in the namespace for the block (a benchmark that runs as a client on
    that node, with the processes it starts), then back where it was."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _join(f"/run/netns/{netns}")
        yield
    finally:
        _setns(home)
        os.close(home)


# Daemons in namespaces: each namespace has its own ports, so every node uses the defaults.
CLUSTER_PORT, INFERENCE_PORT = 5381, 8080
RPC_PORT = 50052                                    # cluster.rpc_port's default


def in_namespace(net_node: tuple[str, str], advertise: str, **kwargs) -> dict:
    """Node keyword arguments for a daemon in the namespace `net_node` (from add_node) that
    listens on every address there and tells the cluster `advertise` (its cluster link's)."""
    netns, reach = net_node
    return {"host": "0.0.0.0", "advertise": f"http://{advertise}:{CLUSTER_PORT}", "reach": reach,
            "netns": netns, "ports": (INFERENCE_PORT, CLUSTER_PORT), **kwargs}
