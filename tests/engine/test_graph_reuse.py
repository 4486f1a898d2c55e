"""A decode step reuses the previous step's graph when the batch's shape allows (llama.cpp's
graph reuse: no rebuild, no reallocation, only new inputs), with our kernels' nodes swapped in
and fused each compute as before; `engine.stats()["n_graphs_reused"]` counts those steps
(`stackd_engine_graphs_reused_total`). The answer is the same with reuse off
(LLAMA_GRAPH_REUSE_DISABLE, bench/roofline.py --graph-reuse off is the A/B).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = r"""
import json, select, sys
from stackd.engine import accel
accel.register(sys.argv[1])
from stackd.engine.core import Engine, SamplingParams, STATUS_RUNNING
from stackd.store import defaults
engine = Engine(defaults.smollm2_path(), slots=2, context_length=256, batch=64, threads=2, flash_attn=1,
                speculative_draft_max=0)
params = SamplingParams()
params.temperature = 0.0
params.ignore_eos = True
before = engine.stats()
engine.submit(1, engine.tokenize("The capital of France is", False, True), 24, [], params)
text, n, done = b"", 0, False
while not done:
    select.select([engine.fileno()], [], [])
    for event in engine.take_events():
        text += event.text
        n += event.n_tokens
        done = done or event.status != STATUS_RUNNING
after = engine.stats()
print(json.dumps({"text": text.decode(), "n_tokens": n, **{k: after[k] - before[k] for k in ("n_steps", "n_graphs_reused")}}))
engine.close()
"""


def run(kernels: str, reuse: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_GRAPH_REUSE_DISABLE"}
    if not reuse:
        env["LLAMA_GRAPH_REUSE_DISABLE"] = "1"
    out = subprocess.run([sys.executable, "-c", SCRIPT, kernels], cwd=ROOT, check=True, capture_output=True,
                         text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kernels", ["auto", "off"])
def test_decode_steps_reuse_the_graph_and_answer_the_same(kernels):
    reused, rebuilt = run(kernels, True), run(kernels, False)
    assert reused["n_tokens"] == 24 and reused["text"] == rebuilt["text"]
    # the prompt's step and the first decode step build their graphs; every later step of the
    # same shape (one token, one stream) reuses the one before
    assert reused["n_steps"] == 24
    assert reused["n_graphs_reused"] >= reused["n_steps"] - 2
    assert rebuilt["n_graphs_reused"] == 0
