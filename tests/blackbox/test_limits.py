"""HTTP limits against the real daemon over raw sockets."""
import json
import socket
import time

import pytest

from tests.http.fake import parse_responses

pytestmark = pytest.mark.slow


def auth(daemon) -> bytes:
    return b"Authorization: Bearer " + daemon.admin_key.encode() + b"\r\n"


def test_oversized_head_is_431(daemon):
    data = daemon.raw(b"GET /v1/health HTTP/1.1\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n")
    assert parse_responses(data)[0][0] == 431


def test_oversized_url_is_414(daemon):
    data = daemon.raw(b"GET /v1/health?" + b"q" * 17000 + b" HTTP/1.1\r\n\r\n")
    assert parse_responses(data)[0][0] == 414


def test_too_many_headers_is_431(daemon):
    headers = b"".join(b"X-%d: v\r\n" % i for i in range(101))
    data = daemon.raw(b"GET /v1/health HTTP/1.1\r\n" + headers + b"\r\n")
    assert parse_responses(data)[0][0] == 431


def test_large_body_is_refused_before_it_is_sent(daemon):
    data = daemon.raw(b"POST /v1/models/load HTTP/1.1\r\n" + auth(daemon)
                      + b"Content-Type: application/json\r\nContent-Length: 2000000\r\n\r\n")
    assert parse_responses(data)[0][0] == 413


def test_content_length_with_transfer_encoding_is_400(daemon):
    data = daemon.raw(b"POST /v1/models/load HTTP/1.1\r\nContent-Length: 4\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert parse_responses(data)[0][0] == 400


def test_garbage_is_400_and_the_daemon_keeps_serving(daemon):
    for junk in (b"\x16\x03\x01\x00\xa5\x01\x00\x00", b"NOT HTTP AT ALL\r\n\r\n", b"\xff" * 100):
        data = daemon.raw(junk)
        assert parse_responses(data)[0][0] == 400
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200


def test_pipelined_requests_over_a_real_socket(daemon):
    one = b"GET /v1/health HTTP/1.1\r\n" + auth(daemon) + b"\r\n"
    last = b"GET /v1/topology HTTP/1.1\r\nConnection: close\r\n" + auth(daemon) + b"\r\n"
    responses = parse_responses(daemon.raw(one * 20 + last))
    assert [r[0] for r in responses] == [200] * 21
    assert b"cluster_id" in responses[-1][2]


def test_connection_cap(start_daemon):
    daemon = start_daemon("[http]\nmax_connections = 3\n")
    held = [socket.create_connection(("127.0.0.1", daemon.cluster_port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        data = daemon.raw(b"", wait=3.0)
        assert parse_responses(data)[0][0] == 503
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200


def test_a_flood_of_inference_connections_leaves_the_cluster_port_reachable(start_daemon):
    daemon = start_daemon("[http]\nmax_connections = 3\n")
    held = [socket.create_connection(("127.0.0.1", daemon.inference_port)) for _ in range(3)]
    try:
        time.sleep(0.2)
        assert parse_responses(daemon.raw(b"", wait=3.0, port="inference"))[0][0] == 503
        assert daemon.request("GET", "/v1/health", key=daemon.admin_key)[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_slow_head_is_cut_off(start_daemon):
    daemon = start_daemon("[http]\nhead_timeout = 1.0\n")
    sock = socket.create_connection(("127.0.0.1", daemon.cluster_port), timeout=60)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\n")
    started = time.monotonic()
    data = b""
    for _ in range(20):                 # one header line every 0.1 s never finishes the head
        try:
            sock.sendall(b"X-Drip: 1\r\n")
        except OSError:
            break
        time.sleep(0.1)
    sock.settimeout(3)
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    sock.close()
    assert parse_responses(data)[0][0] == 408
    assert time.monotonic() - started < 4


def test_idle_keep_alive_is_closed(start_daemon):
    daemon = start_daemon("[http]\nkeepalive_timeout = 1.0\n")
    sock = socket.create_connection(("127.0.0.1", daemon.cluster_port), timeout=60)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\n" + auth(daemon) + b"\r\n")
    first = sock.recv(65536)
    assert parse_responses(first)[0][0] == 200
    assert sock.recv(1) == b""          # closed by the server after about a second
    sock.close()


@pytest.mark.parametrize("request_bytes", [
    b"POST /v1/models/load HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
    b"GET /v1/health HTTP/1.1\r\nHost: a\r\nHost\r\n\r\n",
    b"GET /v1/health HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
])
def test_malformed_framing(daemon, request_bytes):
    # with a key: a keyless head is refused (401) before a body is read, malformed or not
    request_bytes = request_bytes.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\n" + auth(daemon), 1)
    assert parse_responses(daemon.raw(request_bytes))[0][0] == 400


@pytest.mark.parametrize("port, path, credential", [
    ("inference", "/v1/chat/completions", b""),
    ("inference", "/v1/chat/completions", b"Authorization: Bearer sk-nobody\r\n"),
    ("inference", "/v1/messages", b""),
    ("cluster", "/v1/models/load", b""),
])
def test_a_keyless_request_is_refused_before_its_body(daemon, port, path, credential):
    """A client without a key cannot hold a connection by trickling a body (slowloris): the
    head alone gets the 401, and the connection closes."""
    sock = socket.create_connection(("127.0.0.1", getattr(daemon, f"{port}_port")), timeout=60)
    sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                 + credential + b"Content-Length: 1000\r\n\r\n{")
    data = b""
    while chunk := sock.recv(65536):              # no more body is sent: the answer comes anyway
        data += chunk
    sock.close()
    (status, _, body), = parse_responses(data)
    assert status == 401
    error = json.loads(body)["error"]
    if path == "/v1/messages":                    # Anthropic's shape on its route
        assert error["type"] == "authentication_error" and json.loads(body)["type"] == "error"
    else:
        assert error["code"] == 401 and error["type"]


def test_half_closed_client_gets_its_response(daemon):
    sock = socket.create_connection(("127.0.0.1", daemon.cluster_port), timeout=60)
    sock.sendall(b"GET /v1/health HTTP/1.1\r\n" + auth(daemon) + b"\r\n")
    sock.shutdown(socket.SHUT_WR)                 # like `nc -q`: request sent, writing done
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    assert parse_responses(data)[0][0] == 200
