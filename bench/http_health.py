"""Requests/s for GET /v1/health with a valid key over keep-alive connections.

stackd against uvicorn (httptools + uvloop) serving a raw ASGI app that checks the
same Authorization header and returns the same body (bench/uvicorn_health_app.py).
Both run in this one invocation, alternating rounds, with the server pinned to one
core and wrk to the other; the figure per server is the median of its rounds.

    .venv/bin/python bench/http_health.py [--connections 64] [--seconds 10] [--rounds 3]

Installs wrk (Debian package) when it is missing. Both servers run with access
logging off and rate limiting on for stackd (the bench key's limit is raised so
no request is refused, but every request still goes through its token bucket).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable


def ensure_wrk() -> str:
    path = shutil.which("wrk")
    if path:
        return path
    print("installing wrk (Debian package)...", flush=True)
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return shutil.which("wrk") or sys.exit("wrk could not be installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"server did not listen on {port}")


def pinned(cpu: int) -> list[str]:
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def start_stackd(data_dir: str) -> tuple[subprocess.Popen, int, str]:
    key = subprocess.run([PYTHON, "-m", "stackd", "keys", "create", "--data-dir", data_dir,
                          "--name", "bench", "--permissions", "cluster:read"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout.split()[-1]
    with open(os.path.join(data_dir, "config.toml"), "w") as f:
        f.write("[http]\naccess_log = false\n[rate_limits.keys.bench]\ncluster = 1000000000\n")
    port = free_port()
    proc = subprocess.Popen(pinned(0) + [PYTHON, "-m", "stackd", "serve", "--data-dir", data_dir,
                            "--cluster-port", str(port), "--inference-port", str(free_port())],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc)
    return proc, port, key


def start_uvicorn(key: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(pinned(0) + [PYTHON, "-m", "uvicorn", "uvicorn_health_app:app",
                            "--port", str(port), "--loop", "uvloop", "--http", "httptools",
                            "--no-access-log", "--log-level", "warning"],
                            cwd=os.path.join(ROOT, "bench"), env={**os.environ, "BENCH_KEY": key},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, proc)
    return proc, port


def wrk(wrk_path: str, port: int, key: str, connections: int, seconds: int) -> float:
    out = subprocess.run(pinned(1) + [wrk_path, "-t1", f"-c{connections}", f"-d{seconds}s",
                         "-H", f"Authorization: Bearer {key}",
                         f"http://127.0.0.1:{port}/v1/health"],
                         check=True, capture_output=True, text=True).stdout
    if "Non-2xx" in out:
        sys.exit(f"non-2xx responses during the run:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    wrk_path = ensure_wrk()

    data_dir = tempfile.mkdtemp(prefix="stackd-bench-")
    stackd, stackd_port, key = start_stackd(data_dir)
    uvicorn, uvicorn_port = start_uvicorn(key)
    try:
        for port in (stackd_port, uvicorn_port):       # warm both up
            wrk(wrk_path, port, key, args.connections, 2)
        ours, theirs = [], []
        for round_no in range(1, args.rounds + 1):
            ours.append(wrk(wrk_path, stackd_port, key, args.connections, args.seconds))
            theirs.append(wrk(wrk_path, uvicorn_port, key, args.connections, args.seconds))
            print(f"round {round_no}: stackd {ours[-1]:,.0f} req/s, uvicorn {theirs[-1]:,.0f} req/s",
                  flush=True)
    finally:
        for proc in (stackd, uvicorn):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=40)
        shutil.rmtree(data_dir, ignore_errors=True)

    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"\nGET /v1/health, {args.connections} keep-alive connections, wrk -t1, "
          f"{args.rounds} x {args.seconds}s rounds, medians")
    print(f"  stackd   {a:>10,.0f} req/s")
    print(f"  uvicorn  {b:>10,.0f} req/s")
    print(f"  ratio    {a / b:>10.2f}x  (target >= 2.0x)")


if __name__ == "__main__":
    main()
