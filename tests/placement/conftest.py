"""Real ggml RPC servers on loopback (children with their relays, as a follower runs them)
and engine workers placed over them."""
from __future__ import annotations

import asyncio
import os

import pytest

from testing import two_daemons
from testing.daemon import free_port
from testing.rpc_workers import (PROMPTS, SECRET, Peers, chat_prompt, engine_params, generate,
                                        start_worker)


@pytest.fixture
def peers(loop, tmp_path):
    p = Peers(loop, str(tmp_path))
    yield p
    p.servers.stop_all()


def run(loop, coro, timeout: float = 600):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


__all__ = ["PROMPTS", "SECRET", "chat_prompt", "engine_params", "start_worker", "generate", "run", "os"]


@pytest.fixture
def pair(tmp_path):
    """pair(leader_limit_mb): a leader on 127.0.0.1 and a follower on FOLLOWER_HOST."""
    def make(leader_limit_mb: int) -> two_daemons.Pair:
        leader = start_node("leader", env=two_daemons.node_env(leader_limit_mb, free_port()))
        follower = start_node("follower", role="follower", leader=leader.cluster_url, host=two_daemons.FOLLOWER_HOST,
                              reach=two_daemons.FOLLOWER_HOST,
                              env=two_daemons.node_env(two_daemons.FOLLOWER_OFFER_MB, free_port(two_daemons.FOLLOWER_HOST)))
        return two_daemons.Pair(leader, follower)

    with two_daemons.daemons(tmp_path) as start_node:
        yield make
