"""The README's "A cluster of two on one machine", run as written: its commands are read from
README.md (a change there that breaks them fails here), in a network namespace of its own so
that the fixed ports it uses (8080, 5381 on 127.0.0.1 and 127.0.0.2) are the test's alone, in
an empty folder with `.venv` pointing at the environment under test. Two real daemons with the
default models; nothing simulated."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from testing import netns
from testing.cluster_nodes import eventually

README = Path(__file__).resolve().parents[2] / "README.md"
SECTION = "### A cluster of two on one machine"
CHAT_MODEL = "smollm2-135m-instruct"


def readme_blocks() -> list[str]:
    """The section's ```sh blocks, comments dropped: [start both daemons, ask the leader]."""
    text = README.read_text()
    assert SECTION in text, f"README.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 2, blocks
    return ["\n".join(line for line in block.splitlines() if not line.lstrip().startswith("#"))
            for block in blocks]


@pytest.fixture
def namespace():
    why = netns.available()
    if why is not None:
        pytest.skip(why)
    netns.sweep()
    topology = netns.Topology()
    try:
        yield topology.add_node("readme")[0]
    finally:
        topology.close()


def test_the_readme_cluster_quick_start_works_as_written(tmp_path, namespace):
    start, ask = readme_blocks()
    os.symlink(Path(sys.executable).parent.parent, tmp_path / ".venv")     # the .venv of the commands
    env = {k: v for k, v in os.environ.items() if not k.startswith("STACKD_")}
    log = open(tmp_path / "daemons.log", "wb")
    shell = subprocess.Popen(["ip", "netns", "exec", namespace, "bash", "-euc", start + "\nwait"], cwd=tmp_path,
                             env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def described():
            done = subprocess.run(["ip", "netns", "exec", namespace, "bash", "-euc", ask], cwd=tmp_path, env=env,
                                  capture_output=True)
            assert shell.poll() is None, (tmp_path / "daemons.log").read_text()
            if done.returncode != 0:            # not listening yet
                return None
            model = orjson.loads(done.stdout)
            replicas = model.get("replicas") or []
            return model if len(replicas) == 2 and all(r["state"] == "loaded" for r in replicas) else None

        model = eventually(described)
        assert model["id"] == CHAT_MODEL and model["state"] == "loaded"
        assert model["placement"]["split_mode"] == "replica"
        leader, follower = model["replicas"]
        assert leader["node"] != follower["node"] and leader["pid"] != follower["pid"]
        assert leader["pid"] == model["pid"]                         # the leader's own copy first
    finally:
        os.killpg(shell.pid, signal.SIGTERM)                         # bash and the two daemons
        try:
            shell.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()
        log.close()
