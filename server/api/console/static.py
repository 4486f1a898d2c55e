"""The web page: static files from `static/`, read once, served at `/` and `/static/<name>`.

No build step and no CDN: the page is plain HTML, CSS and JavaScript that talk to /api.
Only the files present at start-up are served, by exact name, so no path reaches the disk.
"""
from __future__ import annotations

import os

from ... import console
from ...auth.permissions import PUBLIC
from ...http.errors import ApiError, ErrorKind
from ...http.response import Response
from ...http.routing import Endpoint

# The files are the console's (server/console/static/, package data); serving them is the API's.
FOLDER = os.path.join(os.path.dirname(os.path.abspath(console.__file__)), "static")
TYPES = {".html": b"text/html; charset=utf-8", ".js": b"text/javascript; charset=utf-8",
         ".css": b"text/css; charset=utf-8", ".svg": b"image/svg+xml"}
HEADERS = ((b"cache-control", b"no-cache"), (b"x-content-type-options", b"nosniff"),
           (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'"))


def _load() -> dict[str, Response]:
    files = {}
    for name in sorted(os.listdir(FOLDER)):
        kind = TYPES.get(os.path.splitext(name)[1])
        if kind is not None:
            with open(os.path.join(FOLDER, name), "rb") as f:
                files[name] = Response(200, f.read(), kind, HEADERS)
    return files


FILES = _load()


def index(console, request) -> Response:
    return FILES["index.html"]


def asset(console, request) -> Response:
    found = FILES.get(request.params["name"])
    if found is None:
        raise ApiError(ErrorKind.NOT_FOUND, f"no such file: {request.path}")
    return found


ROUTES = {
    ("GET", "/"): Endpoint(index, PUBLIC),
    ("GET", "/static/:name"): Endpoint(asset, PUBLIC),
}
