"""models.memory_limit_mb at its edges: what this node offers to models, on top of the reserve,
less what models placed here take already."""
from __future__ import annotations

import pytest

from stackd import config
from stackd.http.errors import ApiError, ErrorKind

from tests.answers import raises_http
from stackd.runtime import planner as manager_module
from stackd.engine.config import EngineConfig
from stackd.runtime.planner import MIB
from stackd.runtime.registry import ModelRegistry
from stackd.cluster.placement import Placement, Share
from stackd.store.store import Manifest

pytestmark = pytest.mark.slow

MANIFEST = Manifest(id="m", file="blobs/sha256-" + "0" * 64, size=100 * MIB, sha256="0" * 64,
                    architecture="llama", kind="chat", quantization="Q4_1", parameter_count=1,
                    context_length=8192, n_layer=30, n_embd=576, n_head_kv=3, n_head=9)


@pytest.fixture
def plenty(monkeypatch):
    monkeypatch.setattr(manager_module.readings, "meminfo",
                        lambda: {"MemTotal": 64 << 30, "MemAvailable": 32 << 30})


def manager(loop, limit: int) -> ModelRegistry:
    return ModelRegistry(loop, store=None, config=EngineConfig(slots=2), memory_reserve=512 * MIB,
                        memory_limit=limit)


def test_a_load_may_take_exactly_the_limit_and_not_a_byte_more(loop, plenty):
    needed = sum(manager(loop, 0).planner.estimate(MANIFEST, 1024).values())
    manager(loop, needed).planner.admit(MANIFEST, 1024)
    with raises_http() as refused:
        manager(loop, needed - 1).planner.admit(MANIFEST, 1024)
    assert refused.value.kind is ErrorKind.INSUFFICIENT_MEMORY
    assert "models.memory_limit_mb" in refused.value.message


def test_zero_means_all_the_free_memory_after_the_reserve(loop, plenty):
    assert manager(loop, 0).planner.own_offer() == (32 << 30) - 512 * MIB


def test_the_reserve_still_applies_under_a_generous_limit(loop, monkeypatch):
    monkeypatch.setattr(manager_module.readings, "meminfo",
                        lambda: {"MemTotal": 64 << 30, "MemAvailable": 1024 * MIB})
    assert manager(loop, 1 << 40).planner.own_offer() == 512 * MIB


def test_models_placed_here_count_against_the_limit(loop, plenty):
    m = manager(loop, 1000 * MIB)

    class Placed:                                       # a model holding 300 MiB on this node
        placement = Placement("layer", (Share("self", 300 * MIB, layers=10), Share("f1", 600 * MIB, layers=20)))
    m.loaded["other"] = Placed()
    assert m.planner.own_offer() == 700 * MIB


@pytest.mark.parametrize("value, ok", [(0, True), (1, True), (-1, False)])
def test_the_setting_is_zero_or_more(tmp_path, value, ok):
    (tmp_path / "config.toml").write_text(f"[models]\nmemory_limit_mb = {value}\n")
    if ok:
        assert config.load({"data_dir": str(tmp_path)}, environ={})["models.memory_limit_mb"] == value
    else:
        with pytest.raises(config.ConfigError, match="memory_limit_mb"):
            config.load({"data_dir": str(tmp_path)}, environ={})
