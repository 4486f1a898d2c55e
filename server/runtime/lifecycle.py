"""What the supervisor and the registry share, so that neither holds the other: the cluster
parts both are built with, the per-model locks that serialize a model's transitions, and the
typed events in which the supervisor reports what became of a model's worker.

The registry (registry.py) owns the models' state: which are loaded, their transitions, their
last exits, the hold of requests over a restart. The supervisor (supervisor.py) runs the
workers' lifecycles: it starts engines, notices a worker's exit, restarts it with backoff or
places the model again after a node loss, and says each outcome as one of the events below to
the one callback it was built with (the registry's `on_worker_event`).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Union

from .loaded_model import LoadedModel


@dataclass(frozen=True)
class ClusterLinks:
    """The cluster, as the runtime places models over it: its membership (a harness's simulated
    peers in tests), this node's RPC server children (cluster.rpc_server.RpcServers) and the
    address this node's tensor-split workers listen on for their peers. Built by the daemon
    before the registry, and handed to it whole; `ClusterLinks()` is a node alone."""
    membership: object | None = None
    rpc: object | None = None
    bind_host: str = "127.0.0.1"


class ModelLocks:
    """One lock per model id: its loads, unloads and restarts run one at a time."""

    def __init__(self):
        self._locks: dict[str, asyncio.Lock] = {}

    def of(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())


# ---- the supervisor's reports ----------------------------------------------------------------


@dataclass(frozen=True)
class Restarting:
    """The model's worker died, and `restart` brings it back (or ends in Failed). `alone`: no
    other replica serves meanwhile, so the model is `restarting` from now on (a request that
    asks at once must not see `loaded`)."""
    model_id: str
    restart: asyncio.Task
    alone: bool = True


@dataclass(frozen=True)
class Exited:
    """How the worker ended (clients.exit_record, with the supervisor's reason): last_exit."""
    model_id: str
    record: dict


@dataclass(frozen=True)
class Unplaced:
    """A model that lost a node of its placement no longer holds that memory while it is placed
    again (admission must not count it)."""
    model_id: str


@dataclass(frozen=True)
class Restarted:
    """The model serves again: `model` is the fresh one (a restarted or re-placed worker), or the
    same one whose local replica was replaced."""
    model_id: str
    model: LoadedModel


@dataclass(frozen=True)
class Failed:
    """The model gave up (a crash loop, or no placement left): `failed` with why, until loaded."""
    model_id: str
    why: str


WorkerEvent = Union[Restarting, Exited, Unplaced, Restarted, Failed]
Report = Callable[[WorkerEvent], None]
