"""Start the node daemon: both ports on one uvloop event loop, stop on SIGTERM/SIGINT.

The composition root: each service is built once, in order, and each route group gets the typed
context it needs (api/contexts.py). Where two services need each other (the membership reports
what the registry runs; the registry places models over the membership), the later one is
handed to the earlier through one named call, never a field left empty to fill later.

A test harness injects here and nowhere else (testing/serve.py): `faults` (server/faults.py) and
`peers`, simulated followers that placement runs over instead of this node's membership. This
module imports nothing of the test support; a shipped daemon gets neither.
"""
from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import uvloop

from . import __version__, compiled, config
from .auth.access import NodeAccess
from .auth.guard import KeyGuard
from .auth.keys import KeyStore, bootstrap_admin_key
from .auth.pairing import CONSOLE_KEY_NAME
from .auth.ratelimit import RateLimiter
from .chat.limits import configure as configure_inference_limits
from .cluster import identity
from .cluster.membership import Membership
from .cluster.compute_speed import ComputeSpeed
from .cluster.node_facts import NodeFacts
from .faults import NONE as NO_FAULTS, Faults
from .http.access_log import AccessLog
from .http.server import HttpServer
from .observe.metrics import Metrics
from .system import logs
from .system.memory import release_free_heap
from .system.sd_notify import Notifier

log = logging.getLogger("stackd")

if TYPE_CHECKING:
    from .api.contexts import ClusterContext, InferenceContext, ModelsContext
    from .http.routing import App
    from .runtime.worker_process import SpareWorker

# Simulated followers (a test harness's: testing/loopback_peers.py): called with this node's
# facts, the settings and the loop once the registry is made, -> the membership placement runs
# over (the Membership interface: nodes, call, on_node_down, on_fenced, secret).
Peers = Callable[[NodeFacts, config.Settings, asyncio.AbstractEventLoop], object]


def import_api() -> None:
    """The route modules of both ports (most of what the daemon imports, and the internal routes
    they register), imported while the preloaded models load: on the way to a first answer
    after boot, the two overlap instead of adding up (serve)."""
    from .api import contexts, errors, models  # noqa: F401
    from .api.cluster import gate, internal, routes  # noqa: F401
    from .api.inference import routes as inference_routes  # noqa: F401
    from .http import openapi, routing  # noqa: F401


@dataclass(frozen=True)
class Contexts:
    """What each route group's handlers get (None in a document-only build: openapi tests)."""
    inference: InferenceContext | None = None
    models: ModelsContext | None = None
    cluster: ClusterContext | None = None


def build_access(settings: config.Settings, metrics: Metrics) -> tuple[NodeAccess, str | None]:
    """The API keys (an admin key on a first start: its file's path) and their rate limits."""
    keys = KeyStore(settings.data_dir)
    admin_key_path = bootstrap_admin_key(keys, settings.data_dir)
    rate_limits = settings["rate_limits"]
    groups = {group: rate_limits[group] for group in config.RATE_LIMIT_GROUPS}
    limiter = RateLimiter(groups, settings.per_key_limits, metrics=metrics,
                          refusal_delay=rate_limits["refusal_delay"])
    return NodeAccess(keys, limiter), admin_key_path


def build_membership(settings: config.Settings, faults: Faults = NO_FAULTS) -> Membership:
    """This node (its identity, made on a first start) in its cluster."""
    os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    facts = NodeFacts(identity.load_or_create(settings.data_dir), settings,
                      compute=node_compute(settings, faults))
    return Membership.from_settings(facts, settings)


def node_compute(settings: config.Settings, faults: Faults = NO_FAULTS) -> ComputeSpeed:
    """This node's compute figure (fixed by a test harness's faults.compute); serve() starts
    measuring it."""
    fixed = faults.compute
    return ComputeSpeed(settings["engine.threads"] or os.cpu_count() or 1, fixed if fixed > 0 else None)


