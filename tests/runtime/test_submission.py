"""A prompt sent as text (engine/submission.py, engine/submit.py): tokenized where the vocabulary
is, checked against the context at its edges, every choice taken or none, in one verdict. The
engine here is a fake with a vocabulary of one token per character (the layer under test is the
submit, not llama.cpp)."""
from __future__ import annotations

import pytest

from stackd.engine.core import SUBMIT_ACCEPTED, SUBMIT_QUEUE_FULL, SamplingParams
from stackd.engine.submission import TextJobs, Unfit, fit_error, room
from stackd.engine.submit import VERDICT_UNFIT, VERDICT_UNTOKENIZABLE, jobs_of_text, submit_text


class CharEngine:
    """One token per character (its code point); a queue with `room` places (None: no end),
    taking a request's jobs all or none as the native engine's submit_all does."""

    def __init__(self, room: int | None = None):
        self.submitted, self.cancelled, self.room = [], [], room

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        if "\0" in text:
            raise ValueError("a NUL")
        return ([1] if add_special else []) + [ord(c) for c in text]

    def submit_all(self, jobs, stop, owner):
        if self.room is not None and len(self.submitted) + len(jobs) > self.room:
            return SUBMIT_QUEUE_FULL
        self.submitted += [(rid, list(prompt), max_tokens, sampling) for rid, prompt, max_tokens, sampling in jobs]
        return SUBMIT_ACCEPTED

    def cancel(self, rid):
        self.cancelled.append(rid)


def text_jobs(text: str, n: int = 1, max_tokens=None, context: int = 8, **kw) -> TextJobs:
    return TextJobs(text, [SamplingParams() for _ in range(n)], max_tokens, context, "messages", **kw)


def test_a_prompt_fits_up_to_one_token_short_of_the_context():
    assert fit_error(7, 8, "messages") is None
    assert fit_error(8, 8, "messages")[0] is Unfit.TOO_LONG
    assert fit_error(0, 8, "prompt") == (Unfit.EMPTY, "the prompt is empty after tokenization")
    assert "context is 8 tokens, but the messages has 9 tokens" in fit_error(9, 8, "messages")[1]


def test_room_is_max_tokens_cut_at_the_context():
    assert room(5, None, 8) == 3 and room(5, 2, 8) == 2 and room(5, 10, 8) == 3 and room(7, 1, 8) == 1


def test_a_text_is_tokenized_checked_and_every_choice_submitted():
    engine = CharEngine()
    answer = submit_text(engine, [11, 12], text_jobs("abcde", n=2), [], 0)
    assert answer == {"verdict": SUBMIT_ACCEPTED, "error": None, "n_prompt": 5}
    assert [(rid, prompt, max_tokens) for rid, prompt, max_tokens, _ in engine.submitted] == [
        (11, [97, 98, 99, 100, 101], 3), (12, [97, 98, 99, 100, 101], 3)]


@pytest.mark.parametrize("text, unfit", [("", Unfit.EMPTY), ("abcdefgh", Unfit.TOO_LONG)])
def test_an_unfit_prompt_is_refused_before_anything_is_submitted(text, unfit):
    engine = CharEngine()
    answer = submit_text(engine, [1], text_jobs(text), [], 0)
    assert answer["verdict"] == VERDICT_UNFIT and answer["unfit"] == unfit.value and not engine.submitted


def test_the_longest_prompt_that_fits_leaves_one_token():
    engine = CharEngine()
    assert submit_text(engine, [1], text_jobs("abcdefg"), [], 0)["n_prompt"] == 7
    assert engine.submitted[0][2] == 1


def test_add_special_counts_toward_the_fit():
    assert submit_text(CharEngine(), [1], text_jobs("abcdefg", add_special=True), [], 0)["verdict"] == VERDICT_UNFIT


