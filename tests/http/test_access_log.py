"""The access log never blocks the loop: a reader that stops reading costs dropped lines,
counted and reported, not a stalled server."""
import os
import threading

import orjson

from stackd.http import access_log
from stackd.http.access_log import AccessLog


def log_requests(log: AccessLog, n: int) -> None:
    for i in range(n):
        log.write("GET", f"/v1/health?{i}", 200, 10, 0.001, b"id-%d" % i, None, "127.0.0.1:1")


class StuckStream:
    """A pipe whose reader stopped: every write blocks until released."""

    def __init__(self):
        self.released = threading.Event()
        self.data = bytearray()

    def write(self, data):
        self.released.wait()
        self.data += data

    def flush(self):
        pass


def test_lines_reach_the_stream_through_the_writer():
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as stream, os.fdopen(read_end, "rb") as reader:
        log = AccessLog(stream)
        log_requests(log, 3)
        log.drain()
        stream.close()
        lines = reader.read().splitlines()
    assert [orjson.loads(line)["path"] for line in lines] == [f"/v1/health?{i}" for i in range(3)]


def test_a_stuck_reader_never_blocks_flush_and_drops_are_counted(monkeypatch):
    monkeypatch.setattr(access_log, "MAX_PENDING_BYTES", 64 * 1024)
    stream = StuckStream()
    log = AccessLog(stream)
    # Should flush block on the stream, this timer unblocks it (so the test fails, not hangs).
    rescue = threading.Timer(120, stream.released.set)
    rescue.start()
    for _ in range(50):                    # far more than 64 KiB of lines
        log_requests(log, 100)
        log.flush()
    assert not stream.released.is_set()    # every flush returned while the reader was stuck
    rescue.cancel()
    assert log.dropped_lines > 0
    dropped = log.dropped_lines
    stream.released.set()                  # the reader catches up
    log.drain()
    log_requests(log, 1)
    log.drain()
    lines = [orjson.loads(line) for line in bytes(stream.data).splitlines()]
    reports = [line["access_log_dropped_lines"] for line in lines if "access_log_dropped_lines" in line]
    assert reports == [dropped]
    assert len(lines) - 1 + dropped == 50 * 100 + 1   # every line written or counted


def test_a_broken_stream_is_survived():
    class Broken:
        def write(self, data):
            raise BrokenPipeError

        def flush(self):
            pass

    log = AccessLog(Broken())
    log_requests(log, 5)
    log.drain()
    log_requests(log, 5)
    log.drain()
    assert log.dropped_lines == 0


def test_disabled_log_writes_nothing():
    stream = StuckStream()
    log = AccessLog(stream, enabled=False)
    log_requests(log, 5)
    log.drain()
    assert stream.data == b""
