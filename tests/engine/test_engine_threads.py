"""Every graph of an engine's lane runs on the lane's own thread, the warm-up at load included.

ggml's CPU backend computes a graph on an OpenMP team of the calling thread. A warm-up decoded
on the constructing thread made a second team; libgomp, counting more of its threads than
cores, then cut its spinning at barriers to a few hundred turns, and every node of every step
slept and was woken: one stream decoded at an eighth of its speed on a quiet two-core VM
(native/engine/engine.cpp, start_lanes). The process's threads tell: a lane's thread and its
team's workers (threads - 1), and no second team's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, os, select, sys
from stackd.engine import accel
accel.register(sys.argv[2])
from stackd.engine.core import Engine, SamplingParams, STATUS_RUNNING
from stackd.store import defaults
count = lambda: len(os.listdir(f"/proc/{os.getpid()}/task"))
before = count()
engine = Engine(defaults.smollm2_path(), slots=2, context_length=256, batch=64, threads=int(sys.argv[1]),
                flash_attn=1)
loaded = count()
params = SamplingParams()
params.temperature = 0.0
engine.submit(1, engine.tokenize("Hello", False, True), 8, [], params)
done = False
while not done:
    select.select([engine.fileno()], [], [])
    done = any(event.status != STATUS_RUNNING for event in engine.take_events())
print(json.dumps({"before": before, "loaded": loaded, "served": count()}))
engine.close()
"""


@pytest.mark.parametrize("kernels", ["auto", "off"])
@pytest.mark.parametrize("threads", [2, 3])
def test_an_engine_adds_one_thread_and_one_team(threads, kernels):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(threads), kernels], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    counts = json.loads(out.strip().splitlines()[-1])
    # the lane's thread and its OpenMP team's threads - 1 workers; a warm-up on the caller's
    # thread would add threads - 1 more
    assert counts["loaded"] == counts["before"] + threads
    assert counts["served"] == counts["loaded"]