def build_apps(max_body: int, guard, membership: Membership | None, contexts: Contexts) -> tuple[App, App]:
    """The inference port's app and the cluster port's; a follower's refuse what the leader serves."""
    from .api import models as model_routes
    from .api.cluster import gate, internal, recent
    from .api.cluster import routes as cluster_routes
    from .api.errors import to_api_error
    from .api.inference import routes as inference_routes
    from .http import openapi
    from .http.routing import App

    # Each answered inference request leaves its counts and times (never its text) in
    # observe.recent, for GET /v1/requests/recent and the console's dashboard.
    inference_tables = [(recent.recording(inference_routes.ROUTES), contexts.inference),
                        (model_routes.ROUTES, contexts.models)]
    cluster_tables = [(cluster_routes.ROUTES, contexts.cluster), (model_routes.ROUTES, contexts.models)]
    if membership is not None and not membership.is_leader:      # the leader serves these
        inference_tables = [(gate.leader_only(table, membership), ctx) for table, ctx in inference_tables]
        cluster_tables = [(cluster_routes.leader_only_routes(membership), contexts.cluster),
                          (gate.leader_only(model_routes.ROUTES, membership), contexts.models)]
    inference_tables.append(openapi.routes("stackd inference API", [t for t, _ in inference_tables],
                                           group=inference_routes.INFERENCE, version=__version__))
    cluster_tables.append(openapi.routes("stackd cluster API", [t for t, _ in cluster_tables],
                                         group=cluster_routes.CLUSTER, version=__version__))
    cluster_guard = guard
    if membership is not None and membership.secret is not None:   # node-to-node routes, signed
        cluster_tables.append((internal.signed_routes(membership.secret), contexts.cluster))
        cluster_guard = internal.ClusterPortGuard(guard, internal.SignatureGuard(membership.secret))
    inference = App("inference", inference_tables, guard=guard, max_body=max_body, errors=to_api_error)
    cluster = App("cluster", cluster_tables, guard=cluster_guard, max_body=max_body, errors=to_api_error)
    return inference, cluster


def build_ollama_app(settings: config.Settings, guard, membership: Membership | None, ctx) -> App:
    """Ollama's port: its own table over the same registry, store, keys and limits; a follower's
    refuses what the leader serves, as its inference port does."""
    from .api.cluster import gate
    from .api.errors import to_api_error
    from .api.inference import routes as inference_routes
    from .api.ollama import routes as ollama_routes
    from .api.ollama.errors import ERROR_SHAPE
    from .auth.networks import NetworkGuard, parse_networks
    from .http.routing import App

    table = ollama_routes.table(settings["ollama.max_blob_mb"] << 20)
    networks = parse_networks(settings["ollama.anonymous_networks"])
    if networks:                    # requests without a key from these networks: inference alone
        guard = NetworkGuard(guard, networks, settings["ollama.anonymous_rate_limit"],
                             settings["rate_limits.refusal_delay"])
    if membership is not None and not membership.is_leader:
        table = gate.leader_only(table, membership)
    # Ollama serves OpenAI's API on its port too, and clients use it there (Copilot's Ollama
    # provider lists models with /api/tags and /api/show, then chats through /v1/chat/completions)
    openai = inference_routes.ROUTES
    if membership is not None and not membership.is_leader:
        openai = gate.leader_only(openai, membership)
    return App("ollama", [(table, ctx), (openai, ctx)], guard=guard, max_body=settings["http.max_body_bytes"],
               errors=to_api_error, error_shape=ERROR_SHAPE)


