"""Put the console on the HTTP core: its App, its guard, and starting it on a server.

Used by both ways of running it: alone (`console serve`, `run` below) and beside a node on
the node's loop and HttpServer (`serve --console`, wired by the daemon through `start`).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys

import uvloop

from ...auth.guard import Guard
from ...http.access_log import AccessLog
from ...http import openapi
from ...http.routing import App
from ... import __version__
from ...http.server import HttpServer
from ...observe.metrics import Metrics
from ...system import logs
from . import routes
from ..errors import to_api_error
from ...console.service import Console, ConsoleSettings

log = logging.getLogger("stackd.console")


def build_app(console: Console, max_body: int) -> App:
    document = openapi.routes("stackd console API", [routes.ROUTES], group=None, version=__version__,
                              description="The console's /api group (docs/console.md).")
    return App("console", [routes.ROUTES, document], ctx=console,
               guard=Guard(console.authenticator, None), max_body=max_body, errors=to_api_error)


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def start(http: HttpServer, console: Console, host: str, port: int,
                max_body: int) -> int:
    """Start the console and listen; returns the bound port. Says where the first admin's
    password went, the way the node says where its first key went."""
    password_path = await console.start()
    bound = await http.listen(build_app(console, max_body), host, port)
    if password_path is not None:
        print(f"stackd: first start: console admin password written to {password_path}", flush=True)
    print(f"stackd: console listening on http://{url_host(host)}:{bound}", flush=True)
    return bound


async def register_own_node(console: Console, name: str, inference_url: str, cluster_url: str,
                            key: str) -> None:
    """The embedded console's first device is the node it runs beside; on later starts its
    record follows the node's current addresses and key."""
    listing = await console.devices.listing()
    mine = [device for device in listing if device["name"] == name]
    if mine:
        device_id = mine[0]["id"]
        await console.devices.update(device_id, inference_url, cluster_url, key)
    elif not listing:
        device_id = (await console.devices.create(name, inference_url, cluster_url, key,
                                                  "stackd"))["id"]
    else:
        return                      # a fleet console that happens to run beside a node
    console.spawn(console.check_device(device_id))


async def serve_alone(settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    console = Console(ConsoleSettings.from_config(settings))
    http = HttpServer(loop, settings.limits(), Metrics(),
                      AccessLog(enabled=settings["http.access_log"]))
    host = settings["console.host"] or settings["host"]
    try:
        await start(http, console, host, settings["console.port"], settings["http.max_body_bytes"])
    except OSError as exc:
        print(f"stackd: console cannot listen on {host}: {exc.strerror or exc}", file=sys.stderr,
              flush=True)
        await console.close()
        return 1
    await stop.wait()
    await http.shutdown(settings["http.shutdown_grace"])
    await console.close()
    print("stackd: console stopped", flush=True)
    return 0


def run(settings) -> int:
    logs.configure(settings["log_level"])
    return uvloop.run(serve_alone(settings))
