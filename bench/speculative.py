"""Draftless speculative decoding (prompt lookup, engine.speculative): tokens/s with drafting on
against off, on the same model, in one process with our kernels registered as the daemon does.

Workloads that copy from the prompt, as devices are asked to: extract from a given text, fill
JSON from it, edit code. Greedy, so the two engines must give the same bytes (checked every
round). Single stream: one request at a time, tokens/s = generated tokens over the time from
submit to the last event (prefill included, identical in both). 16 clients: 16 requests at once
(the same workloads, round robin), total generated tokens over the wall time: the step budget
(engine.speculative_step_tokens) turns drafting off there, so the two should be equal.

    .venv/bin/python bench/speculative.py [--rounds 5] [--max-tokens 200] [--clients 16]

Rounds alternate on and off; the figures are the medians of the per-round ratios.
"""
from __future__ import annotations

import argparse
import os
import select
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TEXT = ("Invoice 2291 from Nordlicht Logistics GmbH, dated 3 February 2025, bills Harbor Foods Ltd "
        "for 14 pallets of frozen goods shipped from Hamburg to Rotterdam on 28 January. The net "
        "amount is 8,420.00 EUR, VAT at 19 percent is 1,599.80 EUR, and the total due is 10,019.80 "
        "EUR, payable within 30 days to IBAN DE44 5001 0517 5407 3249 31. Contact: Mara Jensen, "
        "accounts receivable, phone +49 40 555 0192.")
CODE = ("def load_orders(path):\n    orders = []\n    with open(path) as handle:\n"
        "        for line in handle:\n            fields = line.strip().split(',')\n"
        "            orders.append({'id': int(fields[0]), 'customer': fields[1], "
        "'amount': float(fields[2])})\n    return orders\n\n\n"
        "def total_amount(orders):\n    total = 0.0\n    for order in orders:\n"
        "        total += order['amount']\n    return total\n")
WORKLOADS = {
    "extract": f"Copy the sentence about the amounts from this text, word for word:\n\n{TEXT}",
    "json": ("Extract the invoice number, sender, recipient, net amount, VAT, total and IBAN from "
             f"this text as a JSON object:\n\n{TEXT}"),
    "code_edit": ("Rename the function load_orders to read_orders and the variable orders to rows "
                  f"everywhere, and return the whole code:\n\n{CODE}"),
}


def chat(engine, text: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", False, True)


def run(engine, prompts: list[list[int]], max_tokens: int, first_id: int) -> tuple[float, list[bytes], int, int]:
    from stackd.engine.core import STATUS_RUNNING, SUBMIT_ACCEPTED, SamplingParams
    params = SamplingParams()
    params.temperature = 0.0
    ids = list(range(first_id, first_id + len(prompts)))
    texts = {rid: b"" for rid in ids}
    n_generated = {}
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        assert engine.submit(rid, prompt, max_tokens, [], params) == SUBMIT_ACCEPTED
    pending = set(ids)
    while pending:
        select.select([engine.fileno()], [], [])
        for event in engine.take_events():
            texts[event.id_request] += event.text
            if event.status != STATUS_RUNNING:
                n_generated[event.id_request] = event.n_generated
                pending.discard(event.id_request)
    wall = time.perf_counter() - start
    return wall, [texts[rid] for rid in ids], sum(n_generated.values()), len(ids)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--draft-max", type=int, default=8)
    args = ap.parse_args()
    sys.path.insert(0, ROOT)
    from stackd.engine import accel
    path = accel.register("auto")
    from stackd.engine.core import Engine
    from stackd.store import defaults

    engines = {mode: Engine(defaults.smollm2_path(), slots=args.clients, context_length=1024, batch=512,
                            speculative_draft_max=args.draft_max if mode == "on" else 0)
               for mode in ("on", "off")}
    prompts = {name: chat(engines["on"], text) for name, text in WORKLOADS.items()}
    for engine in engines.values():                      # warm up, and fill the prefix caches alike
        run(engine, list(prompts.values()), 8, 1)
    ratios = {name: [] for name in prompts}
    ratios["clients"] = []
    speeds = {key: {"on": [], "off": []} for key in ratios}
    identical = True
    next_id = 100
    for rnd in range(args.rounds):
        order = ("on", "off") if rnd % 2 == 0 else ("off", "on")
        for name, prompt in prompts.items():
            texts = {}
            for mode in order:
                wall, out, n, _ = run(engines[mode], [prompt], args.max_tokens, next_id)
                next_id += 10
                speeds[name][mode].append(n / wall)
                texts[mode] = out
            identical &= texts["on"] == texts["off"]
            ratios[name].append(speeds[name]["on"][-1] / speeds[name]["off"][-1])
        batch = [list(prompts.values())[i % len(prompts)] for i in range(args.clients)]
        for mode in order:
            wall, _, n, _ = run(engines[mode], batch, args.max_tokens, next_id)
            next_id += args.clients + 10
            speeds["clients"][mode].append(n / wall)
        ratios["clients"].append(speeds["clients"]["on"][-1] / speeds["clients"]["off"][-1])
        print(f"round {rnd + 1}: " + ", ".join(f"{k} x{v[-1]:.2f}" for k, v in ratios.items()), flush=True)
    stats = engines["on"].stats()
    print(f"\nkernels: {path}; draft max {args.draft_max}; {args.rounds} rounds, medians")
    print(f"{'workload':<12} {'on tok/s':>9} {'off tok/s':>9} {'ratio':>6}")
    for key in ratios:
        label = key if key != "clients" else f"{args.clients} clients"
        print(f"{label:<12} {statistics.median(speeds[key]['on']):9.1f} "
              f"{statistics.median(speeds[key]['off']):9.1f} {statistics.median(ratios[key]):6.2f}")
    drafted, accepted = stats["n_draft_tokens"], stats["n_draft_accepted_tokens"]
    print(f"drafted {drafted}, accepted {accepted} ({accepted / max(drafted, 1):.0%}); "
          f"greedy output byte-identical on vs off: {identical}")
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
