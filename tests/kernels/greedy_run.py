"""One process's greedy generations, for test_model.py (kernel registration is per process).

    python -m tests.kernels.greedy_run MODE N_PROMPTS MAX_TOKENS [FLASH_ATTN]
    python -m tests.kernels.greedy_run score MODE < sequences.json
MODE is engine.kernels (auto | off) or a path name; GREEDY_RUN_MODEL names another GGUF than
the default chat model (test_model_k_quants.py's Q4_K_M file). Prints JSON: the path in use;
the weights on our kernels per type; for each
prompt, generated alone (one stream) and with 16 streams sharing each step, every token as
[id, logprob, [[id, logprob] of the top alternatives]]; and whether the token embedding table
was read on our device (kernels/src/get_rows.h).

`score` reads {"sequences": [token ids after prompt i, ...]} and, teacher-forced, prints for
each prompt and each position j the top alternatives after the prompt and its first j tokens
(one 1-token request per position; the engine reuses the cached prefix).
"""
from __future__ import annotations

import json
import os
import select
import sys

from stackd.engine import accel
from testing import kernels_check

TOPICS = ["the sea", "a mountain", "bread", "the moon", "rain", "a city", "music", "a river",
          "winter", "a library", "coffee", "a garden", "trains", "the desert", "a lighthouse",
          "bees", "a forest", "snow", "a market", "the stars"]
STREAMS = 16
TOP_LOGPROBS = 5


def prompts(engine, n: int) -> list[list[int]]:
    return [engine.tokenize(f"<|im_start|>user\nWrite a long story about {topic}.<|im_end|>\n"
                            "<|im_start|>assistant\n", False, True) for topic in TOPICS[:n]]


def generate(engine, batch: list[list[int]], max_tokens: int, first_id: int) -> list[list]:
    from stackd.engine.core import STATUS_RUNNING, SUBMIT_ACCEPTED, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    params.ignore_eos = True
    params.logprobs = True
    params.n_top_logprobs = TOP_LOGPROBS
    ids = list(range(first_id, first_id + len(batch)))
    for rid, prompt in zip(ids, batch):
        assert engine.submit(rid, prompt, max_tokens, [], params) == SUBMIT_ACCEPTED
    tokens = {rid: [] for rid in ids}
    pending = set(ids)
    while pending:
        select.select([engine.fileno()], [], [])
        for event in engine.take_events():
            tokens[event.id_request] += [[token, logprob, [[alt, alt_logprob] for alt, alt_logprob, _ in top]]
                                         for token, logprob, _, top in event.logprobs or []]
            if event.status != STATUS_RUNNING:
                pending.discard(event.id_request)
    return [tokens[rid] for rid in ids]


def open_engine(mode: str, flash_attn: int = -1):
    path = accel.register(mode)  # before the model loads
    from stackd.engine.core import Engine
    from stackd.store import defaults
    # One thread: the comparison is of our matmul with ggml's, which no thread count changes
    # (test_ops.py runs both on two threads); one thread keeps 2,560 single-stream steps
    # from waiting on thread barriers when the machine is busy.
    model = os.environ.get("GREEDY_RUN_MODEL") or defaults.smollm2_path()
    return path, Engine(model, slots=STREAMS, context_length=512, batch=256,
                        threads=1, flash_attn=flash_attn)


def score(mode: str) -> None:
    sequences = json.load(sys.stdin)["sequences"]
    _, engine = open_engine(mode)
    scored = []
    for i, (prompt, sequence) in enumerate(zip(prompts(engine, len(sequences)), sequences)):
        scored.append([generate(engine, [prompt + sequence[:j]], 1, 1 + 1000 * i + j)[0][0][2]
                       for j in range(len(sequence))])
    engine.close()
    print(json.dumps({"scored": scored}))


def main(mode: str, n_prompts: int, max_tokens: int, flash_attn: int = -1) -> None:
    path, engine = open_engine(mode, flash_attn)
    batch = prompts(engine, n_prompts)
    alone = [generate(engine, [p], max_tokens, 1 + i)[0] for i, p in enumerate(batch)]
    together = []
    for start in range(0, len(batch), STREAMS):
        together += generate(engine, batch[start:start + STREAMS], max_tokens, 1000 + start)
    tensors = accel.tensors()
    engine.close()
    table_ours = bool(path) and kernels_check.get_rows_nodes() > 0
    print(json.dumps({"path": path, "alone": alone, "together": together, "table_ours": table_ours,
                      "tensors": tensors}))


if __name__ == "__main__":
    if sys.argv[1] == "score":
        score(sys.argv[2])
    else:
        main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *(int(a) for a in sys.argv[4:5]))
