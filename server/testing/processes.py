"""Finding the ggml RPC server children a daemon runs, from /proc (tests and bench/cluster.py)."""
from __future__ import annotations

import os


def _parent(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


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
        if parent is None or _parent(pid) == parent:
            pids.append(int(pid))
    return pids