def _raise_fd_limit() -> None:
    """1024 connections need more than the common default of 1024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def serve(settings: config.Settings, spare: SpareWorker | None = None, faults: Faults = NO_FAULTS,
                peers: Peers | None = None) -> int:
    loop = asyncio.get_running_loop()
    # Signals are ours from the first moment: a SIGTERM while models load still exits 0.
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    metrics = Metrics()
    membership = build_membership(settings, faults)
    if settings.cluster_secret is not None or peers is not None:
        membership.facts.compute.start()     # in the background: a layer split's counts follow it
    access, admin_key_path = build_access(settings, metrics)
    facts = membership.facts
    # the embedded console's own requests to this node (its polls, and what it proxies for a
    # request its own access log already shows) are logged only when they fail
    access_log = AccessLog(enabled=settings["http.access_log"],
                           quiet_keys=frozenset({CONSOLE_KEY_NAME}) if settings["console.enabled"] else frozenset())
    http = HttpServer(loop, settings.limits(), metrics, access_log)
    http.tick_hooks.append(access.reload_keys)

    loading = asyncio.ensure_future(load_models(loop, settings, membership, spare, faults, peers))
    try:
        await loop.run_in_executor(None, import_api)
    except BaseException:
        loading.cancel()
        raise
    try:
        registry = await loading
    except Exception as exc:        # a model that will not load is fatal at start, and said plainly
        print(f"stackd: cannot load the models: {exc}", file=sys.stderr, flush=True)
        return 1
    from .runtime.local_state import RunningNode
    from .store.local import LocalImports
    from .store.pulling import PullService, RegistrySettings
    pulls = PullService(registry.store, RegistrySettings.from_settings(settings["models"]))
    imports = LocalImports.from_settings(registry.store, settings.data_dir, settings["models"])
    power = power_contracts(settings, membership, registry, loop)
    membership.report_local(RunningNode(registry, power))
    if stop.is_set():               # asked to stop while loading: never start listening
        await registry.aclose()
        print("stackd: stopped", flush=True)
        return 0

    # Built once the models are: loading registers their modules' internal routes.
    from .api.contexts import ClusterContext, InferenceContext, ModelsContext
    contexts = Contexts(InferenceContext(registry), ModelsContext(registry, pulls, imports),
                        ClusterContext(facts, membership, power, registry, metrics, registry.cluster.rpc,
                                       settings["debug.trace_reply_timeout"]))
    guard = KeyGuard(access.keys, access.limiter)
    inference_app, cluster_app = build_apps(settings["http.max_body_bytes"], guard, membership, contexts)
    host = settings["host"]
    try:
        inference_port = await http.listen(inference_app, host, settings["inference_port"])
        cluster_port = await http.listen(cluster_app, host, settings["cluster_port"])
    except OSError as exc:
        print(f"stackd: cannot listen on {host}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return 1
    ollama_host = settings["ollama.host"] or host
    ollama_port = None
    if settings["ollama.enabled"]:
        from .api.contexts import OllamaContext
        ollama_app = build_ollama_app(settings, guard, membership, OllamaContext(registry, pulls, imports))
        try:
            ollama_port = await http.listen(ollama_app, ollama_host, settings["ollama.port"])
        except OSError as exc:
            print(f"stackd: cannot listen for Ollama's API on {ollama_host}: {exc.strerror or exc}",
                  file=sys.stderr, flush=True)
            await http.shutdown(0)
            await registry.aclose()
            return 1

    print(f"stackd: node {facts.node_id} data dir {settings.data_dir}", flush=True)
    if admin_key_path is not None:
        print(f"stackd: first start: admin API key written to {admin_key_path}", flush=True)
    print(f"stackd: inference listening on http://{_url_host(host)}:{inference_port}", flush=True)
    print(f"stackd: cluster listening on http://{_url_host(host)}:{cluster_port}", flush=True)
    if ollama_port is not None:
        print(f"stackd: ollama listening on http://{_url_host(ollama_host)}:{ollama_port}", flush=True)
    membership.start(loop, host, cluster_port, inference_port)    # a follower heartbeats
    if membership.secret is not None:
        print(f"stackd: cluster {membership.role} at {membership.address}", flush=True)
    console = None
    if settings["console.enabled"]:
        try:
            console = await start_console(http, access.keys, facts.node_id, settings, inference_port,
                                          cluster_port)
        except OSError as exc:
            print(f"stackd: console cannot listen: {exc.strerror or exc}", file=sys.stderr, flush=True)
            await http.shutdown(0)
            await registry.aclose()
            return 1
    release_free_heap()             # what start-up freed (vocabularies, route tables, listening)
    notifier = Notifier()
    notifier.ready()
    notifier.start_watchdog(loop)

    await stop.wait()
    notifier.stopping()
    grace = settings["http.shutdown_grace"]
    print(f"stackd: shutting down (grace {grace:g} s)", flush=True)
    await membership.aclose()                                     # a follower leaves
    await http.shutdown(grace)
    if console is not None:
        await console.close()
    await registry.aclose()
    print("stackd: stopped", flush=True)
    return 0


async def start_console(http: HttpServer, keys: KeyStore, node_id: str, settings: config.Settings,
                        inference_port: int, cluster_port: int):
    """The embedded console, on this loop and server. Unless told of another coordinator it
    shows this node, with a node key it creates for itself, and lists it as its first device."""
    from .auth.pairing import ensure_console_key_file, local_url
    from .api.console import app as console_app
    from .console.service import Console, ConsoleSettings

    console_settings = ConsoleSettings.from_config(settings)
    own_key = None
    if not console_settings.coordinator:
        own_key = ensure_console_key_file(keys, console_settings.key_file)
        console_settings.coordinator = local_url(settings["host"], cluster_port)
    console = Console(console_settings)
    await console_app.start(http, console, settings["console.host"] or settings["host"],
                            settings["console.port"], settings["http.max_body_bytes"])
    if own_key is not None:
        await console_app.register_own_node(console, node_id,
                                            local_url(settings["host"], inference_port),
                                            console_settings.coordinator, own_key)
    return console


def cluster_links(loop, membership: Membership, settings: config.Settings, peers: Peers | None = None):
    """What the registry places models over, built before it: the membership (or a harness's
    simulated `peers`), this node's RPC server children, the address its tensor-split workers
    listen on."""
    from .cluster.rpc_server import RpcServers
    from .runtime.lifecycle import ClusterLinks

    placing_over = membership if peers is None else peers(membership.facts, settings, loop)
    rpc = RpcServers(loop, settings.data_dir, settings["host"],
                     settings["cluster.rpc_port"], placing_over.secret, kernels=settings["engine.kernels"],
                     batch_invariant=settings["engine.batch_invariant"],
                     kv_commit=settings["engine.kv_commit"])
    return ClusterLinks(placing_over, rpc, settings["host"])


def wire_cluster(registry, membership: Membership) -> None:
    """The cluster's events to the registry and its supervisor (both built already), and the
    routes the cluster's nodes call."""
    from .api.cluster import replica as replica_routes
    from .api.cluster import rpc as rpc_routes
    from .api.cluster import tensor as tensor_routes

    placing_over, rpc = registry.cluster.membership, registry.cluster.rpc
    supervisor = registry.supervisor
    placing_over.on_node_down(supervisor.node_down)
    placing_over.on_fenced(rpc.stop_all)
    placing_over.on_fenced(registry.replica_host.stop_all)      # the leader's replicas here
    placing_over.on_fenced(registry.tensor_host.stop_all)       # and its tensor shards
    if membership.is_leader and placing_over is membership:
        membership.on_change(registry.grow_replicas)             # a follower joins or comes back
        membership.on_offer_grown(registry.grow_replicas)        # or gains room or the model file
    membership.provide_rpc_state(rpc.listing)                    # its heartbeats carry them
    membership.provide_placements(lambda node_id: supervisor.placements.on(node_id)
                                  + registry.replica_ids_on(node_id))   # a leader's answers list them
    membership.on_placements_listed(rpc.keep_only)               # a follower stops the rest
    membership.on_placements_listed(registry.replica_host.keep_only)
    membership.on_placements_listed(registry.tensor_host.keep_only)
    rpc_routes.register()
    replica_routes.register()
    tensor_routes.register()


