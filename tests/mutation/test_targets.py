"""pyproject's [tool.mutmut] only_mutate names exactly the files of the one target list."""
import pathlib
import tomllib

from .targets import TARGETS, mutant_names

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_only_mutate_is_the_target_list():
    mutmut = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert sorted(mutmut["only_mutate"]) == sorted(TARGETS)


def test_every_target_exists_and_has_mutant_names():
    assert all((ROOT / path).is_file() for path in TARGETS)
    assert len(mutant_names()) >= len(TARGETS)
