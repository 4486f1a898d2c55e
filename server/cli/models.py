"""`stackd models list | rm NAME | defaults | pull NAME | add PATH`: the store, from the command line.

These work on the data dir directly (no daemon needed); a running daemon sees the
change on its next listing.
"""
from __future__ import annotations

import asyncio
import os
import sys

from ..errors import DomainError
from ..store.gguf_check import GGUFError
from ..store.store import ModelStore, StoreError

BAR = 30


def main(args, settings) -> int:
    store = ModelStore(settings.data_dir)
    try:
        if args.model_command == "list":
            for m in store.list():
                print(f"{m.id}\t{m.kind}\t{m.architecture}\t{m.quantization}\t"
                      f"{m.size / 1e6:.0f} MB\tsha256:{m.sha256[:12]}")
        elif args.model_command == "defaults":
            from ..store.defaults import import_defaults
            for model_id, why in import_defaults(store).items():
                print(f"stackd: default model {model_id} left out: {why}", file=sys.stderr)
            for m in store.list():
                print(f"{m.id}\tsha256:{m.sha256[:12]}\t{m.source}")
        elif args.model_command == "rm":
            removed = store.remove(args.model)
            print(f"removed {removed.id}")
        elif args.model_command == "add":
            return _add(store, settings, args.path, args.name)
        else:
            return asyncio.run(_pull(store, settings, args.model))
    except KeyError:
        print(f"stackd: no model {args.model!r} in the store", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"stackd: {exc}", file=sys.stderr)
        return 1
    except GGUFError as exc:
        print(f"stackd: model refused: {exc}", file=sys.stderr)
        return 1
    return 0


def _add(store, settings, path: str, name: str | None) -> int:
    from ..store.local import LocalImports

    imports = LocalImports.from_settings(store, settings.data_dir, settings["models"])
    try:
        m = imports.add(os.path.abspath(path), name)
    except DomainError as exc:
        print(f"stackd: {exc.message}", file=sys.stderr)
        return 1
    print(f"added {m.id}\t{m.kind}\t{m.architecture}\t{m.quantization}\tsha256:{m.sha256[:12]}")
    return 0


async def _pull(store, settings, name: str) -> int:
    from ..store.pulling import PullService, RegistrySettings

    service = PullService(store, RegistrySettings.from_settings(settings["models"]))
    try:
        async for event in service.pull(name):
            _show(event)
    except DomainError as exc:
        print(f"\nstackd: {exc.message}", file=sys.stderr)
        return 1
    return 0


def _show(event: dict) -> None:
    status = event.get("status", "")
    total, done = event.get("total"), event.get("completed")
    if total:
        filled = int(BAR * (done or 0) / total)
        line = (f"\r{status:24s} {100 * (done or 0) / total:5.1f}% [{'#' * filled}{'.' * (BAR - filled)}] "
                f"{(done or 0) / 1e6:8.1f} / {total / 1e6:.1f} MB")
        print(line, end="" if done != total else "\n", file=sys.stderr, flush=True)
    elif status == "success":
        print(f"pulled {event.get('model')}", flush=True)
    else:
        print(status, file=sys.stderr, flush=True)
