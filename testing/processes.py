"""Processes, threads and sockets as /proc shows them, for tests and benchmarks: a daemon's
ggml RPC server children, what a process listens on, whether it is gone; a process's tree, its
threads and their CPU time, and pinning them to cores (bench/cluster.py, cluster_pipeline.py,
startup.py)."""
from __future__ import annotations

import os
import socket


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc/.../stat file after the command name (field 3 onwards; the name
    may hold any byte, the fields are ASCII)."""
    with open(path, "rb") as f:
        return f.read().rsplit(b")", 1)[1].decode().split()


def parent_of(pid: int | str) -> int | None:
    """The parent's pid; None once the process is gone."""
    try:
        return int(stat_fields(f"/proc/{pid}/stat")[1])
    except (OSError, ValueError, IndexError):
        return None


def gone(pid: int) -> bool:
    """Exited (a zombie is gone too)."""
    try:
        return stat_fields(f"/proc/{pid}/stat")[0] == "Z"
    except OSError:
        return True


def send(pid: int, signum: int) -> None:
    """A signal to a process that may be gone already."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def rpc_server_pids(marker: bytes = b"", parent: int | None = None) -> list[int]:
    """Pids of `stackd.cluster.rpc_server` processes whose command line holds `marker` (a
    cache dir names its node) and, if given, whose parent is `parent`."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"stackd.cluster.rpc_server" not in cmdline or marker not in cmdline:
            continue
        if parent is None or parent_of(pid) == parent:
            pids.append(int(pid))
    return pids


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket the process listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    out = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            address, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:                    # 0A: LISTEN
                ip, port = address.split(":")
                out.add((socket.inet_ntoa(bytes.fromhex(ip)[::-1]), int(port, 16)))
    return out


def cpu_ticks(path: str) -> int:
    """utime + stime, in clock ticks, of a /proc/.../stat file."""
    fields = stat_fields(path)
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids) -> float:
    """User + system CPU of these processes (all threads) so far."""
    return sum(cpu_ticks(f"/proc/{pid}/stat") for pid in pids) / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> list[int]:
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now, whichever of their threads started them."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        parent = parent_of(entry)
        if parent is not None:                         # else gone meanwhile
            parents[int(entry)] = parent
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [child for child, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` and of its descendants on `cpus` (affinity is per thread; new
    threads and children inherit it from the thread that starts them)."""
    for p in process_tree(pid):
        try:
            for tid in threads(p):
                os.sched_setaffinity(tid, cpus)
        except OSError:
            pass                                       # gone meanwhile