async def load_models(loop, settings: config.Settings, membership: Membership,
                      spare: SpareWorker | None = None, faults: Faults = NO_FAULTS,
                      peers: Peers | None = None):
    from .engine.config import EngineConfig
    from .runtime.planner import MIB
    from .runtime.registry import ModelRegistry
    from .runtime.prompt_cache import PromptCacheConfig
    from .store.defaults import import_defaults
    from .store.local import LocalImports, looks_like_path
    from .store.store import ModelStore

    store = ModelStore(settings.data_dir)
    missing = await loop.run_in_executor(None, import_defaults, store)
    for model_id, why in missing.items():
        print(f"stackd: default model {model_id} left out: {why}", flush=True)
    inference_limits = configure_inference_limits(settings["inference.limits"],
                                                  settings["inference.reasoning_budget"])
    registry = ModelRegistry(loop, store, EngineConfig.from_settings(settings["engine"], inference_limits.key_share),
                             memory_reserve=settings["models.memory_reserve_mb"] * MIB,
                             memory_limit=settings["models.memory_limit_mb"] * MIB,
                             autoload=settings["models.autoload"],
                             faults=faults,
                             replicas=settings["cluster.replicas"], spare=spare,
                             cluster=cluster_links(loop, membership, settings, peers),
                             keep_alive=settings["models.keep_alive"],
                             pinned=frozenset(settings["models.pinned"]),
                             load_wait=settings["models.load_wait"],
                             prompt_cache=PromptCacheConfig.from_settings(store, settings["models"]))
    wire_cluster(registry, membership)
    preload = settings["models.preload"] if settings["cluster.role"] == "leader" else []  # the leader's job
    for model_id in preload:
        if model_id in missing:
            continue
        pin = looks_like_path(model_id)       # serve --model PATH: add the file, load it, pin it
        if pin:
            imports = LocalImports.from_settings(store, settings.data_dir, settings["models"])
            model_id = await loop.run_in_executor(None, imports.add_preloaded, model_id)
        model = await registry.load(model_id, pin=pin)
        print(f"stackd: loaded {model.kind} model {model.id} "
              f"(context {model.context_length}, {model.engine.n_slots} slots)", flush=True)
    if spare is not None:               # none of the preloads took it (stop waits for its exit)
        await loop.run_in_executor(None, spare.stop)
    return registry


def power_contracts(settings: config.Settings, membership: Membership, registry, loop):
    from .cluster.power import NodeBudget, PowerContracts, PowerSettings

    me = membership.self_id
    contracts = PowerContracts(
        PowerSettings(**settings["power"]), settings.data_dir, loop=loop,
        nodes=lambda: [NodeBudget(*budget) for budget in membership.power_budgets()],
        # followers learn their scale from the answer to their next heartbeat
        apply_scale=lambda scales: registry.set_compute_scale(scales.get(me, 1.0)))
    membership.on_change(contracts.rebalance)
    return contracts


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(settings: config.Settings, spare: SpareWorker | None = None, faults: Faults = NO_FAULTS,
        peers: Peers | None = None) -> int:
    """`spare`: a worker `stackd serve` spawned before importing this (worker_process.py);
    `faults` and `peers`: a test harness's injections (testing/serve.py), none otherwise."""
    try:
        compiled.require_compiled()
        logs.configure(settings["log_level"])
        _raise_fd_limit()
        return uvloop.run(serve(settings, spare, faults, peers))
    finally:
        if spare is not None:
            spare.stop()                # not taken: a preload failed, or none wanted it
