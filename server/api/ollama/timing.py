"""The fields Ollama's final object carries, from the engine's own clock: durations in
nanoseconds (the engine's Timings are microseconds), and `created_at` in RFC 3339."""
from __future__ import annotations

import time
from datetime import datetime, timezone


def created_at() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def head(model_name: str) -> dict:
    """What every object of a chat or generate answer starts with."""
    return {"model": model_name, "created_at": created_at()}


def rfc3339(unix_seconds: float) -> str:
    return datetime.fromtimestamp(unix_seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def final_fields(choice, started_ns: int, load_ns: int) -> dict:
    """total_duration (the request, arrival to last token), load_duration (getting the model),
    prompt_eval_* (the prompt's tokens and prefill), eval_* (the generated tokens and their
    decode). A choice without timings (ended before the engine ran it) reports zeros."""
    t = choice.timings
    return {"total_duration": time.monotonic_ns() - started_ns, "load_duration": load_ns,
            "prompt_eval_count": choice.n_prompt,
            "prompt_eval_duration": t.t_prompt_us * 1000 if t is not None else 0,
            "eval_count": choice.n_generated,
            "eval_duration": t.t_predicted_us * 1000 if t is not None else 0}


DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


def done_reason(finish: str | None) -> str:
    return DONE_REASONS.get(finish or "stop", "stop")
