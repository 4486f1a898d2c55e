"""The console's context: everything its handlers use, built once, started on the loop."""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from dataclasses import dataclass

from ..system.files import write_private_file
from .accounts import Accounts
from .authn import ConsoleAuthenticator
from .dashboard.fleet import Fleet
from .dashboard.history import History
from .db.database import migrate, open_engine, resolve_url
from .devices import Devices
from .limits import DASHBOARD_LIMITS
from .directory import Directory
from .signing import SigningKeys
from .throttle import LoginThrottle
from .upstream import Upstream
from .vault import Vault

log = logging.getLogger("stackd.console")

ADMIN_NAME = "admin"
ADMIN_PASSWORD_FILE = "console-admin.password"
NODE_KEY_FILE = "console-node.key"
DIRECTORY_RELOAD = 5.0          # seconds: changes made by another process show up within this



@dataclass
class ConsoleSettings:
    data_dir: str
    database_url: str = ""
    coordinator: str = ""
    coordinator_key_file: str = ""
    login_rate_limit: int = 10
    refresh_token_days: int = 30
    upstream_timeout: float = 5.0
    device_check_interval: float = 30.0
    dashboard_interval: float = 2.0     # seconds between two polls of each device
    dashboard_samples: int = 450        # per device, in memory: 15 minutes at 2 s
    dashboard_devices: int = 100        # devices polled (the first, by creation)
    dashboard_days: int = 7             # one-minute history kept in the database

    def __post_init__(self):
        for name, (low, high) in DASHBOARD_LIMITS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise ValueError(f"setting console.{name}: {value!r} is not between {low} and {high}")

    @classmethod
    def from_config(cls, settings) -> "ConsoleSettings":
        c = settings["console"]
        return cls(settings.data_dir, c["database_url"], c["coordinator"].rstrip("/"),
                   c["coordinator_key_file"], c["login_rate_limit"], c["refresh_token_days"],
                   c["upstream_timeout"], c["device_check_interval"],
                   **{name: c[name] for name in DASHBOARD_LIMITS if name in c})

    @property
    def key_file(self) -> str:
        return self.coordinator_key_file or os.path.join(self.data_dir, NODE_KEY_FILE)


class Console:
    def __init__(self, settings: ConsoleSettings):
        os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
        self.settings = settings
        self.engine = open_engine(resolve_url(settings.database_url, settings.data_dir))
        self.keys = SigningKeys(settings.data_dir)
        self.directory = Directory()
        self.authenticator = ConsoleAuthenticator(self.keys, self.directory)
        self.accounts = Accounts(self.engine, self.keys, self.directory,
                                 settings.refresh_token_days * 86400)
        self.devices = Devices(self.engine, Vault(settings.data_dir))
        self.throttle = LoginThrottle(settings.login_rate_limit)
        self.upstream: Upstream | None = None
        self.history = History(self.engine, settings.dashboard_samples, settings.dashboard_days)
        self.fleet = Fleet(self.devices, lambda: self.upstream, self.history,
                           interval=settings.dashboard_interval, max_devices=settings.dashboard_devices,
                           timeout=min(settings.upstream_timeout, max(1.0, 2 * settings.dashboard_interval)))
        self.started = time.monotonic()
        self._timers: list[asyncio.Task] = []
        self._jobs: set[asyncio.Task] = set()

    async def start(self) -> str | None:
        """Migrate, load the directory, create the first admin. Returns the path of the first
        admin's password file when this start created it."""
        await migrate(self.engine)
        self.upstream = Upstream(self.settings.upstream_timeout)
        password_path = await self._bootstrap_admin()
        await self.accounts.reload_directory()
        self._timers = [asyncio.create_task(self._every(DIRECTORY_RELOAD, self.accounts.reload_directory)),
                        asyncio.create_task(self._every(self.settings.device_check_interval,
                                                        self.check_devices)),
                        asyncio.create_task(self._every(self.settings.dashboard_interval,
                                                        self.fleet.tick))]
        self.spawn(self.check_devices())
        self.spawn(self.fleet.tick())
        return password_path

    async def close(self) -> None:
        """Stop the timers (they only ever wait), let running jobs finish (each is bounded by
        the upstream timeout), then close the database. A job is never cancelled inside a
        query: tearing a SQLite connection down under aiosqlite's worker thread can crash."""
        for timer in self._timers:
            timer.cancel()
        await asyncio.gather(*self._timers, return_exceptions=True)
        while self._jobs:
            await asyncio.gather(*self._jobs, return_exceptions=True)
        await self.fleet.wait()
        try:                        # the minutes under way, so a restart's charts have them
            await self.history.write(self.history.pending())
        except Exception:
            log.exception("console: the dashboard's last minutes could not be written")
        if self.upstream is not None:
            await self.upstream.close()
        await self.engine.dispose()

    async def _bootstrap_admin(self) -> str | None:
        if await self.accounts.count():
            return None
        password = secrets.token_urlsafe(18)
        await self.accounts.put_admin(ADMIN_NAME, password)
        path = os.path.join(self.settings.data_dir, ADMIN_PASSWORD_FILE)
        write_private_file(path, (password + "\n").encode())
        return path

    # ---- the coordinator and the devices --------------------------------------------------------

    def coordinator_key(self) -> str | None:
        try:
            with open(self.settings.key_file) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    async def check_devices(self) -> None:
        for device in await self.devices.listing():
            await self.check_device(device["id"])

    async def check_device(self, device_id: str) -> None:
        row = await self.devices.get(device_id)
        online = await self.upstream.healthy(row.cluster_url, self.devices.api_key(row))
        await self.devices.set_status(device_id, online)

    async def _quietly(self, coroutine) -> None:
        try:
            await coroutine
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("console background job failed")

    async def _every(self, seconds: float, job) -> None:
        """A timer: starts `job` every `seconds`, unless its previous run is still going."""
        running = None
        while True:
            await asyncio.sleep(seconds)
            if running is None or running.done():
                running = self.spawn(job())

    def spawn(self, coroutine) -> asyncio.Task:
        """Run a job beside the requests; its failure is logged, never lost."""
        task = asyncio.create_task(self._quietly(coroutine))
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)
        return task
