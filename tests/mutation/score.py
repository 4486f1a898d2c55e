"""The mutation score of `make mutate`, per module, from the results mutmut left in mutants/.

Killed / total counts every mutant mutmut made in the functions `make mutate` selects
(targets.py: the one list; in planner.py only the admission functions). Mutants listed in EQUIVALENT.md beside this file
change nothing a caller can observe; they are shown apart, still counted in the total.
Run from the repository root: python tests/mutation/score.py [--survivors]
"""
from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

from targets import TARGETS, module_of   # beside this file: run as a script

MUTANTS = Path("mutants")
EQUIVALENT = Path(__file__).with_name("EQUIVALENT.md")
SELECTED = TARGETS


def equivalent_names() -> set[str]:
    if not EQUIVALENT.exists():
        return set()
    return set(re.findall(r"`(server\.[^`\s]+__mutmut_\d+)`", EQUIVALENT.read_text()))


def results(module: str) -> dict[str, str]:
    meta = MUTANTS / (module + ".meta")
    if not meta.exists():
        return {}
    exit_codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in exit_codes.items()
            if any(fnmatch.fnmatch(name, f"{module_of(module)}.{pattern}") for pattern in SELECTED[module])}


def main() -> int:
    show_survivors = "--survivors" in sys.argv
    equivalent = equivalent_names()
    totals = Counter()
    print(f"{'module':32} {'killed':>7} {'total':>6} {'score':>7} {'equiv.':>7} {'other':>6}")
    for module in SELECTED:
        statuses = results(module)
        killed = sum(s in ("killed", "timeout") for s in statuses.values())
        equiv = sum(s == "survived" and n in equivalent for n, s in statuses.items())
        other = len(statuses) - killed - equiv
        totals.update(killed=killed, total=len(statuses), equiv=equiv, other=other)
        score = f"{100 * killed / len(statuses):.1f}%" if statuses else "-"
        print(f"{module:32} {killed:7} {len(statuses):6} {score:>7} {equiv:7} {other:6}")
        if show_survivors:
            for name, status in sorted(statuses.items()):
                if status not in ("killed", "timeout") and name not in equivalent:
                    print(f"    {status:12} {name}")
    if not totals["total"]:
        print("no results in mutants/: run `make mutate` first")
        return 1
    print(f"{'all':32} {totals['killed']:7} {totals['total']:6} "
          f"{100 * totals['killed'] / totals['total']:6.1f}% {totals['equiv']:7} {totals['other']:6}")
    print("killed includes timeouts; equiv. = survivors listed in tests/mutation/EQUIVALENT.md; "
          "other = survived, no tests or not run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
