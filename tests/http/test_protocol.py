"""The HTTP protocol over a fake transport: raw bytes in, raw bytes out, no sockets.

`make test` runs this file twice: against the compiled module and against its
Python twin (STACKD_PURE_PYTHON=1).
"""
import asyncio
import uuid

import orjson
import pytest

from stackd.http.protocol import HttpProtocol

from .fake import connect, make_server, parse_responses


@pytest.fixture
def conn(loop):
    server, app = make_server(loop)
    return connect(server, app, HttpProtocol)


def open_conn(loop, **limits):
    server, app = make_server(loop, **limits)
    protocol, transport = connect(server, app, HttpProtocol)
    return server, protocol, transport


def settle(loop, seconds=0.0):
    loop.run_until_complete(asyncio.sleep(seconds))


def error_of(body: bytes) -> dict:
    return orjson.loads(body)["error"]


# ---- basics ----------------------------------------------------------------------------------

def test_get_answers_with_length_id_and_date(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    [(status, headers, body)] = parse_responses(transport.take())
    assert status == 200
    assert orjson.loads(body) == {"path": "/echo", "query": "x=1", "body_len": 0, "params": {}}
    assert int(headers[b"content-length"]) == len(body)
    assert uuid.UUID(headers[b"x-request-id"].decode()).version == 4
    assert headers[b"date"].endswith(b"GMT")
    assert not transport.closed


def test_valid_request_id_is_echoed(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nX-Request-ID: abc-123_DEF.9\r\n\r\n")
    [(_, headers, _)] = parse_responses(transport.take())
    assert headers[b"x-request-id"] == b"abc-123_DEF.9"


@pytest.mark.parametrize("value", [b"a" * 129, b"has space", b"semi;colon", b"<script>"])
def test_invalid_request_id_is_replaced(conn, value):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nX-Request-ID: " + value + b"\r\n\r\n")
    [(_, headers, _)] = parse_responses(transport.take())
    assert headers[b"x-request-id"] != value
    uuid.UUID(headers[b"x-request-id"].decode())


def test_request_id_at_128_characters_is_kept(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nX-Request-ID: " + b"r" * 128 + b"\r\n\r\n")
    [(_, headers, _)] = parse_responses(transport.take())
    assert headers[b"x-request-id"] == b"r" * 128


def test_keep_alive_serves_many_requests(conn):
    protocol, transport = conn
    for _ in range(3):
        protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    assert [r[0] for r in parse_responses(transport.take())] == [200, 200, 200]
    assert not transport.closed


def test_connection_close_is_honoured(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nConnection: close\r\n\r\n")
    data = transport.take()
    assert b"connection: close" in data and transport.closed


def test_http10_closes_after_response(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.0\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 200
    assert transport.closed


def test_absolute_form_target_is_routed(conn):
    protocol, transport = conn
    protocol.data_received(b"GET http://example.com/echo?q=2 HTTP/1.1\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 200 and orjson.loads(body)["query"] == "q=2"


def test_path_parameters_are_decoded(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /items/a%20b HTTP/1.1\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 200 and orjson.loads(body)["params"] == {"id": "a b"}


# ---- pipelining ------------------------------------------------------------------------------

def test_pipelined_requests_are_answered_in_order(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /slow HTTP/1.1\r\n\r\nGET /echo?n=2 HTTP/1.1\r\n\r\n"
                           b"GET /slow HTTP/1.1\r\n\r\nGET /echo?n=4 HTTP/1.1\r\n\r\n")
    assert not transport.reading            # reading pauses while requests wait
    settle(loop, 0.1)
    responses = parse_responses(transport.take())
    assert [orjson.loads(r[2]) for r in responses] == [
        {"slow": True}, {"path": "/echo", "query": "n=2", "body_len": 0, "params": {}},
        {"slow": True}, {"path": "/echo", "query": "n=4", "body_len": 0, "params": {}}]
    assert transport.reading


def test_deep_pipeline_does_not_recurse(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n" * 5000)
    settle(loop)
    while protocol.n_completed < 5000:
        settle(loop)
    assert len(parse_responses(transport.take())) == 5000


def test_a_large_read_of_requests_answered_at_once_yields_to_the_loop(loop, conn):
    """Thousands of tiny requests in one read are answered a budget per loop turn, reading
    paused meanwhile, and all of them in order; one callback never answers them all."""
    from stackd.http.protocol import PARSE_BUDGET, PARSE_SLICE
    protocol, transport = conn
    n = 3000
    data = b"".join(b"GET /echo?i=%d HTTP/1.1\r\n\r\n" % i for i in range(n))
    assert len(data) > 4 * PARSE_SLICE
    protocol.data_received(data)
    first_turn = len(parse_responses(bytes(transport.written)))
    assert 0 < first_turn < n
    assert first_turn <= PARSE_BUDGET + PARSE_SLICE // len(b"GET /echo?i=0 HTTP/1.1\r\n\r\n")
    assert not transport.reading            # nothing new is read while the read is held
    turns = 1
    while protocol.n_completed < n:
        settle(loop)
        turns += 1
    assert turns > 2 and transport.reading
    queries = [orjson.loads(body)["query"] for _, _, body in parse_responses(transport.take())]
    assert queries == [f"i={i}" for i in range(n)]


def test_a_large_body_in_one_read_is_parsed_in_one_callback(conn):
    """Slicing a read costs nothing to a large request: no request completes in its slices,
    so the budget never yields and the answer comes in the same callback."""
    protocol, transport = conn
    body = b"x" * (300 * 1024)
    protocol.data_received(b"POST /echo HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert orjson.loads(parse_responses(transport.take())[0][2])["body_len"] == len(body)


def test_a_held_read_waits_for_the_client_to_take_its_answers(loop):
    """Past the write high-water mark the rest of a large read is held, not parsed: the
    client that reads nothing stops costing the loop."""
    _, protocol, transport = open_conn(loop)
    transport.flow_control = True
    n = 3000
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n" * n)
    for _ in range(20):
        settle(loop)
    held = protocol.n_completed
    assert held < n and transport.paused_writing
    while protocol.n_completed < n:
        transport.client_reads()
        settle(loop)
    assert protocol.n_completed == n


def test_parse_error_after_pipelined_request_is_answered_after_it(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /slow HTTP/1.1\r\n\r\nBROKEN\r\n\r\n")
    settle(loop, 0.1)
    statuses = [r[0] for r in parse_responses(transport.take())]
    assert statuses == [200, 400] and transport.closed


# ---- bodies ----------------------------------------------------------------------------------

def test_content_length_body(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nhel")
    assert transport.take() == b""
    protocol.data_received(b"lo")
    assert orjson.loads(parse_responses(transport.take())[0][2])["body_len"] == 5


def test_chunked_body_is_assembled(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /json HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                           b"Content-Type: application/json\r\n\r\n"
                           b"4\r\n{\"a\"\r\n3\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 200 and orjson.loads(body) == {"a": 1}


def test_body_at_route_cap_is_accepted(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /small HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789")
    assert parse_responses(transport.take())[0][0] == 200


def test_content_length_over_cap_is_refused_before_the_body(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /small HTTP/1.1\r\nContent-Length: 11\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 413 and error_of(body)["type"] == "invalid_request_error"
    assert transport.closed


def test_chunked_body_over_cap_is_refused(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /small HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"6\r\n012345\r\n6\r\n012345\r\n0\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 413 and transport.closed


def test_default_body_cap(loop):
    _, protocol, transport = open_conn(loop, max_body_bytes=1000)
    protocol.data_received(b"POST /echo HTTP/1.1\r\nContent-Length: 1001\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 413


def test_expect_continue(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n")
    assert transport.take() == b"HTTP/1.1 100 Continue\r\n\r\n"
    protocol.data_received(b"ok")
    assert parse_responses(transport.take())[0][0] == 200


def test_expect_continue_over_cap_gets_413_not_100(conn):
    protocol, transport = conn
    protocol.data_received(b"POST /small HTTP/1.1\r\nContent-Length: 99\r\nExpect: 100-continue\r\n\r\n")
    data = transport.take()
    assert b"100 Continue" not in data and parse_responses(data)[0][0] == 413


@pytest.mark.parametrize("head", [
    b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nContent-Length: 3a\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n",
    b"POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef\r\n",
])
def test_ambiguous_or_malformed_framing_is_400_and_close(conn, head):
    protocol, transport = conn
    protocol.data_received(head)
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 400 and error_of(body)["code"] == 400
    assert transport.closed


def _post_abc_with_coding(conn, coding: bytes) -> tuple[int, bytes]:
    """POST three bytes, chunked, under Transfer-Encoding `coding`: the answer's status and body."""
    protocol, transport = conn
    protocol.data_received(b"POST /echo HTTP/1.1\r\nTransfer-Encoding: " + coding
                           + b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    return status, body


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate, chunked", b"br,chunked"])
def test_a_transfer_coding_other_than_chunked_is_400_and_close(conn, coding):
    # read as plain chunked, the handler would get the compressed bytes as its body
    status, body = _post_abc_with_coding(conn, coding)
    assert status == 400 and error_of(body)["type"] == "invalid_request_error"
    assert coding.split(b",")[0].strip().decode() in error_of(body)["message"]
    assert conn[1].closed


@pytest.mark.parametrize("coding", [b"CHUNKED", b"Chunked ", b"chunked"])
def test_chunked_is_read_whatever_its_case_and_spaces(conn, coding):
    status, body = _post_abc_with_coding(conn, coding)
    assert status == 200 and orjson.loads(body)["body_len"] == 3


@pytest.mark.parametrize("version", [b"2.0", b"0.9"])   # llhttp refuses the rest itself
def test_a_protocol_version_other_than_1_0_and_1_1_is_400(conn, version):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/" + version + b"\r\nHost: a\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 400 and error_of(body)["code"] == 400 and version.decode() in error_of(body)["message"]
    assert transport.closed


def test_head_answers_the_get_routes_head_without_its_body(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    [(_, get_headers, get_body)] = parse_responses(transport.take())
    protocol.data_received(b"HEAD /echo HTTP/1.1\r\n\r\n")
    raw = bytes(transport.take())
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and rest == b""
    assert b"content-length: %d" % len(get_body) in head.lower()
    assert get_headers[b"content-length"] == b"%d" % len(get_body)
    protocol.data_received(b"GET /echo?after=head HTTP/1.1\r\n\r\n")      # the connection is in step
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 200 and orjson.loads(body)["query"] == "after=head"


def test_head_on_a_streaming_route_sends_the_head_only(conn, loop):
    protocol, transport = conn
    protocol.data_received(b"HEAD /stream?n=3 HTTP/1.1\r\n\r\n")
    settle(loop)
    head, _, rest = bytes(transport.take()).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and rest == b""
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 200


def test_head_where_there_is_no_get_is_405_and_allow_names_head_beside_get(conn):
    protocol, transport = conn
    protocol.data_received(b"HEAD /json HTTP/1.1\r\n\r\n")
    head = bytes(transport.take())
    assert head.startswith(b"HTTP/1.1 405") and b"allow: post\r\n" in head.lower()
    assert head.endswith(b"\r\n\r\n")                      # the 405's head only
    protocol.data_received(b"DELETE /echo HTTP/1.1\r\n\r\n")
    [(status, headers, _)] = parse_responses(transport.take())
    assert status == 405 and headers[b"allow"] == b"GET, HEAD, POST"


# ---- head limits -----------------------------------------------------------------------------

def _with_headers(n: int) -> bytes:
    return b"GET /echo HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(n)) + b"\r\n"


def test_100_header_fields_are_accepted(conn):
    protocol, transport = conn
    protocol.data_received(_with_headers(100))
    assert parse_responses(transport.take())[0][0] == 200


def test_101_header_fields_are_refused(conn):
    protocol, transport = conn
    protocol.data_received(_with_headers(101))
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 431 and "header fields" in error_of(body)["message"]
    assert transport.closed


def _head_of_size(total: int) -> bytes:
    """A request whose request line plus headers count `total` bytes by the protocol's measure:
    the URL plus, per header, name + value + 4."""
    url = b"/echo"
    filler = total - len(url) - len(b"X-Fill") - 4
    return b"GET " + url + b" HTTP/1.1\r\nX-Fill: " + b"a" * filler + b"\r\n\r\n"


def test_head_at_16_kib_is_accepted(conn):
    protocol, transport = conn
    protocol.data_received(_head_of_size(16 * 1024))
    assert parse_responses(transport.take())[0][0] == 200


def test_head_over_16_kib_is_431(conn):
    protocol, transport = conn
    protocol.data_received(_head_of_size(16 * 1024 + 1))
    assert parse_responses(transport.take())[0][0] == 431 and transport.closed


def test_url_over_16_kib_is_414(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo?" + b"q" * (16 * 1024) + b" HTTP/1.1\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 414 and transport.closed


def test_trickled_header_is_cut_off_at_the_limit(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nX-Long: ")
    for _ in range(16):
        protocol.data_received(b"b" * 1024)
        if transport.closed:
            break
    assert transport.closed
    assert parse_responses(transport.take())[0][0] == 431


@pytest.mark.parametrize("garbage", [
    b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
    b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", b"GET /caf\xc3\xa9 HTTP/1.1\r\n\r\n",
    b"GET * HTTP/1.1\r\n\r\n",
])
def test_garbage_is_400_and_close(conn, garbage):
    protocol, transport = conn
    protocol.data_received(garbage)
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 400 and error_of(body)["type"] == "invalid_request_error"
    assert transport.closed


def test_upgrade_request_behind_a_pipelined_one_is_answered_then_closed(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /slow HTTP/1.1\r\n\r\n"
                           b"GET /echo HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    settle(loop, 0.2)
    assert [r[0] for r in parse_responses(transport.take())] == [200, 200] and transport.closed


def test_upgrade_request_is_answered_without_upgrading(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    responses = parse_responses(transport.take())
    assert responses[0][0] == 200


# ---- dispatch and errors ---------------------------------------------------------------------

def test_unknown_path_is_404(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /nope HTTP/1.1\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 404 and error_of(body) == {
        "code": 404, "message": "no such endpoint: GET /nope", "type": "not_found_error"}


def test_wrong_method_is_405_with_allow(conn):
    protocol, transport = conn
    protocol.data_received(b"DELETE /echo HTTP/1.1\r\n\r\n")
    [(status, headers, _)] = parse_responses(transport.take())
    assert status == 405 and headers[b"allow"] == b"GET, HEAD, POST"


def test_crash_is_500_without_internals(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /fail HTTP/1.1\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 500 and error_of(body)["type"] == "api_error"
    assert b"secret" not in body and not transport.closed


def test_api_error_has_the_spec_shape(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /refuse HTTP/1.1\r\n\r\n")
    [(status, _, body)] = parse_responses(transport.take())
    assert status == 403 and error_of(body) == {"code": 403, "message": "no", "type": "permission_error"}


@pytest.mark.parametrize("body,ctype,status", [
    (b"{bad", b"application/json", 400),
    (b"[1, 2]", b"application/json", 400),
    (b"", b"application/json", 400),
    (b'{"a": 1}', b"text/plain", 415),
    (b'{"a": 1}', b"application/json; charset=utf-8", 200),
])
def test_json_bodies(conn, body, ctype, status):
    protocol, transport = conn
    protocol.data_received(b"POST /json HTTP/1.1\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                           % (ctype, len(body), body))
    [(got, _, reply)] = parse_responses(transport.take())
    assert got == status
    if status != 200:
        assert error_of(reply)["code"] == status


# ---- deadlines -------------------------------------------------------------------------------

@pytest.mark.parametrize("limit, seconds, sent", [
    ("head_timeout", 10.0, b"GET /echo HTTP/1.1\r\nX-Slow: "),                        # a head that stalls
    ("body_timeout", 30.0, b"POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345"),  # a body that stalls
])
def test_a_stalled_request_answers_408_once_its_deadline_passes(loop, limit, seconds, sent):
    _, protocol, transport = open_conn(loop, **{limit: seconds})
    protocol.data_received(sent)
    protocol.check_deadline(loop.time() + seconds - 1.0)
    assert not transport.closed
    protocol.check_deadline(loop.time() + seconds + 0.5)
    assert parse_responses(transport.take())[0][0] == 408 and transport.closed


def test_head_deadline_is_not_extended_by_trickling(loop):
    _, protocol, transport = open_conn(loop, head_timeout=10.0)
    start = loop.time()
    protocol.data_received(b"GET /echo HTTP/1.1\r\n")
    for _ in range(5):
        protocol.data_received(b"X-A: b\r\n")
    protocol.check_deadline(start + 10.5)
    assert transport.closed


def test_silent_new_connection_times_out(loop):
    _, protocol, transport = open_conn(loop, head_timeout=10.0)
    protocol.check_deadline(loop.time() + 10.5)
    assert transport.closed


def test_keep_alive_idle_timeout_closes_quietly(loop):
    _, protocol, transport = open_conn(loop, keepalive_timeout=5.0)
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    transport.take()
    protocol.check_deadline(loop.time() + 4.0)
    assert not transport.closed
    protocol.check_deadline(loop.time() + 5.5)
    assert transport.closed and transport.take() == b""


def test_busy_connection_is_not_timed_out(loop):
    _, protocol, transport = open_conn(loop, keepalive_timeout=5.0)
    protocol.data_received(b"GET /slow HTTP/1.1\r\n\r\n")
    protocol.check_deadline(loop.time() + 100.0)
    assert not transport.closed
    settle(loop, 0.05)
    assert parse_responses(transport.take())[0][0] == 200


def test_client_that_stops_reading_is_dropped(loop):
    _, protocol, transport = open_conn(loop, write_timeout=30.0)
    protocol.pause_writing()
    protocol.check_deadline(loop.time() + 31.0)
    assert transport.aborted


# ---- connection cap --------------------------------------------------------------------------

def test_connection_beyond_the_cap_gets_503(loop):
    server, app = make_server(loop, max_connections=2)
    first = connect(server, app, HttpProtocol)
    second = connect(server, app, HttpProtocol)
    _, transport = connect(server, app, HttpProtocol)
    [(status, headers, body)] = parse_responses(transport.take())
    assert status == 503 and headers[b"retry-after"] == b"1" and transport.closed
    assert error_of(body)["type"] == "service_unavailable_error"
    assert not first[1].closed and not second[1].closed
    assert server.metrics.connections_refused == 1


def test_closed_connection_frees_its_place(loop):
    server, app = make_server(loop, max_connections=1)
    protocol, transport = connect(server, app, HttpProtocol)
    transport.close()
    settle(loop)
    _, again = connect(server, app, HttpProtocol)
    assert again.take() == b""


def test_the_cap_is_per_port_so_one_ports_flood_leaves_the_others_places(loop):
    from stackd.http.routing import App
    from .fake import ROUTES
    server, app = make_server(loop, max_connections=2)
    other = App("cluster", [ROUTES], ctx=None, guard=None, max_body=server.limits.max_body_bytes)
    flood = [connect(server, app, HttpProtocol) for _ in range(2)]
    _, refused = connect(server, app, HttpProtocol)
    assert parse_responses(refused.take())[0][0] == 503
    protocol, transport = connect(server, other, HttpProtocol)       # the other port still serves
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    assert parse_responses(transport.take())[0][0] == 200
    _, second = connect(server, other, HttpProtocol)
    _, third = connect(server, other, HttpProtocol)                  # and has a cap of its own
    assert second.take() == b"" and parse_responses(third.take())[0][0] == 503
    flood[0][1].close()
    settle(loop)
    _, again = connect(server, app, HttpProtocol)                     # a closed one frees its place
    assert again.take() == b""


# ---- streaming -------------------------------------------------------------------------------

def test_stream_is_chunked_and_terminated(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /stream?n=3 HTTP/1.1\r\n\r\n")
    settle(loop, 0.05)
    data = transport.take()
    assert b"transfer-encoding: chunked" in data and data.endswith(b"0\r\n\r\n")
    [(status, headers, body)] = parse_responses(data)
    assert status == 200 and headers[b"content-type"] == b"text/event-stream"
    assert body.startswith(b"0...") and len(body) == 3000
    assert not transport.closed


def test_stream_to_http10_is_close_delimited(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /stream?n=2 HTTP/1.0\r\n\r\n")
    settle(loop, 0.05)
    data = transport.take()
    assert b"transfer-encoding" not in data and transport.closed
    assert data.endswith(b".")


def test_stream_waits_while_the_client_is_slow(loop, conn):
    protocol, transport = conn
    protocol.pause_writing()
    protocol.data_received(b"GET /stream?n=50 HTTP/1.1\r\n\r\n")
    settle(loop, 0.05)
    written = len(transport.take())
    assert written < 3 * 1024              # head and at most one chunk, then it waits
    protocol.resume_writing()
    settle(loop, 0.1)
    assert transport.take().endswith(b"0\r\n\r\n")


def test_disconnect_cancels_the_handler(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /stream?n=100000 HTTP/1.1\r\n\r\n")
    settle(loop, 0.01)
    task = protocol.task
    assert task is not None
    protocol.connection_lost(None)
    settle(loop, 0.01)
    assert task.done()


def test_half_closed_client_still_gets_its_answers(loop, conn):
    protocol, transport = conn
    protocol.data_received(b"GET /slow HTTP/1.1\r\n\r\nGET /echo HTTP/1.1\r\n\r\n")
    assert protocol.eof_received() is True          # keep the transport: answers are owed
    settle(loop, 0.1)
    assert [r[0] for r in parse_responses(transport.take())] == [200, 200]
    assert transport.closed


def test_half_closing_during_a_models_work_stops_it(loop, conn):
    """An SDK that times out closes its socket: end of input, like a half-close. A model's
    work for it stops (499) instead of running to an answer nobody reads."""
    protocol, transport = conn
    protocol.data_received(b"POST /generate?ms=5000 HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
    task = protocol.task
    settle(loop, 0.01)                               # the handler is at work
    assert not protocol.eof_received()               # falsy: the transport closes itself
    protocol.connection_lost(None)                   # what the transport then reports
    settle(loop, 0.01)
    assert task.done() and transport.take() == b"" and not protocol.busy


def test_half_close_with_nothing_in_flight_closes(conn):
    protocol, transport = conn
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    transport.take()
    assert not protocol.eof_received()


def test_data_after_close_is_ignored(conn):
    protocol, transport = conn
    protocol.data_received(b"GARBAGE\r\n\r\n")
    transport.take()
    protocol.data_received(b"GET /echo HTTP/1.1\r\n\r\n")
    assert transport.take() == b""
