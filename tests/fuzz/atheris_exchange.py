"""Coverage-guided fuzzing of the exchange's frame reader with atheris (libFuzzer), beside
atheris_targets.py's targets (the same property as test_fuzz_exchange_frames.py):

    python -m tests.fuzz.atheris_exchange SECONDS

The first two bytes of an input choose where the rest is cut into pieces for the reader.
"""
from __future__ import annotations

import os
import sys
import tempfile

import atheris

with atheris.instrument_imports(include=["stackd"]):
    from tests.fuzz.test_fuzz_exchange_frames import BASE, in_place_or_refuse, read_or_refuse


def exchange(data: bytes) -> None:
    cuts = list(data[:2])
    read_or_refuse((data[2:], cuts))
    in_place_or_refuse(data[2:])


def main(seconds: int) -> None:
    corpus = tempfile.mkdtemp(prefix="stackd-atheris-exchange-")
    with open(os.path.join(corpus, "seed0"), "wb") as f:
        f.write(b"\x10\x40" + BASE)
    crashes = os.path.join(os.getcwd(), "build", "fuzz")
    os.makedirs(crashes, exist_ok=True)
    atheris.Setup([sys.argv[0], corpus, f"-max_total_time={seconds}", "-max_len=4096",
                   f"-artifact_prefix={os.path.join(crashes, 'crash-exchange-')}"], exchange)
    atheris.Fuzz()


if __name__ == "__main__":
    main(int(sys.argv[1]))
