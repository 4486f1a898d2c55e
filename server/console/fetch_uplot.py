"""Install the dashboard's chart library: uPlot, a pinned version from the npm registry.

Fetches the package's tarball with npm (`npm pack`, from the registry npm is configured with),
checks it against the sha512 the registry publishes for that version (pinned here, so a changed
tarball is refused), and writes the two
files the page loads into server/console/static/ (served as static assets: no CDN, works
offline). `make setup` runs it once (stamped); it does nothing when the files are there and
match. Run by hand: `.venv/bin/python server/console/fetch_uplot.py`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

VERSION = "1.6.32"
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
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("uplot: npm is needed to fetch the dashboard's chart library (Node.js's npm)")
    with tempfile.TemporaryDirectory(prefix="uplot-") as tmp:
        subprocess.run([npm, "pack", "--silent", "--pack-destination", tmp, f"uplot@{VERSION}"],
                       check=True, stdout=subprocess.DEVNULL, timeout=300)
        with open(os.path.join(tmp, f"uplot-{VERSION}.tgz"), "rb") as f:
            data = f.read()
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
