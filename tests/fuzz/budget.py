"""Hypothesis runs bounded by time, not only by a count of examples.

`make test` gives every fuzz target an equal share of STACKD_FUZZ_SECONDS (60 s unless set;
`make fuzz` sets FUZZ_SECONDS, 600 by default). A target runs batches of examples, each
batch with a fresh random seed, until its share is used; a failure stops it at once and
hypothesis prints the shrunk example and how to reproduce it. Every finding fixed is kept as
an explicit regression example beside its target, so it runs on every `make test`.
"""
from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, Phase, given, settings

TOTAL_SECONDS = float(os.environ.get("STACKD_FUZZ_SECONDS", "60"))


def fuzz(strategy, check, *, seconds: float, batch: int = 50, shrink: bool = True) -> int:
    """Run `check(value)` on values drawn from `strategy` for about `seconds` (at least one
    batch); returns how many examples ran. `shrink=False` for a costly check: a failure is
    then reported as found, not minimised."""
    @settings(max_examples=batch, deadline=None, database=None, print_blob=True,
              phases=(Phase.generate, Phase.shrink) if shrink else (Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one_batch(value) -> None:
        check(value)

    deadline = time.monotonic() + seconds
    batches = 0
    while batches == 0 or time.monotonic() < deadline:
        one_batch()
        batches += 1
    return batches * batch
