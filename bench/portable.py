"""The portable llama.cpp build against the native one: decode tokens/s at 1 and 16 streams.

The portable build is what `make wheels` ships (native/llama_wheel.py --portable: every ggml
backend a module, the CPU backend once per CPU generation, the best variant loaded at run time;
packaging/native/ggml_backends.cpp). The native build is `make setup`'s (.venv's
llama-cpp-python: ggml's CPU backend compiled for this machine's SIMD flags, linked in). Both
are llama-cpp-python 0.3.36 from the same source, so the engine (our _engine module, our
kernels) is the same code on both sides: each child runs this checkout's engine, the portable
side with LLAMA_CPP_LIB_PATH pointing at the portable wheel's libraries (unpacked into
build/portable-bench/), so that only ggml's build differs. Each child says which ggml CPU
library it mapped (libggml-cpu.so: native; libggml-cpu-<variant>.so: portable).

Our kernels on (engine.kernels auto: our matmuls and decode attention serve the weights they
cover, ggml the rest) and off (ggml's matmuls: the difference of the two ggml builds shows).
One round runs the four (build, kernels) cells, each a process of its own, in an order that
alternates from round to round, so a shared machine's slow phases fall on both builds alike.
Reported: per cell the median and range of decode tok/s over the rounds, and the median and
range of the per-round ratio portable / native.

    .venv/bin/python bench/portable.py [--rounds 7] [--threads 2] [--streams 1,16]

Same engine settings as bench/kernels_engine.py (the default SmolLM2-135M Q4_1, 32-token
prompts, 128 generated tokens per stream, flash attention on). The portable wheel is built
first if .wheelhouse/ has none (llama.cpp's CPU variants: 12-18 min on two cores; take
/tmp/stackd-build.lock on a shared machine).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import zipfile
from statistics import median

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "native"))

UNPACKED = os.path.join(ROOT, "build", "portable-bench")


def portable_lib_dir() -> tuple[str, str]:
    """(the portable wheel's llama_cpp/lib unpacked, the wheel's flags digest)."""
    wheel = subprocess.run([sys.executable, os.path.join(ROOT, "native", "llama_wheel.py"), "--portable"],
                           check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    digest = os.path.basename(os.path.dirname(wheel)).rsplit("-", 1)[-1]
    target = os.path.join(UNPACKED, digest)
    lib = os.path.join(target, "llama_cpp", "lib")
    stamp = os.path.join(target, ".unpacked")
    if not (os.path.exists(stamp) and open(stamp).read() == wheel):
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("llama_cpp/lib/"):
                    z.extract(name, target)
        with open(stamp, "w") as f:
            f.write(wheel)
    return lib, digest


def mapped_cpu_library() -> str:
    with open("/proc/self/maps") as f:
        names = {os.path.basename(line.split()[-1]) for line in f if "libggml-cpu" in line}
    return ",".join(sorted(names)) or "none"


def child(mode: str, streams: list[int], threads: int) -> None:
    from kernels_engine import model_path, run_streams
    # llama.cpp's library first, from LLAMA_CPP_LIB_PATH (engine/core.py loads it on import):
    # our kernels' library, loaded next, binds to that ggml by soname, not to its runpath's
    import stackd.engine.core  # noqa: F401
    from stackd.engine import accel
    accel.commit_on_write()
    path = accel.register(mode)
    from stackd.engine.core import Engine
    engine = Engine(model_path(None), slots=max(streams), context_length=256, batch=512,
                    threads=threads, flash_attn=1)
    run_streams(engine, 2, 1)  # warm up
    out = {"path": path, "cpu_library": mapped_cpu_library()}
    for i, n in enumerate(streams):
        out[str(n)] = run_streams(engine, n, 1000 * (i + 1))["decode"]
    engine.close()
    print(json.dumps(out))


def run_child(build: str, lib: str, mode: str, streams: list[int], threads: int) -> dict:
    env = dict(os.environ)
    env.pop("LLAMA_CPP_LIB_PATH", None)
    if build == "portable":
        env["LLAMA_CPP_LIB_PATH"] = lib
    out = subprocess.run([sys.executable, __file__, "--child", mode, "--threads", str(threads),
                          "--streams", ",".join(map(str, streams))],
                         check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--kernels", default="auto", help="engine.kernels of the kernels-on cells")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    if args.child:
        return child(args.child, streams, args.threads)

    from kernels_engine import cpu_name
    lib, digest = portable_lib_dir()
    cells = [(build, mode) for mode in (args.kernels, "off") for build in ("native", "portable")]
    results: dict = {cell: {n: [] for n in streams} for cell in cells}
    libraries: dict = {}
    print(f"{cpu_name()}; portable wheel {digest} ({lib}); {args.threads} threads; "
          f"load {os.getloadavg()[0]:.2f} at start", flush=True)
    for r in range(args.rounds):
        # alternate: native first in even rounds, portable first in odd ones; kernels on/off too
        order = cells if r % 2 == 0 else list(reversed(cells))
        line = []
        for build, mode in order:
            out = run_child(build, lib, mode, streams, args.threads)
            libraries[(build, mode)] = (out["cpu_library"], out["path"])
            for n in streams:
                results[(build, mode)][n].append(out[str(n)])
            line.append(f"{build}/{mode}: " + " ".join(f"{out[str(n)]:.0f}" for n in streams))
        print(f"round {r + 1} (load {os.getloadavg()[0]:.2f}): " + "; ".join(line), flush=True)
    for cell, (cpu_lib, path) in libraries.items():
        print(f"{cell[0]}, kernels {cell[1]}: ggml CPU library {cpu_lib}; our kernels' path {path}")
    print(f"\ndecode tok/s over {args.rounds} alternating rounds (median, [min-max]); "
          f"ratio = portable / native, per round")
    print("| kernels | streams | native | portable | ratio median | ratio range |\n|---|---|---|---|---|---|")
    for mode in (args.kernels, "off"):
        for n in streams:
            nat, por = results[("native", mode)][n], results[("portable", mode)][n]
            ratios = [p / q for p, q in zip(por, nat)]
            print(f"| {mode} | {n} | {median(nat):.0f} [{min(nat):.0f}-{max(nat):.0f}] | "
                  f"{median(por):.0f} [{min(por):.0f}-{max(por):.0f}] | {median(ratios):.3f}x | "
                  f"{min(ratios):.3f}-{max(ratios):.3f}x |")
    print(f"load at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
