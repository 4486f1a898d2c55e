"""Cluster membership on loopback: how long a follower takes to join, how long the leader takes
to mark a killed (kill -9) follower down, and how long followers take to rejoin a restarted
leader. Each time is measured by polling the leader's /v1/topology every 20 ms; medians of N runs.

    .venv/bin/python bench/cluster_liveness.py [--runs 3]

Expected by design: join within a heartbeat (1 s) of the follower listening; down 3 s (the
window) after the last heartbeat, so 2..3 s after the kill; rejoin within a heartbeat of the
restarted leader listening.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # testing/: the checkout's test support
from testing.cluster_nodes import Node, statuses  # noqa: E402


def until(check, timeout: float = 60.0) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise SystemExit("timed out")
        time.sleep(0.02)
    return time.monotonic() - started


def one_run(root: str) -> dict[str, float]:
    leader = Node(os.path.join(root, "leader"))
    follower = None
    try:
        follower = Node(os.path.join(root, "follower"), role="follower", leader=leader.cluster_url)
        joined = until(lambda: statuses(leader).get(follower.node_id) == "up")
        leader.kill(signal.SIGKILL)
        leader.start()
        rejoined = until(lambda: statuses(leader).get(follower.node_id) == "up")
        follower.kill(signal.SIGKILL)
        down = until(lambda: statuses(leader)[follower.node_id] == "down")
        return {"join_s": joined, "rejoin_after_leader_restart_s": rejoined, "kill_to_down_s": down}
    finally:
        for node in (follower, leader):
            if node is not None:
                node.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as root:
            runs.append(one_run(root))
    for name in runs[0]:
        values = [run[name] for run in runs]
        print(f"{name:34s} median {statistics.median(values):6.2f} s   "
              f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)")


if __name__ == "__main__":
    main()
