"""Hostile clients at the HTTP layer (issue: hostile requests must not crash, stall or
monopolize the daemon), over the fake transport; run on the compiled module and the twin."""
import uuid

import orjson

from stackd.http.protocol import RequestIds

from .fake import parse_responses
from .test_protocol import error_of, open_conn, settle

PIPELINED = b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n"


def test_pipelined_flood_from_a_client_that_reads_nothing_stays_bounded(loop):
    server, protocol, transport = open_conn(loop, write_high_water=16 * 1024)
    transport.flow_control = True
    for _ in range(20):                                    # 20,000 requests, in 20 reads
        if transport.reading:
            protocol.data_received(PIPELINED * 1000)
    # Reading stopped once the answers passed the high-water mark, and nothing more was
    # answered: what is buffered is one read's worth at most, not 20,000 answers.
    assert not transport.reading and transport.n_pause_reading >= 1
    buffered = len(transport.written)
    assert buffered < 16 * 1024 + 1000 * 400, buffered
    answered_while_paused = len(parse_responses(bytes(transport.written)))
    assert answered_while_paused < 1000


def test_reading_resumes_once_the_client_takes_its_answers(loop):
    server, protocol, transport = open_conn(loop, write_high_water=16 * 1024)
    transport.flow_control = True
    protocol.data_received(PIPELINED * 120)
    assert not transport.reading
    answered = 0
    for _ in range(100):
        answered += len(parse_responses(transport.client_reads()))
        settle(loop)                                   # a held read continues next turn
        if transport.reading:
            break
    answered += len(parse_responses(transport.take()))
    assert answered == 120 and transport.reading        # every request answered


def test_backpressure_applies_to_plain_responses_too(loop):
    server, protocol, transport = open_conn(loop, write_high_water=1024)
    transport.flow_control = True
    protocol.data_received(b"POST /echo HTTP/1.1\r\nContent-Length: 3000\r\n\r\n" + b"x" * 3000
                           + PIPELINED)
    # the first answer is small; the pipelined one is answered too, but then reading pauses
    # whenever the unsent bytes pass the mark
    assert len(parse_responses(transport.client_reads())) == 2


def test_trailer_fields_are_not_request_headers(loop):
    server, protocol, transport = open_conn(loop)
    protocol.data_received(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"3\r\nabc\r\n0\r\nX-Request-ID: from-the-trailer\r\n"
                           b"Authorization: Bearer sneaky\r\n\r\n")
    [(status, headers, body)] = parse_responses(transport.take())
    assert status == 200 and orjson.loads(body)["body_len"] == 3
    assert headers[b"x-request-id"] != b"from-the-trailer"


def test_trailer_cannot_authenticate(loop):
    from stackd.http.routing import App, Endpoint
    from stackd.http.response import json_response
    seen = []

    def guard(request, route):
        seen.append(request.headers.get(b"authorization"))

    server, protocol, transport = open_conn(loop)
    protocol.app = App("t", [{("POST", "/x"): Endpoint(lambda c, r: json_response({}), None)}],
                       ctx=None, guard=guard, max_body=1024)
    protocol.data_received(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"1\r\na\r\n0\r\nAuthorization: Bearer sk-trailer\r\n\r\n")
    assert seen == [None]


def test_unparsable_absolute_url_is_400_not_500(loop):
    server, protocol, transport = open_conn(loop)
    protocol.data_received(b"GET http://a:99999/v1/health HTTP/1.1\r\nHost: a\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 400 and error_of(body)["type"] == "invalid_request_error"
    settle(loop)


def test_request_ids_are_random_uuid4():
    ids = RequestIds()
    made = [ids.next().decode() for _ in range(600)]     # crosses two refills of the pool
    assert len(set(made)) == 600
    for text in made:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text
    # not a counter: consecutive ids share no long common prefix
    assert all(a[:8] != b[:8] for a, b in zip(made, made[1:]))


def test_a_timeout_is_a_timeout_error(loop):
    server, protocol, transport = open_conn(loop, head_timeout=10.0)
    protocol.data_received(b"GET /echo HTTP/1.1\r\nX-Slow: ")
    protocol.check_deadline(loop.time() + 10.5)
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 408 and error_of(body) == {
        "code": 408, "type": "timeout_error", "message": error_of(body)["message"]}


def test_a_pipeline_deeper_than_the_cap_is_answered_then_closed(loop):
    # A large read is parsed a slice at a time and held while answers are owed, so one slice's
    # worth of requests (~60 of these) can queue: a cap below that is what a slice can pass.
    server, protocol, transport = open_conn(loop, max_pipeline=16, write_high_water=1024)
    transport.flow_control = True
    protocol.data_received(PIPELINED * 5000)              # one read: parsing stops at the cap
    answers = []
    for _ in range(200):
        answers += parse_responses(transport.client_reads())
        if transport.closed:
            break
    settle(loop)
    answers += parse_responses(transport.take())
    statuses = [status for status, _, _ in answers]
    assert statuses[-1] == 429 and error_of(answers[-1][2])["type"] == "rate_limit_error"
    # the few answered before the buffer passed 1 KiB, then the 16 queued: not 5,000
    assert statuses[:-1] == [200] * len(statuses[:-1]) and 16 <= len(statuses) - 1 <= 16 + 20
    assert transport.closed
