"""The peer for bench/http_health.py: a raw ASGI app under uvicorn (httptools, uvloop)
that checks the same Authorization header and returns the same body as stackd's
GET /v1/health. Kept minimal on purpose: this is uvicorn at its fastest."""
import hashlib
import json
import os
import time

_KEY_DIGEST = hashlib.sha256(os.environ["BENCH_KEY"].encode()).digest()
_STARTED = time.monotonic()
_UNAUTHORIZED = json.dumps({"error": {"code": 401, "message": "invalid API key",
                                      "type": "authentication_error"}}).encode()


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    auth = b""
    for name, value in scope["headers"]:
        if name == b"authorization":
            auth = value
    if auth[:7] == b"Bearer " and hashlib.sha256(auth[7:]).digest() == _KEY_DIGEST:
        status = 200
        body = json.dumps({"status": "ok", "uptime_seconds": int(time.monotonic() - _STARTED),
                           "temperature_c": None}).encode()
    else:
        status, body = 401, _UNAUTHORIZED
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
