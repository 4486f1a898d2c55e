"""Command line: `stackd serve | keys | models | console | pair` (`python -m server` in a checkout)."""
from __future__ import annotations

import argparse
import os
import sys

from .. import config


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="state directory (keys, identity, models); default ./data")
    parser.add_argument("--config", help="TOML config file; default DATA_DIR/config.toml if present")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stackd", description="Inference server for devices "
                                     "and stacks of devices.")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the node daemon")
    _common(serve)
    serve.add_argument("--host", help="address to bind; default 127.0.0.1")
    serve.add_argument("--inference-port", type=int, help="inference API port; default 8080")
    serve.add_argument("--cluster-port", type=int, help="cluster API port; default 5381")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--console", action="store_const", const=True, dest="console_enabled",
                       help="serve the console (/api and its web page) beside the node")
    serve.add_argument("--console-port", type=int, help="console port; default 8000")
    serve.add_argument("--ollama", action="store_const", const=True, dest="ollama_enabled",
                       help="serve Ollama's API (/api/chat, /api/tags, ...) on its own port")
    serve.add_argument("--ollama-port", type=int, help="Ollama API port; default 11434")
    serve.add_argument("--model", action="append", dest="model_files", metavar="PATH",
                       help="a GGUF file to add to the store and load at start (repeatable); "
                            "replaces models.preload")

    keys = commands.add_parser("keys", help="manage API keys")
    key_commands = keys.add_subparsers(dest="key_command", required=True)
    create = key_commands.add_parser("create", help="create a key; prints it on the last line")
    _common(create)
    create.add_argument("--name", required=True)
    create.add_argument("--permissions", required=True,
                        help="comma-separated: inference, cluster:read, cluster:write, "
                             "models:manage, admin")
    listing = key_commands.add_parser("list", help="list keys (never the keys themselves)")
    _common(listing)
    revoke = key_commands.add_parser("revoke", help="revoke a key by name or id")
    _common(revoke)
    revoke.add_argument("key", help="name or id of the key")
    from .keys_import import add_command as add_key_import
    add_key_import(key_commands, _common)

    models = commands.add_parser("models", help="manage the model store")
    model_commands = models.add_subparsers(dest="model_command", required=True)
    listing = model_commands.add_parser("list", help="list the models in the store")
    _common(listing)
    remove = model_commands.add_parser("rm", help="remove a model from the store")
    _common(remove)
    remove.add_argument("model")
    defaults = model_commands.add_parser("defaults", help="put the default models into the store")
    _common(defaults)
    pull = model_commands.add_parser("pull", help="download a model from the registry")
    _common(pull)
    pull.add_argument("model", help="name[:tag] or namespace/name[:tag]")
    pull.add_argument("--registry", help="registry base URL (default: models.registry)")
    add = model_commands.add_parser("add", help="add a local GGUF file to the store")
    _common(add)
    add.add_argument("path", help="the GGUF file")
    add.add_argument("--name", help="name[:tag] or namespace/name[:tag]; default: the file name "
                                    "without .gguf")

    from .console import add_commands as add_console_commands
    add_console_commands(commands, _common)

    pair = commands.add_parser("pair", help="enrol this node with a console (pairing token)")
    _common(pair)
    pair.add_argument("--console", required=True, dest="console_url", help="the console's URL")
    pair.add_argument("--token", required=True, help="pairing token from POST /api/admin/tokens")
    pair.add_argument("--name", help="device name; default: the host name")
    pair.add_argument("--inference-url", help="how the console reaches this node's inference "
                      "port; default http://HOST:INFERENCE_PORT")
    pair.add_argument("--cluster-url", help="likewise for the cluster port")
    return parser


def _settings(args) -> config.Settings:
    flags = {"data_dir": args.data_dir, "config": args.config,
             "models.registry": getattr(args, "registry", None)}
    for name in ("host", "inference_port", "cluster_port", "log_level"):
        flags[name] = getattr(args, name, None)
    flags["console.enabled"] = getattr(args, "console_enabled", None)
    flags["console.port"] = getattr(args, "console_port", None)
    flags["ollama.enabled"] = getattr(args, "ollama_enabled", None)
    flags["ollama.port"] = getattr(args, "ollama_port", None)
    if getattr(args, "model_files", None):
        flags["models.preload"] = [os.path.abspath(path) for path in args.model_files]
    if args.command == "console":
        from .console import flags as console_flags
        flags.update(console_flags(args))
    return config.load(flags)


def main(argv: list[str] | None = None, **injected) -> int:
    """`injected`: what a test harness hands `serve`'s composition root (daemon.run's faults and
    peers: testing/serve.py); the `stackd` command passes none."""
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
    except config.ConfigError as exc:
        print(f"stackd: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        from ..runtime.worker_process import spare_for_boot
        spare = spare_for_boot(settings)   # first: its start overlaps the daemon's imports
        from ..daemon import run
        return run(settings, spare, **injected)
    if args.command == "models":
        from .models import main as models_main
        return models_main(args, settings)
    if args.command == "console":
        from .console import main as console_main
        return console_main(args, settings)
    if args.command == "pair":
        from ..auth.pairing import main as pair_main
        return pair_main(args, settings)
    if args.command == "keys" and args.key_command == "import":
        from .keys_import import main as keys_import_main
        return keys_import_main(args, settings)
    return _keys(args, settings)


def _keys(args, settings: config.Settings) -> int:
    from ..auth import permissions
    from ..auth.keys import KeyStore

    os.makedirs(settings.data_dir, mode=0o700, exist_ok=True)
    store = KeyStore(settings.data_dir)
    try:
        if args.key_command == "create":
            record, key = store.create(args.name, permissions.parse(args.permissions))
            print(f"created key {record.id} ({record.name}) with {', '.join(sorted(record.permissions))}")
            print(key)
        elif args.key_command == "list":
            for record in store.records():
                print(f"{record.id}\t{record.name}\t{','.join(sorted(record.permissions))}\t"
                      f"{record.hint}...")
        else:
            record = store.revoke(args.key)
            print(f"revoked key {record.id} ({record.name})")
    except (ValueError, KeyError) as exc:
        print(f"stackd: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 1
    return 0
