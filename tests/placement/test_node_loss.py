"""Node loss in the model manager, in-process with simulated followers (their RPC server
children real, on loopback): a node that goes down kills the workers that span it, their
requests end with 503 errors, and the model is placed again on the nodes left, or left
`failed` with the reason when they cannot hold it. A fenced follower stops its children."""
from __future__ import annotations

import asyncio

import pytest

from stackd.api.cluster import rpc as rpc_routes
from stackd.cluster.rpc_server import RpcServers
from testing.loopback_peers import LoopbackPeers, PeerError
from stackd.engine.errors import EngineError, ErrorCode
from stackd.engine.core import STATUS_LENGTH, STATUS_STOPPED, SamplingParams
from stackd.http.errors import ApiError

from tests.answers import raises_http
from stackd.store.defaults import CHAT_MODEL, import_defaults
from stackd.engine.config import EngineConfig
from stackd.runtime.planner import MIB
from stackd.runtime.lifecycle import ClusterLinks
from stackd.runtime.registry import ModelRegistry
from stackd.store.store import ModelStore

from .conftest import run

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(loop, tmp_path):
    def build(offers: dict[str, int], limit_mib: int = 250) -> ModelRegistry:
        store = ModelStore(str(tmp_path / "data"))
        import_defaults(store)
        servers: dict[str, RpcServers] = {}

        def servers_for(node_id):
            if node_id not in servers:
                servers[node_id] = RpcServers(loop, str(tmp_path / node_id), "127.0.0.1", 0, membership.secret)
            return servers[node_id]
        membership = LoopbackPeers("leader", offers, servers_for)
        links = ClusterLinks(membership, RpcServers(loop, str(tmp_path / "leader"), "127.0.0.1", 0,
                                                    membership.secret))
        manager = ModelRegistry(loop, store, EngineConfig(slots=2, context_length=256, threads=1,
                                                           kernels="off"),
                               memory_reserve=0, memory_limit=limit_mib * MIB, cluster=links)
        membership.on_node_down(manager.supervisor.node_down)
        built.append((manager, servers))
        return manager

    built = []
    yield build
    for manager, servers in built:
        run(loop, manager.aclose(grace=5))
        for s in servers.values():
            s.stop_all()


