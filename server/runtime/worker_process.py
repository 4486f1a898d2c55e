"""Engine worker processes: spawning one, and the spare one a booting daemon starts first.

Spawning is kept apart from clients.py (which loads the native engine) so that `stackd serve`
can start a worker before it imports anything heavy: a worker's interpreter start and imports
then overlap the daemon's own imports and set-up instead of following them. On a 2-core device
that is ~0.25 s of the first answer after boot (bench/startup.py). The worker waits for its
start message (engine/worker.py), so a process spawned before its model is known is as good
as one spawned for it.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys

from .. import PACKAGE
from ..engine import llama_library

# engine/worker_boot.py: how a worker starts, with neither site nor this checkout on sys.path
BOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engine", "worker_boot.py")


def spawn(omp_wait_policy: str = "inherit") -> tuple[subprocess.Popen, socket.socket]:
    """A worker process and the daemon's end of its socket (non-blocking). Call it from the
    loop's thread (or the main thread before the loop runs there): the worker's
    PR_SET_PDEATHSIG follows the thread that spawned it. `omp_wait_policy` is for libgomp,
    which reads it when it loads."""
    ours, theirs = socket.socketpair()
    env = {**os.environ, "GGML_NO_BACKTRACE": "1", llama_library.ENV: llama_library.library_dir()}
    if omp_wait_policy != "inherit":
        env["OMP_WAIT_POLICY"] = omp_wait_policy
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", BOOT, PACKAGE, str(theirs.fileno()), str(os.getpid())],
            pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL)
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    ours.setblocking(False)
    return proc, ours


class SpareWorker:
    """One worker spawned ahead of its model, for the first local load that wants its OpenMP
    policy (take). Whatever is not taken once the preloaded models are loaded is stopped."""

    def __init__(self, omp_wait_policy: str):
        self.omp_wait_policy = omp_wait_policy
        self.process: tuple[subprocess.Popen, socket.socket] | None = spawn(omp_wait_policy)

    def take(self, omp_wait_policy: str) -> tuple[subprocess.Popen, socket.socket] | None:
        """The spare process for a load with this policy, once; None otherwise."""
        if self.process is None or omp_wait_policy != self.omp_wait_policy:
            return None
        process, self.process = self.process, None
        if process[0].poll() is not None:        # died meanwhile: spawn afresh
            process[1].close()
            return None
        return process

    def stop(self) -> None:
        """Its socket's EOF ends a worker still waiting for its start message."""
        if self.process is not None:
            proc, sock = self.process
            self.process = None
            sock.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def spare_for_boot(settings) -> SpareWorker | None:
    """A spare worker when this start will load models into workers (a leader with models to
    preload, engines isolated in workers), else None."""
    engine = settings["engine"]
    if (engine["isolation"] != "worker" or settings["cluster.role"] != "leader"
            or not settings["models.preload"]
            or importlib.util.find_spec(f"{PACKAGE}._engine") is None):   # not built: the daemon says so
        return None
    from ..engine.config import EngineConfig
    policy = EngineConfig.from_settings(engine, 1.0).omp_wait_policy_for(False)   # the chat model's
    return SpareWorker(policy)
