"""A stopped recording hands its records out a chunk at a time (Engine.trace_stop returns
TraceRecords): an inline engine's trace is turned into dicts between turns of the loop, not
in one call holding the GIL."""
from stackd.engine.wire import TRACE_CHUNK, chunks_of

from .conftest import chat_prompt


def test_records_are_taken_in_order_and_only_once(chat_engine, driver):
    assert chat_engine.trace_start()
    rid = driver.submit(chat_prompt(chat_engine, "Say hello."), max_tokens=8)
    driver.wait([rid])
    records = chat_engine.trace_stop()
    n = len(records)
    assert n > 8                                   # a step per token at least, and the request
    first = records.take(1)
    rest = records.take(n)
    assert len(first) == 1 and len(rest) == n - 1
    assert records.take(n) == []                   # taken once
    assert any(r["kind"] == "request" and r["id_request"] == rid for r in first + rest)
    assert len(records) == n                       # len() is the recording's size, taken or not


def test_chunks_of_a_recording_are_at_most_a_chunk_and_cover_it(chat_engine, driver):
    assert chat_engine.trace_start()
    ids = [driver.submit(chat_prompt(chat_engine, f"Count to {i}."), max_tokens=16) for i in range(4)]
    driver.wait(ids)
    records = chat_engine.trace_stop()
    chunks = list(chunks_of(records))
    assert all(0 < len(c) <= TRACE_CHUNK for c in chunks)
    assert sum(len(c) for c in chunks) == len(records)
