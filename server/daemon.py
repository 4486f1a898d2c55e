"""Start the node daemon: both ports on one uvloop event loop, stop on SIGTERM/SIGINT."""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys

import uvloop

from . import __version__, compiled, config
from .auth.guard import KeyGuard
from .auth.keys import KeyStore, bootstrap_admin_key
from .auth.ratelimit import RateLimiter
from .api.cluster import gate, internal
from .cluster import identity
from .cluster.membership import Membership
from .api.cluster import routes as cluster_routes
from .http import openapi
from .http.access_log import AccessLog
from .http.routing import App
from .http.server import HttpServer
from .api.errors import to_api_error
from .api.inference import routes as inference_routes
from .chat.limits import configure as configure_inference_limits
from .observe.metrics import Metrics
from .api import models as model_routes
from .node import Node
from .system.memory import release_free_heap
from .system.sd_notify import Notifier

log = logging.getLogger("stackd")


def build_node(settings: config.Settings) -> tuple[Node, str | None]:
    os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    keys = KeyStore(settings.data_dir)
    admin_key_path = bootstrap_admin_key(keys, settings.data_dir)
    metrics = Metrics()
    rate_limits = settings["rate_limits"]
    groups = {group: rate_limits[group] for group in config.RATE_LIMIT_GROUPS}
    limiter = RateLimiter(groups, settings.per_key_limits, metrics=metrics,
                          refusal_delay=rate_limits["refusal_delay"])
    node = Node(settings, identity.load_or_create(settings.data_dir), keys, limiter, metrics)
    node.membership = Membership.from_settings(node, settings)
    return node, admin_key_path


def build_apps(node: Node) -> tuple[App, App]:
    guard = KeyGuard(node.keys, node.limiter)
    max_body = node.settings["http.max_body_bytes"]
    inference_tables = [inference_routes.ROUTES, model_routes.ROUTES]
    cluster_tables = [cluster_routes.ROUTES, model_routes.ROUTES]
    membership = getattr(node, "membership", None)      # None: a one-node cluster
    if membership is not None and not membership.is_leader:      # the leader serves these
        inference_tables = [gate.leader_only(table, membership) for table in inference_tables]
        cluster_tables = [cluster_routes.leader_only_routes(membership),
                          gate.leader_only(model_routes.ROUTES, membership)]
    inference_tables.append(openapi.routes("stackd inference API", inference_tables,
                                           group=inference_routes.INFERENCE, version=__version__))
    cluster_tables.append(openapi.routes("stackd cluster API", cluster_tables,
                                         group=cluster_routes.CLUSTER, version=__version__))
    cluster_guard = guard
    if membership is not None and membership.secret is not None:   # node-to-node routes, signed
        cluster_tables.append(internal.signed_routes(membership.secret))
        cluster_guard = internal.ClusterPortGuard(guard, internal.SignatureGuard(membership.secret))
    inference = App("inference", inference_tables, ctx=node, guard=guard, max_body=max_body,
                    errors=to_api_error)
    cluster = App("cluster", cluster_tables, ctx=node, guard=cluster_guard, max_body=max_body,
                  errors=to_api_error)
    return inference, cluster


