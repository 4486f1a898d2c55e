"""What a prompt's log-probabilities cost (echo with logprobs on /v1/completions, what
lm-evaluation-harness sends for every log-likelihood task): a 2,000-token prompt scored against
the same request without them, end to end through a real daemon and the default chat model.

    .venv/bin/python bench/prompt_logprobs.py [--rounds 7] [--tokens 2000] [--top 1]

Both requests generate one token; "scored" adds echo and logprobs (each prompt token's
log-probability and `--top` alternatives, in the prefill the request does anyway). Every request
starts with a token of its own, so no request finds another's prompt in the KV cache. The two
run in turn, in alternating order; medians over the rounds, and their ratio (the target: 1.2x
at most). Where the difference goes, from the engine's counters (/metrics): llama_decode (the
output layer over every prompt row, llama.cpp's copy of their logits) and the rest of the steps
(the rows' log-softmax and top n between two decodes, sampling, events).
"""
from __future__ import annotations

import argparse
import http.client
import os
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TEXT = ("The history of the river valley is long and varied. Farmers settled its banks, traders "
        "carried salt and cloth along its roads, and each spring the water rose over the fields. ")
CONFIG = ("[rate_limits]\ninference = 0\n[engine]\nslots = 1\ncontext_length = 4096\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--top", type=int, default=1, help="alternatives per token (logprobs)")
    args = parser.parse_args()

    from testing.daemon import Daemon
    with tempfile.TemporaryDirectory() as folder:
        daemon = Daemon(os.path.join(folder, "data"), CONFIG, models=True)
        try:
            run(daemon, args)
        finally:
            daemon.stop()


def run(daemon, args) -> None:
    def post(path: str, body: dict) -> dict:
        status, _, answer = daemon.request("POST", path, port="inference", body=body, key=daemon.admin_key)
        assert status == 200, answer
        return answer

    text_tokens = post("/tokenize", {"prompt": TEXT * (args.tokens // 20)})["tokens"][:args.tokens - 1]
    assert len(text_tokens) == args.tokens - 1, "the text is too short"
    first = iter(range(1000, 100000))

    def cpu_seconds() -> float:
        """CPU time of the daemon and its children (the engine worker): what the request cost,
        whatever else the machine was doing meanwhile."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                fields = open(f"/proc/{name}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(name) == daemon.proc.pid or int(fields[1]) == daemon.proc.pid:
                total += int(fields[11]) + int(fields[12])        # utime, stime
        return total / ticks

    def engine_ms() -> tuple[float, float]:
        """The engine's milliseconds so far: in llama_decode, and in the rest of its steps."""
        conn = http.client.HTTPConnection("127.0.0.1", daemon.cluster_port, timeout=10)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {daemon.admin_key}"})
        text = conn.getresponse().read().decode()
        counts = {"decode": 0.0, "rest": 0.0}
        for m in re.finditer(r"^stackd_engine_t_(\w+)_us_total\{[^}]*\} (\S+)$", text, re.M):
            counts["decode" if m.group(1) == "decode" else "rest"] += float(m.group(2)) / 1000
        return counts["decode"], counts["rest"]

    def timed(scored: bool) -> tuple[float, float, float, float]:
        body = {"model": "smollm2-135m-instruct", "prompt": [next(first), *text_tokens], "max_tokens": 1,
                "temperature": 0}
        if scored:
            body.update(echo=True, logprobs=args.top)
        (d0, r0), t0, c0 = engine_ms(), time.perf_counter(), cpu_seconds()
        answer = post("/v1/completions", body)
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        d1, r1 = engine_ms()
        assert answer["usage"]["prompt_tokens"] == args.tokens
        if scored:
            assert len(answer["choices"][0]["logprobs"]["token_logprobs"]) >= args.tokens
        return elapsed, cpu, (d1 - d0) / 1000, (r1 - r0) / 1000

    timed(False), timed(True)                       # warm up: first allocations, page faults
    plain, scored = [], []
    for i in range(args.rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        for kind in order:
            (scored if kind else plain).append(timed(kind))
    print(f"prompt {args.tokens} tokens, {args.rounds} rounds, logprobs={args.top}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for label, index in (("wall", 0), ("CPU", 1), ("engine, llama_decode", 2), ("engine, rest of the steps", 3)):
        p = statistics.median(x[index] for x in plain)
        s = statistics.median(x[index] for x in scored)
        print(f"  {label}: without prompt logprobs {p * 1000:.0f} ms, with {s * 1000:.0f} ms "
              f"(medians; all: {', '.join(f'{x[index] * 1000:.0f}' for x in plain)} / "
              f"{', '.join(f'{x[index] * 1000:.0f}' for x in scored)}): "
              + (f"{s / p:.3f}x (target <= 1.2x)" if index < 2 else f"+{(s - p) * 1000:.0f} ms"))


if __name__ == "__main__":
    main()