def test_a_request_whose_choices_do_not_all_fit_takes_none():
    engine = CharEngine(room=2)
    answer = submit_text(engine, [1, 2, 3], text_jobs("ab", n=3), [], 0)
    assert answer["verdict"] == SUBMIT_QUEUE_FULL and engine.submitted == [] and engine.cancelled == []
    assert submit_text(engine, [4, 5], text_jobs("ab", n=2), [], 0)["verdict"] == SUBMIT_ACCEPTED


def test_the_thinking_end_and_the_grammar_prefill_become_every_choices_tokens():
    engine = CharEngine()
    jobs = text_jobs("hi", n=2, reasoning_forced="</t>", grammar_prefill="G")
    submit_text(engine, [1, 2], jobs, [], 0)
    for _, _, _, sampling in engine.submitted:
        assert list(sampling.reasoning_forced) == [ord(c) for c in "</t>"]
        assert list(sampling.grammar_prefill) == [ord("G")]


def test_a_vocabulary_that_fails_is_the_requests_error_not_the_workers():
    answer = jobs_of_text(CharEngine(), text_jobs("a\0b"))
    assert answer["verdict"] == VERDICT_UNTOKENIZABLE and "NUL" in answer["error"]


def test_the_header_round_trips_what_the_worker_needs():
    jobs = text_jobs("x", max_tokens=4, context=99, add_special=True, reasoning_forced="</t>")
    again = TextJobs.from_header(jobs.header(), "x", jobs.samplings)
    assert (again.max_tokens, again.context_length, again.what, again.add_special, again.parse_special,
            again.reasoning_forced, again.grammar_prefill) == (4, 99, "messages", True, True, "</t>", None)


class WorkerEngine(CharEngine):
    """What engine/worker.py's Worker needs of an engine, beside the vocabulary and submit."""

    def __init__(self):
        super().__init__()
        self.frames = []

    def attach_sink(self, fd):
        pass

    def send_frame(self, data: bytes):
        self.frames.append(data)


def worker_verdicts(engine) -> list[dict]:
    from stackd.engine.wire import FrameReader
    reader = FrameReader()
    return [message for data in engine.frames for message, _ in reader.feed(data)]


def submit_text_frame(ids, context=1 << 20) -> dict:
    return {"op": "submit_text", "seq": 7, "stop": [], "owner": 0, "ids": ids,
            "samplings": [{} for _ in ids], **text_jobs("", context=context).header()}


def test_the_worker_answers_a_text_submit_with_the_verdict_and_the_prompts_tokens():
    import socket
    from stackd.engine.worker import Worker
    ours, theirs = socket.socketpair()
    engine = WorkerEngine()
    worker = Worker(ours, engine)
    worker.handle(submit_text_frame([5]), b"hello")
    (verdict,) = worker_verdicts(engine)
    assert verdict == {"op": "verdict", "seq": 7, "verdict": SUBMIT_ACCEPTED, "error": None, "n_prompt": 5}
    ours.close(), theirs.close()


def test_a_cancel_that_comes_while_a_long_prompt_is_tokenized_still_cancels_it():
    """A long text is tokenized beside the worker's loop; the daemon's cancel for its ids can
    arrive before the submit happens (a no-op for the engine then): the worker cancels it again
    right after the submit, so a client gone during the tokenizing holds no slot."""
    import socket
    from stackd.engine.worker import ON_LOOP_BYTES, Worker
    ours, theirs = socket.socketpair()
    engine = WorkerEngine()
    worker = Worker(ours, engine)
    worker.handle(submit_text_frame([5]), b"a" * (ON_LOOP_BYTES + 1))
    worker.handle({"op": "cancel", "id": 5})
    worker.beside.shutdown(wait=True)
    worker.send_answers()
    assert [rid for rid, *_ in engine.submitted] == [5] and engine.cancelled == [5, 5]
    (verdict,) = worker_verdicts(engine)
    assert verdict["verdict"] == SUBMIT_ACCEPTED and verdict["n_prompt"] == ON_LOOP_BYTES + 1
    assert worker.tokenizing == {}
    ours.close(), theirs.close()