def _raise_fd_limit() -> None:
    """1024 connections need more than the common default of 1024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def serve(settings: config.Settings) -> int:
    loop = asyncio.get_running_loop()
    # Signals are ours from the first moment: a SIGTERM while models load still exits 0.
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    node, admin_key_path = build_node(settings)
    access_log = AccessLog(enabled=settings["http.access_log"])
    http = HttpServer(loop, settings.limits(), node.metrics, access_log)
    http.tick_hooks.append(node.reload_keys)

    try:
        node.models = await load_models(loop, settings, node)
        node.pulls = pull_service(node.models.store, settings)
        node.power = power_contracts(node, loop)
    except Exception as exc:        # a model that will not load is fatal at start, and said plainly
        print(f"stackd: cannot load the models: {exc}", file=sys.stderr, flush=True)
        return 1
    if stop.is_set():               # asked to stop while loading: never start listening
        await node.models.aclose()
        print("stackd: stopped", flush=True)
        return 0

    # Built once the models are: loading registers their modules' internal routes.
    inference_app, cluster_app = build_apps(node)
    host = settings["host"]
    try:
        inference_port = await http.listen(inference_app, host, settings["inference_port"])
        cluster_port = await http.listen(cluster_app, host, settings["cluster_port"])
    except OSError as exc:
        print(f"stackd: cannot listen on {host}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1

    print(f"stackd: node {node.identity.node_id} data dir {settings.data_dir}", flush=True)
    if admin_key_path is not None:
        print(f"stackd: first start: admin API key written to {admin_key_path}", flush=True)
    print(f"stackd: inference listening on http://{_url_host(host)}:{inference_port}", flush=True)
    print(f"stackd: cluster listening on http://{_url_host(host)}:{cluster_port}", flush=True)
    node.membership.start(loop, host, cluster_port, inference_port)    # a follower heartbeats
    if node.membership.secret is not None:
        print(f"stackd: cluster {node.membership.role} at {node.membership.address}", flush=True)
    console = None
    if settings["console.enabled"]:
        try:
            console = await start_console(http, node, settings, inference_port, cluster_port)
        except OSError as exc:
            print(f"stackd: console cannot listen: {exc.strerror or exc}", file=sys.stderr, flush=True)
            await http.shutdown(0)
            await node.models.aclose()
            return 1
    release_free_heap()             # what start-up freed (vocabularies, route tables, listening)
    notifier = Notifier()
    notifier.ready()
    notifier.start_watchdog(loop)

    await stop.wait()
    notifier.stopping()
    grace = settings["http.shutdown_grace"]
    print(f"stackd: shutting down (grace {grace:g} s)", flush=True)
    await node.membership.aclose()                                     # a follower leaves
    await http.shutdown(grace)
    if console is not None:
        await console.close()
    await node.models.aclose()
    print("stackd: stopped", flush=True)
    return 0


async def start_console(http: HttpServer, node: Node, settings: config.Settings,
                        inference_port: int, cluster_port: int):
    """The embedded console, on this loop and server. Unless told of another coordinator it
    shows this node, with a node key it creates for itself, and lists it as its first device."""
    from .auth.pairing import ensure_console_key_file, local_url
    from .api.console import app as console_app
    from .console.service import Console, ConsoleSettings

    console_settings = ConsoleSettings.from_config(settings)
    own_key = None
    if not console_settings.coordinator:
        own_key = ensure_console_key_file(node.keys, console_settings.key_file)
        console_settings.coordinator = local_url(settings["host"], cluster_port)
    console = Console(console_settings)
    await console_app.start(http, console, settings["console.host"] or settings["host"],
                            settings["console.port"], settings["http.max_body_bytes"])
    if own_key is not None:
        await console_app.register_own_node(console, node.identity.node_id,
                                            local_url(settings["host"], inference_port),
                                            console_settings.coordinator, own_key)
    return console


def attach_cluster(registry, node: Node, settings: config.Settings) -> None:
    """Placement over the cluster: the membership and this node's RPC server children."""
    from .api.cluster import rpc as rpc_routes
    from .cluster.rpc_server import RpcServers

    membership = node.membership
    if registry.supervisor.faults.loopback_peers:   # a test configuration: simulated followers
        from .testing import loopback_peers
        membership = loopback_peers.membership(node, settings, registry.loop,
                                               registry.supervisor.faults.loopback_peers)
    rpc = RpcServers(registry.loop, settings.data_dir, settings["host"],
                     settings["cluster.rpc_port"], membership.secret)
    registry.attach_cluster(membership, rpc)
    supervisor = registry.supervisor
    membership.on_node_down(supervisor.node_down)
    membership.on_fenced(rpc.stop_all)
    node.membership.provide_rpc_state(rpc.listing)                    # its heartbeats carry them
    node.membership.provide_placements(supervisor.placements.on)      # a leader's answers list them
    node.membership.on_placements_listed(rpc.keep_only)               # a follower stops the rest
    rpc_routes.register()


async def load_models(loop, settings: config.Settings, node: Node):
    from .engine.config import EngineConfig
    from .faults import Faults
    from .runtime.planner import MIB
    from .runtime.registry import ModelRegistry
    from .store.defaults import import_defaults
    from .store.store import ModelStore

    store = ModelStore(settings.data_dir)
    missing = await loop.run_in_executor(None, import_defaults, store)
    for model_id, why in missing.items():
        print(f"stackd: default model {model_id} left out: {why}", flush=True)
    inference_limits = configure_inference_limits(settings["inference.limits"])
    registry = ModelRegistry(loop, store, EngineConfig.from_settings(settings["engine"], inference_limits.key_share),
                             memory_reserve=settings["models.memory_reserve_mb"] * MIB,
                             memory_limit=settings["models.memory_limit_mb"] * MIB,
                             autoload=settings["models.autoload"],
                             faults=Faults.from_settings(settings["testing"]))
    attach_cluster(registry, node, settings)
    preload = settings["models.preload"] if settings["cluster.role"] == "leader" else []  # the leader's job
    for model_id in preload:
        if model_id in missing:
            continue
        model = await registry.load(model_id)
        print(f"stackd: loaded {model.kind} model {model.id} "
              f"(context {model.context_length}, {model.engine.n_slots} slots)", flush=True)
    return registry


def power_contracts(node: Node, loop):
    from .cluster.power import NodeBudget, PowerContracts, PowerSettings

    settings = PowerSettings(**node.settings["power"])
    me = node.identity.node_id
    contracts = PowerContracts(
        settings, node.settings.data_dir, loop=loop,
        nodes=lambda: [NodeBudget(*budget) for budget in node.membership.power_budgets()],
        # followers learn their scale from the answer to their next heartbeat
        apply_scale=lambda scales: node.models.set_compute_scale(scales.get(me, 1.0)))
    node.membership.on_change(contracts.rebalance)
    return contracts


def pull_service(store, settings: config.Settings):
    from .store.pulling import GIB, PullService, RegistrySettings

    m = settings["models"]
    return PullService(store, RegistrySettings(
        url=m["registry"], username=m["registry_username"] or None,
        password=m["registry_password"] or None, max_bytes=m["max_pull_gb"] * GIB,
        disk_reserve=m["disk_reserve_mb"] << 20, stall_timeout=m["pull_stall_timeout"]))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(settings: config.Settings) -> int:
    compiled.require_compiled()
    logging.basicConfig(level=settings["log_level"].upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _raise_fd_limit()
    return uvloop.run(serve(settings))
