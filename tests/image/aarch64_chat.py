"""Runs inside the arm64 root, under qemu-aarch64 (tests/image/test_aarch64_wheels.py copies it
there beside tests/kernels/greedy_run.py and testing/kernels_check.py): the default chat model's
greedy answers with engine.kernels MODE, from the stackd installed from dist-aarch64/.

    python aarch64_chat.py MODE N_PROMPTS MAX_TOKENS

Prints JSON: the path our kernels chose (None: ggml's), the ggml CPU variant this process loaded
(from its own mappings: the one the portable wheel's loader scored best for the emulated CPU),
and for each prompt its tokens alone and with the prompts sharing each step (greedy_run's form:
[id, logprob, top alternatives]), and its text.
"""
from __future__ import annotations

import json
import sys

import greedy_run


def loaded_cpu_variant() -> str | None:
    with open("/proc/self/maps") as f:
        for line in f:
            name = line.rsplit("/", 1)[-1].strip()
            if name.startswith("libggml-cpu-") and name.endswith(".so"):
                return name
    return None


def main(mode: str, n_prompts: int, max_tokens: int) -> None:
    path, engine = greedy_run.open_engine(mode)
    batch = greedy_run.prompts(engine, n_prompts)
    alone = [greedy_run.generate(engine, [p], max_tokens, 1 + i)[0] for i, p in enumerate(batch)]
    together = greedy_run.generate(engine, batch, max_tokens, 1000)
    texts = [b"".join(engine.piece(token, False) for token, _, _ in g).decode("utf-8", "replace")
             for g in alone]
    engine.close()
    print(json.dumps({"path": path, "ggml_cpu": loaded_cpu_variant(), "alone": alone,
                      "together": together, "texts": texts}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
