"""Install the dashboard's chart library: uPlot, a pinned version from the npm registry.

Downloads the package's tarball (registry.npmjs.org), checks it against the sha512 the registry
publishes for that version (pinned here, so a changed tarball is refused), and writes the two
files the page loads into server/console/static/ (served as static assets: no CDN, works
offline). `make setup` runs it once (stamped); it does nothing when the files are there and
match. Run by hand: `.venv/bin/python server/console/fetch_uplot.py`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import sys
import tarfile
import urllib.request

VERSION = "1.6.32"
TARBALL = f"https://registry.npmjs.org/uplot/-/uplot-{VERSION}.tgz"
SHA512 = "KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
FILES = {"package/dist/uPlot.iife.min.js": "uplot.iife.min.js",
         "package/dist/uPlot.min.css": "uplot.min.css",
         "package/LICENSE": "uplot.LICENSE.txt"}
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
STAMP = os.path.join(STATIC, "uplot.version")


def installed() -> bool:
    try:
        with open(STAMP) as f:
            return f.read().strip() == VERSION and all(
                os.path.exists(os.path.join(STATIC, name)) for name in FILES.values())
    except FileNotFoundError:
        return False


def fetch() -> bytes:
    with urllib.request.urlopen(TARBALL, timeout=60) as response:
        data = response.read()
    got = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if got != SHA512:
        raise SystemExit(f"uplot {VERSION}: the tarball's sha512 is {got}, expected {SHA512}")
    return data


def main() -> int:
    if installed():
        return 0
    data = fetch()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member, name in FILES.items():
            content = tar.extractfile(member).read()
            with open(os.path.join(STATIC, name), "wb") as f:
                f.write(content)
    with open(STAMP, "w") as f:
        f.write(VERSION + "\n")
    print(f"uplot {VERSION} installed into {STATIC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
