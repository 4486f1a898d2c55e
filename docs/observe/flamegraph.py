"""Render `perf script` output as an SVG flame graph (the picture in docs/observability.md, "Profiling").

    perf record -F 97 --call-graph dwarf,65528 -p PID -o perf.data -- sleep 10
    perf script -i perf.data | python docs/observe/flamegraph.py > flame.svg

Brendan Gregg's FlameGraph scripts do the same and more; this is the few lines that
picture needs, so rendering one takes nothing beyond perf and Python.
"""
from __future__ import annotations

import html
import re
import sys
import zlib

WIDTH, ROW = 1600, 18
FRAME = re.compile(r"^\s+[0-9a-f]+ (.+?) \((.*)\)$")


def stacks(lines) -> dict[tuple, int]:
    """perf script samples -> {(root, ..., leaf): count}."""
    counts: dict[tuple, int] = {}
    frames: list[str] = []
    for line in list(lines) + [""]:
        found = FRAME.match(line.rstrip("\n"))
        if found:
            symbol, module = found.groups()
            symbol = re.sub(r"\+0x[0-9a-f]+$", "", symbol.replace(" (inlined)", ""))
            if symbol == "[unknown]":
                symbol = f"[{module.rsplit('/', 1)[-1]}]"
            frames.append(symbol)
        elif not line.strip() and frames:
            key = tuple(reversed(frames))
            counts[key] = counts.get(key, 0) + 1
            frames = []
    return counts


def tree(counts: dict[tuple, int]) -> dict:
    root = {"name": "all", "n": 0, "kids": {}}
    for stack, n in counts.items():
        root["n"] += n
        node = root
        for name in stack:
            node = node["kids"].setdefault(name, {"name": name, "n": 0, "kids": {}})
            node["n"] += n
    return root


def depth(node) -> int:
    return 1 + max((depth(k) for k in node["kids"].values()), default=0)


def svg(root) -> str:
    height = (depth(root) + 1) * ROW
    scale = WIDTH / max(root["n"], 1)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<rect width="{WIDTH}" height="{height}" fill="#fdf6e3"/>']

    def draw(node, x: float, level: int) -> None:
        w = node["n"] * scale
        if w < 0.5:
            return
        y = height - (level + 1) * ROW
        hue = zlib.crc32(node["name"].encode()) % 60
        label = html.escape(node["name"])
        out.append(f'<g><title>{label} ({node["n"]} samples, {100 * node["n"] / root["n"]:.1f}%)</title>'
                   f'<rect x="{x:.1f}" y="{y}" width="{max(w - 0.5, 0.5):.1f}" height="{ROW - 1}" '
                   f'fill="hsl({hue},85%,60%)"/>')
        chars = int(w / 6.6)
        if chars >= 3:
            text = node["name"] if len(node["name"]) <= chars else node["name"][:chars - 2] + ".."
            out.append(f'<text x="{x + 3:.1f}" y="{y + ROW - 5}">{html.escape(text)}</text>')
        out.append("</g>")
        for kid in sorted(node["kids"].values(), key=lambda k: k["name"]):
            draw(kid, x, level + 1)
            x += kid["n"] * scale

    draw(root, 0.0, 0)
    out.append("</svg>")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(svg(tree(stacks(sys.stdin))))
