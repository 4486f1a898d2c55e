"""The node's recent requests, for the console's dashboard: a bounded ring of what each
inference request was (time, route, model, key name, prompt and generated tokens, time to
first token, duration, status), never its prompt or its answer. One per daemon process."""
from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

CAPACITY = 200


@dataclass(slots=True)
class Finished:
    time: float                     # epoch seconds when it arrived
    route: str
    model: str | None
    key: str | None                 # the key's name, never the key
    prompt_tokens: int | None
    generated_tokens: int | None
    ttft_ms: float | None
    duration_ms: float
    status: int


class RecentRequests:
    def __init__(self, capacity: int = CAPACITY):
        self.kept: deque[Finished] = deque(maxlen=capacity)
        self.recording = False          # set once an inference table records into it

    def add(self, finished: Finished) -> None:
        self.kept.append(finished)

    def newest(self, limit: int) -> list[dict]:
        return [asdict(f) for f in list(self.kept)[-limit:][::-1]]


RECENT = RecentRequests()
