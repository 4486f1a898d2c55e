"""The README stays a short page arranged by task (issue 47): under 12 KB as `wc -c` counts it, at
most five headline figures, each pointing to its row's section in bench/README.md (where every
figure lives with its command, CPU and date), and every link it has leading somewhere."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH = ROOT / "bench" / "README.md"
MAX_BYTES = 12_000
MAX_HEADLINE_FIGURES = 5


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in path.read_text().splitlines():
        heading = re.match(r"#+ (.*)", line)
        if heading:
            base = anchor(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def section(text: str, title: str) -> str:
    assert f"\n## {title}\n" in text, f"README.md has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_is_under_12_kb():
    size = len(README.read_bytes())
    assert size < MAX_BYTES, f"README.md is {size} bytes: figures go to bench/README.md, details to docs/"


def test_at_most_five_headline_figures_each_pointing_to_bench():
    rows = [line for line in section(README.read_text(), "Figures").splitlines()
            if line.startswith("|") and not line.startswith(("| what", "|---"))]
    assert 0 < len(rows) <= MAX_HEADLINE_FIGURES, rows
    targets = anchors(BENCH)
    for row in rows:
        links = re.findall(r"\(bench/README\.md#([\w-]+)\)", row)
        assert links, f"a headline figure without its bench/README.md row: {row}"
        assert links[0] in targets, f"bench/README.md has no section #{links[0]}"


def test_every_relative_link_leads_to_a_file():
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text()):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"


def test_anchor_is_githubs():
    assert anchor("End to end against llama-server") == "end-to-end-against-llama-server"
    assert anchor("Start-up and memory") == "start-up-and-memory"
    assert anchor("Kernels: per-row arithmetic (`engine.batch_invariant`)") == \
        "kernels-per-row-arithmetic-enginebatch_invariant"


def commands() -> list[list[str]]:
    """Every command of the README's ```sh blocks, as words: continuations joined, comments and
    environment assignments dropped, `&&`, `;`, `|` and `&` separating commands."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*", "", line)
            for part in re.split(r"&&|;|\||&", line):
                words = shlex.split(part)
                while words and re.match(r"[A-Z_]+=", words[0]):
                    words.pop(0)
                if words:
                    found.append(words)
    for span in re.findall(r"`((?:\.venv/bin/stackd|make) [^`]+)`", README.read_text()):
        found.append(shlex.split(span))
    return found


def test_every_make_target_and_stackd_command_in_the_readme_exists():
    from stackd.cli import build_parser

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    seen = 0
    for words in commands():
        if words[0] == "make":
            assert words[1] in targets, f"README.md runs `make {words[1]}`, which the Makefile lacks"
            seen += 1
        elif words[0].endswith("bin/stackd"):
            try:
                build_parser().parse_args(words[1:])
            except SystemExit:
                raise AssertionError(f"the CLI refuses the README's `{' '.join(words)}`") from None
            seen += 1
    assert seen >= 6, commands()          # make run, make test, make wheels, make image, stackd ...
