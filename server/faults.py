"""Fault injection and test-only settings, in one place, off unless a test harness passes them.

No configuration file or environment variable turns any of these on: a test harness builds a
`Faults` and hands it to the composition root (daemon.run's `faults`: testing/serve.py, which the
test suite and bench/ start as `python -m testing.serve`), so a shipped daemon has none.
- worker_crash_file: while this file exists, every engine worker aborts as it starts
  (a crash loop, for the supervisor's backoff and `failed` state);
- compute: > 0, this node's compute figure instead of its measurement
  (server/cluster/compute_speed.py; read by the daemon when it builds the node's facts);
- link_delay_us: a tensor split's exchanges hold their frames this long (0 to 1 s) before they
  go: a slower link (bench/cluster.py --link-delay-us);
- free_links: a tensor split's nodes send no partial sum and no logits (wrong answers: the speed
  of a link that costs nothing; bench/cluster.py --free-links);
- tp_full_rows: a tensor split's steps gather the logits rows whole, never as candidates.

The daemon reads it once; an engine worker gets its part in its start frame (for_worker) and sets
the native ones through the kernels' and the engine's test-only setters (in_worker, in_engine).
"""
from __future__ import annotations

import os

# A plain class, not a dataclass: engine workers import this module, and a worker imports only
# what it needs (tests/engine/test_wire_json.py: not dataclasses, not inspect).
WORKER_FIELDS = ("worker_crash_file", "link_delay_us", "free_links", "tp_full_rows")
FIELDS = WORKER_FIELDS + ("compute",)


class Faults:
    __slots__ = FIELDS

    def __init__(self, worker_crash_file: str = "", link_delay_us: int = 0, free_links: bool = False,
                 tp_full_rows: bool = False, compute: float = 0.0):
        if not 0 <= link_delay_us <= 1_000_000:
            raise ValueError(f"link_delay_us: 0 to 1000000, got {link_delay_us}")
        self.worker_crash_file = worker_crash_file
        self.link_delay_us = link_delay_us
        self.free_links = free_links
        self.tp_full_rows = tp_full_rows
        self.compute = compute

    def for_worker(self) -> dict:
        """What an engine worker needs to know (nothing, unless a fault is asked for)."""
        return {name: getattr(self, name) for name in WORKER_FIELDS if getattr(self, name)}

    def worker_crashes(self) -> bool:
        return bool(self.worker_crash_file) and os.path.exists(self.worker_crash_file)

    def in_worker(self, accel) -> None:
        """The kernels' part, in an engine worker before it joins a tensor group."""
        if self.link_delay_us or self.free_links:
            accel.tp_set_test_link(self.link_delay_us, self.free_links)

    def in_engine(self, engine) -> None:
        """The engine's part, once it is made."""
        if self.tp_full_rows:
            engine.set_tp_full_rows(True)


NONE = Faults()
