"""The tensor split's pieces together, before the engine has them: nodes (threads of this
process, each with its own shard and its own sockets) run the default model's forward pass on
their shards in numpy, exchanging each layer's two partial sums over a real mesh
(tests/cluster/tp_reference.py). Every node ends with the same logits, bit for bit, and they
are the whole model's (same numpy, one node) up to float32 summation order; the whole model's
in numpy picks llama.cpp's greedy token. This is the oracle the engine's lockstep path will be
held to."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from stackd.cluster import shard
from stackd.engine.exchange import Mesh, listen
from stackd.store import defaults

from . import tp_reference as ref

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tokens():
    from llama_cpp import Llama
    model = Llama(model_path=defaults.smollm2_path(), n_ctx=64, n_threads=1, logits_all=True, verbose=False)
    try:
        toks = model.tokenize(PROMPT.encode())
        model.eval(toks)
        yield toks, np.array(model.scores[len(toks) - 1])
    finally:
        model.close()


@pytest.fixture(scope="module")
def whole():
    return ref.Weights(defaults.smollm2_path())


def test_the_numpy_model_picks_llama_cpps_greedy_token(whole, tokens):
    toks, llama_logits = tokens
    ours = ref.forward(whole, toks)
    assert int(ours.argmax()) == int(llama_logits.argmax())
    top = np.argsort(-llama_logits)[:5]
    # llama.cpp quantizes the activations of a Q4_1 matmul to 8 bits; numpy does not
    assert np.abs(ref.log_softmax(ours)[top] - ref.log_softmax(llama_logits)[top]).max() < 0.5


@pytest.mark.parametrize("weights", [(1, 1), (1, 1, 1)])
def test_nodes_on_their_shards_exchanging_partial_sums_compute_the_whole_models_logits(
        whole, tokens, tmp_path, weights):
    toks, _ = tokens
    _, paths = shard.write_shards(defaults.smollm2_path(), list(weights), str(tmp_path))
    n = len(paths)
    listeners = [listen() for _ in range(n)]
    meshes = [Mesh(i, [s.getsockname() for s in listeners], b"k" * 32, "tp", listeners[i], deadline=120.0)
              for i in range(n)]
    logits, errors = [None] * n, []

    def node(i: int) -> None:
        try:
            shard_weights = ref.Weights(paths[i])
            meshes[i].connect(timeout=120.0)
            step = iter(range(1 << 30))
            logits[i] = ref.forward(shard_weights, toks,
                                    lambda partial: meshes[i].allreduce(next(step), partial))
        except Exception as exc:          # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=node, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
    finally:
        for mesh in meshes:
            mesh.close()
    assert not errors, errors
    assert all(m.exchanges == 2 * whole.hp.n_layer for m in meshes)
    assert all(lg.tobytes() == logits[0].tobytes() for lg in logits)      # every node the same bits
    one = ref.forward(whole, toks)
    assert int(logits[0].argmax()) == int(one.argmax())
    assert np.abs(ref.log_softmax(logits[0]) - ref.log_softmax(one)).max() < 1e-3
