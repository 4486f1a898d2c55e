"""One process's greedy generations with graph fusion on and then off (kernels/src/fusion.h),
for test_fusion.py: two threads (the fused nodes' shares cross threads), each prompt alone, 16
streams sharing every step, and one long prompt (its prefill on ggml's tiled paths).

    python -m tests.kernels.fusion_run [MAX_TOKENS]

Prints JSON: per mode, the nodes fused away and every generation's [id, logprob] tokens.
"""
from __future__ import annotations

import json
import sys

from stackd.engine import accel
from tests.kernels.greedy_run import STREAMS, generate, prompts

LONG_PROMPT_WORDS = 400


def run(fusion: bool, max_tokens: int) -> dict:
    from stackd.engine.core import Engine
    from stackd.store import defaults
    accel.set_fusion(fusion)
    before = accel.fused_nodes()
    engine = Engine(defaults.smollm2_path(), slots=STREAMS, context_length=1024, batch=256, threads=2,
                    flash_attn=1)
    batch = prompts(engine, STREAMS)
    long_prompt = engine.tokenize("<|im_start|>user\nSummarize: " + " ".join(
        f"item {i} is {'red' if i % 3 else 'blue'}," for i in range(LONG_PROMPT_WORDS // 4)) +
        "<|im_end|>\n<|im_start|>assistant\n", False, True)
    out = {
        "alone": [generate(engine, [p], max_tokens, 1 + i)[0] for i, p in enumerate(batch[:4])],
        "together": generate(engine, batch, max_tokens, 100),
        "long": generate(engine, [long_prompt], max_tokens, 200)[0],
        "long_prompt_tokens": len(long_prompt),
    }
    engine.close()
    out["fused"] = accel.fused_nodes() - before
    return out


def main() -> None:
    max_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    path = accel.register("auto")
    print(json.dumps({"path": path, "on": run(True, max_tokens), "off": run(False, max_tokens)}))


if __name__ == "__main__":
    main()
