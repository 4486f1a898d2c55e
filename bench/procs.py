"""Processes and threads from /proc, for the benches: a process's tree, its threads, their CPU
time, and pinning them to cores."""
from __future__ import annotations

import os


def stat_fields(path: str) -> list[str]:
    """The fields of a /proc/.../stat file after the command name (field 3 onwards)."""
    with open(path) as f:
        return f.read().rsplit(")", 1)[1].split()


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
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(stat_fields(f"/proc/{entry}/stat")[1])
            except OSError:
                pass                                   # gone meanwhile
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
