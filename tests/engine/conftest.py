import select

import pytest

from stackd.engine.core import STATUS_RUNNING, SUBMIT_ACCEPTED, Engine, SamplingParams
from stackd.store import defaults


class Driver:
    """Runs engine requests to completion by watching its eventfd, as the event loop does."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.next_id = 1

    def submit(self, prompt, max_tokens=32, stop=(), owner=0, **sampling) -> int:
        params = SamplingParams()
        params.temperature = 0.0
        for name, value in sampling.items():
            setattr(params, name, value)
        rid = self.next_id
        self.next_id += 1
        assert self.engine.submit(rid, list(prompt), max_tokens, list(stop), params, owner) == SUBMIT_ACCEPTED
        return rid

    def wait(self, ids, timeout=120.0, on_event=None) -> dict:
        results = {rid: {"text": b"", "events": [], "status": None} for rid in ids}
        pending = set(ids)
        while pending:
            ready, _, _ = select.select([self.engine.fileno()], [], [], timeout)
            assert ready, f"no events for {pending}"
            for event in self.engine.take_events():
                if event.id_request not in results:
                    continue
                result = results[event.id_request]
                result["text"] += event.text
                result["events"].append(event)
                if on_event:
                    on_event(event)
                if event.status != STATUS_RUNNING:
                    result["status"] = event.status
                    pending.discard(event.id_request)
        return results


@pytest.fixture(scope="session")
def chat_engine():
    engine = Engine(defaults.smollm2_path(), slots=16, context_length=512, batch=256)
    yield engine
    engine.close()


@pytest.fixture
def driver(chat_engine):
    return Driver(chat_engine)


def chat_prompt(engine, text: str) -> list[int]:
    return engine.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", False, True)
