"""`python -m testing.serve [INJECTIONS] serve ARGS...`: the daemon with a test harness's
injections, handed to its composition root (daemon.run's `faults` and `peers`); the rest of the
command line is `stackd`'s own. The product reads none of these: only this entry point does.

    --loopback-peers f1=512,f2=512@2.5   simulated followers on loopback (testing/loopback_peers.py):
                                         node ids, the MiB each offers, optionally its compute figure
    --worker-crash-file PATH             engine workers abort at start while PATH exists
    --compute GFLOPS                     this node's compute figure instead of its measurement
    --link-delay-us N                    a tensor split's exchanges held N us (bench/cluster.py)
    --free-links                         a tensor split's exchanges skipped (the ceiling; bench/cluster.py)
    --tp-full-rows                       a tensor split's logits rows gathered whole every step

Every harness builds its command with testing.daemon.stackd_command(..., injected={...}).
"""
from __future__ import annotations

import argparse
import functools
import sys

# The flags, by the name a harness passes in `injected` (testing.daemon.stackd_command).
FLAGS = {"loopback_peers": str, "worker_crash_file": str, "compute": float, "link_delay_us": int,
         "free_links": bool, "tp_full_rows": bool}


def flags(injected: dict) -> list[str]:
    """`injected` ({"loopback_peers": "f1=512", "free_links": True}) as this command's flags."""
    out = []
    for name, value in injected.items():
        if name not in FLAGS:
            raise ValueError(f"testing.serve: no injection {name!r} (one of {sorted(FLAGS)})")
        flag = "--" + name.replace("_", "-")
        if FLAGS[name] is bool:
            out += [flag] if value else []
        elif value not in ("", None, 0):
            out += [flag, str(value)]
    return out


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(prog="python -m testing.serve", allow_abbrev=False, add_help=False)
    for name, kind in FLAGS.items():
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            parsed.add_argument(flag, dest=name, action="store_true")
        else:
            parsed.add_argument(flag, dest=name, type=kind, default=kind())
    return parsed


def main(argv: list[str] | None = None) -> int:
    options, rest = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    from stackd.cli import main as stackd_main
    from stackd.faults import Faults

    faults = Faults(worker_crash_file=options.worker_crash_file, compute=options.compute,
                    link_delay_us=options.link_delay_us, free_links=options.free_links,
                    tp_full_rows=options.tp_full_rows)
    peers = None
    if options.loopback_peers:
        from testing import loopback_peers
        if loopback_peers.parse_test_peers(options.loopback_peers):    # refused before the daemon starts
            peers = functools.partial(loopback_peers.membership, spec=options.loopback_peers)
    return stackd_main(rest, faults=faults, peers=peers)


if __name__ == "__main__":
    sys.exit(main())
