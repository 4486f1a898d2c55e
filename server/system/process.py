"""A child process's tie to the daemon that started it (engine workers, RPC server children)."""
from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL when the daemon thread that spawned us dies (the daemon spawns from its main
    thread, which lives as long as it does); and if it died already, go now."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (AttributeError, OSError):
        pass
    if os.getppid() != parent:
        os._exit(1)
