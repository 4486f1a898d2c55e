"""llama-server's `timings` object for a response, from the engine's own clock.

Each choice's finishing event carries its durations (server._engine.Timings, microseconds).
A response with several choices reports them together: token counts add up, and the
durations are those of the slowest choice (the whole response waited for it), except the
first token, which is the earliest the client saw.
"""
from __future__ import annotations


def _per_second(n: int, ms: float) -> float:
    return round(n * 1000.0 / ms, 3) if ms > 0 else 0.0


def timings(choices: list, prompts_counted: list[int]) -> dict | None:
    """choices: responses.Choice with `.timings` (a Timings or None), n_prompt, n_cached,
    n_generated; prompts_counted: the choice index that counts each distinct prompt once."""
    known = [c.timings for c in choices if c.timings is not None]
    if not known:
        return None
    prompt_n = sum(choices[i].n_prompt - choices[i].n_cached for i in prompts_counted)
    cache_n = sum(choices[i].n_cached for i in prompts_counted)
    predicted_n = sum(c.n_generated for c in choices)
    prompt_ms = max(t.t_prompt_us for t in known) / 1000.0
    predicted_ms = max(t.t_predicted_us for t in known) / 1000.0
    return {
        "queue_ms": max(t.t_queue_us for t in known) / 1000.0,
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_second": _per_second(prompt_n, prompt_ms),
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_second": _per_second(max(predicted_n - len(known), 0), predicted_ms),
        "first_token_ms": min(t.t_first_token_us for t in known) / 1000.0,
        # draftless speculative decoding (llama-server's names): drafted tokens and accepted ones
        "draft_n": sum(t.n_drafted for t in known),
        "draft_n_accepted": sum(t.n_draft_accepted for t in known),
    }
