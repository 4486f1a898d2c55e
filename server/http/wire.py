"""Bytes on the wire: status lines, response heads, chunk framing.

Everything that never changes is built once at import. A response head is one
`bytes` join so the protocol can issue a single `transport.write` per response.
"""
from __future__ import annotations

from http import HTTPStatus

STATUS_LINES: dict[int, bytes] = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus
}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
CONNECTION_CLOSE = b"connection: close\r\n"
CHUNKED = b"transfer-encoding: chunked\r\n"
LAST_CHUNK = b"0\r\n\r\n"
JSON = b"application/json"


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


def encode_headers(headers) -> bytes:
    """(name, value) pairs of bytes -> header lines. Values are checked by callers."""
    return b"".join([name + b": " + value + b"\r\n" for name, value in headers])


def response_head(status: int, content_type: bytes, content_length: int, request_id: bytes,
                  date: bytes, extra: bytes, keep_alive: bool) -> bytes:
    """The head of a response with a known length."""
    return b"%scontent-type: %s\r\ncontent-length: %d\r\nx-request-id: %s\r\ndate: %s\r\n%s%s\r\n" % (
        status_line(status), content_type, content_length, request_id, date, extra,
        b"" if keep_alive else CONNECTION_CLOSE)


def stream_head(status: int, content_type: bytes, request_id: bytes, date: bytes, extra: bytes,
                chunked: bool, keep_alive: bool) -> bytes:
    """The head of a response whose length is not known up front."""
    return b"%scontent-type: %s\r\ncache-control: no-cache\r\nx-request-id: %s\r\ndate: %s\r\n%s%s%s\r\n" % (
        status_line(status), content_type, request_id, date, extra,
        CHUNKED if chunked else b"", b"" if keep_alive else CONNECTION_CLOSE)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)
