"""Fault injection for the tests, in one place, off unless a test configuration turns it on.

The `[testing]` settings (STACKD_TESTING_* in the environment) are empty in every shipped
configuration; only the test suite and bench/ set them:
- testing.worker_crash_file: while this file exists, every engine worker aborts as it starts
  (a crash loop, for the supervisor's backoff and `failed` state);
- testing.loopback_peers: "f1=512,f2=512": simulated followers whose RPC server children this
  daemon starts on loopback (server/testing/loopback_peers.py), for placement on one machine;
  "f1=512@2.5" also gives f1 a compute figure of 2.5;
- testing.compute: > 0, this node's compute figure instead of its measurement
  (server/cluster/compute_speed.py; read by the daemon when it builds the node's facts).

The daemon reads them once (`from_settings`); an engine worker gets its part in its start frame.
"""
from __future__ import annotations

import os

# A plain class, not a dataclass: engine workers import this module, and a worker imports only
# what it needs (tests/engine/test_wire_json.py: not dataclasses, not inspect).
FIELDS = ("worker_crash_file", "loopback_peers")


class Faults:
    __slots__ = FIELDS

    def __init__(self, worker_crash_file: str = "", loopback_peers: str = ""):
        self.worker_crash_file = worker_crash_file
        self.loopback_peers = loopback_peers

    @classmethod
    def from_settings(cls, testing: dict) -> "Faults":
        return cls(**{name: testing.get(name, "") for name in FIELDS})

    def for_worker(self) -> dict:
        """What an engine worker needs to know (nothing, unless a fault is asked for)."""
        return {"worker_crash_file": self.worker_crash_file} if self.worker_crash_file else {}

    def worker_crashes(self) -> bool:
        return bool(self.worker_crash_file) and os.path.exists(self.worker_crash_file)


NONE = Faults()
