"""Nodes in their own network namespaces (iproute2), for cluster tests that need each node to
have its own address and links that can be cut.

Each node's namespace gets two links:
* a management link to the test's own namespace (10.251.<i>.2, the test at 10.251.<i>.1):
  how the test talks to the node, never cut;
* cluster links, one veth pair per pair of nodes (10.252.<k>.1 and .2): what the nodes talk
  over, and what `set_link(..., up=False)` cuts to partition them.
Everything is named with a per-process prefix and removed by `close()` (also of a run that died:
`sweep()` removes what a killed earlier run of this module left behind).
Needs root; `available()` says why not otherwise.
"""
from __future__ import annotations

import os
import shutil
import subprocess

PREFIX = "stkt"


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
    """Removes namespaces and links left by earlier runs that were killed."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not _alive(name):
            ip("netns", "del", name, check=False)


def _alive(name: str) -> bool:
    """A namespace of a run whose process still lives (its prefix holds the pid)."""
    try:
        pid = int(name[len(PREFIX):].split("-")[0])
    except ValueError:
        return False
    return pid != os.getpid() and os.path.exists(f"/proc/{pid}")


class Topology:
    def __init__(self):
        self.prefix = f"{PREFIX}{os.getpid()}"
        self.namespaces: list[str] = []
        self.links: dict[tuple[str, str], tuple[str, str]] = {}

    def add_node(self, name: str) -> tuple[str, str]:
        """A namespace for one node: (its name, the address the test reaches it at)."""
        i = len(self.namespaces) + 1
        netns = f"{self.prefix}-{name}"
        ip("netns", "add", netns)
        self.namespaces.append(netns)
        ip("link", "set", "lo", "up", netns=netns)
        outside, inside = f"{self.prefix}m{i}", f"{self.prefix}n{i}"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", netns)
        ip("addr", "add", f"10.251.{i}.1/30", "dev", outside)
        ip("link", "set", outside, "up")
        ip("addr", "add", f"10.251.{i}.2/30", "dev", inside, netns=netns)
        ip("link", "set", inside, "up", netns=netns)
        return netns, f"10.251.{i}.2"

    def connect(self, a: str, b: str) -> tuple[str, str]:
        """A cluster link between two nodes' namespaces: (a's address, b's address) on it."""
        k = len(self.links) + 1
        end_a, end_b = f"{self.prefix}a{k}", f"{self.prefix}b{k}"
        ip("link", "add", end_a, "netns", a, "type", "veth", "peer", "name", end_b, "netns", b)
        ip("addr", "add", f"10.252.{k}.1/30", "dev", end_a, netns=a)
        ip("addr", "add", f"10.252.{k}.2/30", "dev", end_b, netns=b)
        ip("link", "set", end_a, "up", netns=a)
        ip("link", "set", end_b, "up", netns=b)
        self.links[(a, b)] = (end_a, end_b)
        return f"10.252.{k}.1", f"10.252.{k}.2"

    def set_link(self, a: str, b: str, up: bool) -> None:
        """Cuts (or restores) the cluster link between a and b, from b's side."""
        ip("link", "set", self.links[(a, b)][1], "up" if up else "down", netns=b)

    def close(self) -> None:
        """Deleting a namespace deletes its veth ends, and so their peers outside."""
        for netns in self.namespaces:
            ip("netns", "del", netns, check=False)
        self.namespaces.clear()