async def wait_state(manager, model_id, wanted, timeout=120.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while manager.state(model_id) not in wanted:
        assert loop.time() < deadline, manager.state(model_id)
        await asyncio.sleep(0.1)
    return manager.state(model_id)


async def generate(model, max_tokens=200):
    sampling = SamplingParams()
    sampling.temperature = 0.0
    sampling.ignore_eos = True
    prompt = (await model.runner.tokenize(["Tell me a long story."], True, False))[0]
    stream = await model.runner.generate([(prompt, max_tokens, sampling)], [])
    return [event async for event in stream]


async def stream_until_error(model):
    return await generate(model)


def test_a_node_down_kills_the_worker_ends_requests_and_places_the_model_again(loop, cluster):
    manager = cluster({"f1": 400, "f2": 400})

    async def main():
        model = await manager.load(CHAT_MODEL)
        assert model.placement.node_ids == ["leader", "f1", "f2"]
        streaming = asyncio.ensure_future(stream_until_error(model))
        await asyncio.sleep(1.0)
        manager.cluster.membership.set_down("f2")
        events = await asyncio.wait_for(streaming, 60)
        error = events[-1].error
        assert isinstance(error, EngineError) and error.code is ErrorCode.WORKER_LOST   # a 503
        assert await wait_state(manager, CHAT_MODEL, ("loaded", "failed")) == "loaded"
        assert manager.last_exits[CHAT_MODEL]["reason"] == "node f2 went down"
        fresh = manager.loaded[CHAT_MODEL]
        assert fresh.placement.node_ids == ["leader", "f1"] and fresh.restarts == 1
        assert sum(s.layers for s in fresh.placement.shares) == 30
        assert manager.describe(fresh.manifest)["placement"]["nodes"][1]["id"] == "f1"
        # still serving on what is left
        events = await generate(fresh, max_tokens=8)
        assert events[-1].status in (STATUS_STOPPED, STATUS_LENGTH) and sum(e.n_tokens for e in events) > 0
    run(loop, main())


def test_a_dead_node_not_yet_marked_down_is_left_out_when_placing_again(loop, cluster):
    """Its RPC server died with it; until its heartbeats are missed it still counts as up, but
    it cannot start a server: the next attempt places the model without it."""
    manager = cluster({"f1": 400, "f2": 400})

    async def main():
        await manager.load(CHAT_MODEL)
        manager.cluster.membership.silent.add("f2")
        manager.cluster.membership.servers_for("f2").stop_all()          # the dialer sees the relay go
        assert await wait_state(manager, CHAT_MODEL, ("restarting",)) == "restarting"
        assert await wait_state(manager, CHAT_MODEL, ("loaded", "failed")) == "loaded"
        fresh = manager.loaded[CHAT_MODEL]
        assert fresh.placement.node_ids == ["leader", "f1"]
        assert "connection to a node" in manager.last_exits[CHAT_MODEL]["reason"]
        assert manager.degraded_models() == [CHAT_MODEL]
    run(loop, main())


def test_a_node_down_that_leaves_too_little_memory_fails_the_model_with_the_reason(loop, cluster):
    manager = cluster({"f1": 400})

    async def main():
        await manager.load(CHAT_MODEL)
        manager.cluster.membership.set_down("f1")
        assert await wait_state(manager, CHAT_MODEL, ("failed",)) == "failed"
        assert "node f1 went down" in manager.errors[CHAT_MODEL]
        assert "needs about" in manager.errors[CHAT_MODEL]
        with pytest.raises(EngineError) as refused:
            await manager.get(CHAT_MODEL, "chat")
        assert "node f1 went down" in refused.value.message
    run(loop, main())


def test_a_node_that_is_not_in_the_placement_changes_nothing(loop, cluster):
    manager = cluster({"f1": 400, "f2": 400})

    async def main():
        model = await manager.load(CHAT_MODEL, options={"nodes": ["leader", "f1"]})
        manager.cluster.membership.set_down("f2")
        await asyncio.sleep(0.5)
        assert manager.loaded[CHAT_MODEL] is model and not model.runner.engine.lost
    run(loop, main())


def test_internal_rpc_routes_start_list_and_stop_children(loop, tmp_path):
    servers = RpcServers(loop, str(tmp_path), "127.0.0.1", 0, b"s" * 32)

    async def main():
        with raises_http() as bad:
            await rpc_routes.handle(servers, "POST", "/internal/v1/rpc/start", {"placement_id": "p", "threads": 0,
                                                                                "leader_id": "l"})
        assert bad.value.param == "threads"
        with raises_http():
            await rpc_routes.handle(servers, "POST", "/internal/v1/rpc/start", {"placement_id": "../x",
                                                                                "threads": 1, "leader_id": "l"})
        answer = await rpc_routes.handle(servers, "POST", "/internal/v1/rpc/start",
                                         {"placement_id": "p1", "threads": 1, "leader_id": "leader"})
        assert answer["port"] > 0
        (child,) = (await rpc_routes.handle(servers, "GET", "/internal/v1/rpc", {}))["servers"]
        assert child["state"] == "running" and child["port"] == answer["port"]
        assert await rpc_routes.handle(servers, "POST", "/internal/v1/rpc/stop", {"placement_id": "p1"}) == \
            {"stopped": True}
        assert (await rpc_routes.handle(servers, "GET", "/internal/v1/rpc", {}))["servers"] == []
        # fenced: every child goes at once, and none comes back by itself
        await servers.start("p2", 1, "leader")
        proc = servers.children["p2"].proc
        servers.stop_all()
        assert proc.poll() is not None and servers.listing() == []
    run(loop, main())


def test_a_node_without_a_secret_runs_no_relay(loop, tmp_path):
    servers = RpcServers(loop, str(tmp_path), "127.0.0.1", 0, None)
    with pytest.raises(Exception, match="no cluster secret"):
        run(loop, servers.start("p", 1, "leader"))


def test_calls_to_an_unknown_node_are_peer_errors(loop):
    membership = LoopbackPeers("leader", {"f1": 1}, lambda node_id: None)
    with pytest.raises(PeerError):
        run(loop, membership.call("f9", "POST", "/internal/v1/rpc/start", {}))


def test_a_load_over_a_node_that_does_not_answer_is_503(loop, cluster):
    manager = cluster({"f1": 400})
    manager.cluster.membership.silent.add("f1")
    with raises_http() as refused:
        run(loop, manager.load(CHAT_MODEL))
    assert refused.value.kind.status == 503 and "f1" in refused.value.message
    assert manager.state(CHAT_MODEL) == "failed"


def test_a_load_whose_relay_refuses_the_secret_is_503_and_leaves_no_server(loop, cluster):
    manager = cluster({"f1": 400})
    follower = manager.cluster.membership.servers_for("f1")     # its relays check the secret it has now
    manager.cluster.membership.secret = b"another secret".ljust(32, b".")
    with raises_http() as refused:
        run(loop, manager.load(CHAT_MODEL))
    assert refused.value.kind.status == 503 and "refused the handshake" in refused.value.message
    assert follower.listing() == [] and manager.cluster.rpc.listing() == []
