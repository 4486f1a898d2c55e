"""`stackd console serve | admin create`."""
from __future__ import annotations

import asyncio
import getpass
import secrets
import sys

from ..console.errors import Code, Refused


def add_commands(commands, common) -> None:
    console = commands.add_parser("console", help="the console: accounts, devices, /api")
    sub = console.add_subparsers(dest="console_command", required=True)
    serve = sub.add_parser("serve", help="run the console alone")
    common(serve)
    serve.add_argument("--host", dest="console_host", help="address to bind; default: host")
    serve.add_argument("--port", dest="console_port", type=int, help="default 8000")
    serve.add_argument("--coordinator", help="cluster URL of the node whose topology to show")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    admin = sub.add_parser("admin", help="manage admin accounts")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    create = admin_sub.add_parser("create", help="create an admin, or make an account one with "
                                  "a new password (from stdin, else generated and printed)")
    common(create)
    create.add_argument("--name", required=True)


def flags(args) -> dict:
    return {"console.host": getattr(args, "console_host", None),
            "console.port": getattr(args, "console_port", None),
            "console.coordinator": getattr(args, "coordinator", None)}


def main(args, settings) -> int:
    if args.console_command == "serve":
        from ..api.console.app import run
        return run(settings)
    return _admin_create(args.name, settings)


def _read_password() -> tuple[str, bool]:
    """(password, generated). Piped stdin is the password; a terminal is asked twice."""
    if not sys.stdin.isatty():
        text = sys.stdin.read().strip()
        if text:
            return text, False
        return secrets.token_urlsafe(18), True
    first = getpass.getpass("password (empty: generate one): ")
    if not first:
        return secrets.token_urlsafe(18), True
    if getpass.getpass("again: ") != first:
        raise Refused(Code.INVALID, "the passwords differ")
    return first, False


def _admin_create(name: str, settings) -> int:
    from ..console.service import ConsoleSettings

    try:
        password, generated = _read_password()
        profile = asyncio.run(_put_admin(ConsoleSettings.from_config(settings), name, password))
    except Refused as exc:
        print(f"stackd: {exc.message}", file=sys.stderr)
        return 1
    print(f"admin {profile['username']} ({profile['id']}) is ready")
    if generated:
        print(password)
    return 0


async def _put_admin(settings, name: str, password: str) -> dict:
    from ..console.service import Console

    console = Console(settings)
    try:
        from ..console.db.database import migrate
        await migrate(console.engine)
        return await console.accounts.put_admin(name, password)
    finally:
        await console.engine.dispose()
