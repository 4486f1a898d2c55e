"""An engine worker's socket to the daemon (native/engine/frame_sink.h): the engine thread sends
each step's events itself, the worker's thread sends its own frames and the steps left to it,
and the daemon's FrameReader reads one ordered stream of whole frames."""
import select
import socket

import pytest

from stackd.store import defaults
from stackd.engine import wire
from stackd.engine.core import STATUS_RUNNING, Engine, SamplingParams

from .conftest import chat_prompt

pytestmark = pytest.mark.slow


@pytest.fixture
def wired():
    """A small engine with its sink on one end of a socketpair; the test reads the other."""
    ours, theirs = socket.socketpair()
    engine = Engine(defaults.smollm2_path(), slots=2, context_length=256)
    engine.attach_sink(theirs.fileno())
    yield engine, ours, theirs
    engine.close()
    ours.close()
    theirs.close()


def submit(engine, rid: int, text: str, n: int) -> None:
    sampling = SamplingParams()
    sampling.ignore_eos = True
    assert engine.submit(rid, chat_prompt(engine, text), n, [], sampling) == 0


def read_frames(sock, reader, timeout=120) -> list:
    ready, _, _ = select.select([sock], [], [], timeout)
    assert ready, "nothing came"
    return reader.feed(sock.recv(1 << 20))


def test_steps_reach_the_socket_with_no_relay_and_the_end_comes_through_the_relay(wired):
    engine, ours, _ = wired
    reader = wire.FrameReader()
    submit(engine, 1, "Tell me a story.", 6)
    events = []
    while len(events) < 5:              # the five running steps: nobody has called relay_events
        for header, tail in read_frames(ours, reader):
            assert header == {"op": "events"}
            events += wire.decode_events(tail)
    assert [e.status for e in events] == [STATUS_RUNNING] * 5
    ready, _, _ = select.select([engine.fileno()], [], [], 120)   # the end: left to the relay
    assert ready
    assert engine.relay_events() is True
    for header, tail in read_frames(ours, reader):
        events += wire.decode_events(tail)
    assert events[-1].status != STATUS_RUNNING
    assert sum(e.n_tokens for e in events) == 6 and {e.id_request for e in events} == {1}
    assert engine.relay_events() is False                          # nothing left


def test_frames_stay_whole_and_in_order_behind_a_socket_that_is_full(wired):
    """The daemon stops reading: both writers queue in the sink, and once it reads again every
    frame arrives whole, the worker's own in the order sent, each request's events in step order
    with its end last."""
    engine, ours, theirs = wired
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    submit(engine, 1, "Tell me a story.", 80)
    submit(engine, 2, "Name some colors.", 80)
    pad = bytes(range(256)) * 12
    for i in range(40):                  # ~120 kB: far past what the socket buffers
        engine.send_frame(wire.frame({"op": "ping", "i": i}, pad))
    assert engine.sink_pending()
    reader, pings, events, ended = wire.FrameReader(), [], {1: [], 2: []}, set()
    while ended != {1, 2}:
        ready, _, _ = select.select([ours, engine.fileno()], [], [], 120)
        assert ready, "stalled"
        if engine.fileno() in ready and engine.relay_events():
            engine.send_frame(wire.frame({"op": "ping", "i": len(pings) + 1000}))
        engine.flush_sink()
        if ours in ready:
            for header, tail in reader.feed(ours.recv(1 << 16)):
                if header["op"] == "ping":
                    pings.append(header["i"])
                    assert header["i"] >= 1000 or tail == pad
                    continue
                for event in wire.decode_events(tail):
                    assert event.id_request not in ended, "an event after its request's end"
                    events[event.id_request].append(event)
                    if event.status != STATUS_RUNNING:
                        ended.add(event.id_request)
    assert pings[:40] == list(range(40))
    for rid in (1, 2):
        generated = [e.n_generated for e in events[rid]]
        assert generated == sorted(generated) and generated[-1] == 80
        assert sum(e.n_tokens for e in events[rid]) == 80


def test_a_reader_that_is_gone_breaks_the_sink_and_not_the_engine(wired):
    engine, ours, _ = wired
    ours.close()
    submit(engine, 1, "Hi", 4)           # the engine thread's sends fail: no SIGPIPE, no abort
    while True:
        ready, _, _ = select.select([engine.fileno()], [], [], 120)
        assert ready
        if engine.relay_events():
            break
    assert engine.sink_broken()
    assert engine.send_frame(wire.frame({"op": "ping"})) is False
    assert engine.flush_sink() is False and not engine.sink_pending()
