"""Validation cost of a typical chat request: params.parse + messages_of, CPU time per request.

Run it on two checkouts to compare (both functions exist since the first release):
    .venv/bin/python bench/validation.py
"""
from __future__ import annotations

import time
import timeit

from stackd.api.inference import chat, params

BODY = {
    "model": "smollm2-135m-instruct",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hello there, how are you?"},
        {"role": "assistant", "content": "Fine."},
        {"role": "user", "content": [{"type": "text", "text": "Tell me a joke."}]},
    ],
    "temperature": 0.7, "max_tokens": 64, "top_p": 0.9, "stream": True,
    "stream_options": {"include_usage": True}, "stop": ["\n\n"], "seed": 42,
}


def per_call_us(fn, number: int = 20000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7, timer=time.process_time)) / number * 1e6


def main() -> None:
    parse = per_call_us(lambda: params.parse(BODY, n_vocab=49152, chat=True))
    messages = per_call_us(lambda: chat.messages_of(BODY))
    print(f"params.parse {parse:.2f} us, messages_of (4 messages) {messages:.2f} us, "
          f"total {parse + messages:.2f} us per chat request (CPU time)")


if __name__ == "__main__":
    main()
