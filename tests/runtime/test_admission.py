"""Load admission, without a model, at its edges: through the planner's context_for / estimate /
admit, the context a load gets, the KV bytes per token for every head layout, the estimate that
counts every slot, and the exact point of the 507."""
import asyncio

import pytest

from stackd.engine.config import EngineConfig
from stackd.http.errors import ErrorKind
from stackd.runtime import planner as manager_module
from stackd.runtime.planner import BUFFER_OVERHEAD, MIB, MIN_CONTEXT, kv_bytes_per_token
from stackd.runtime.registry import ModelRegistry
from stackd.store.store import Manifest

from tests.answers import raises_http


def manifest(**changes) -> Manifest:
    fields = dict(id="m", file="blobs/sha256-" + "0" * 64, size=100 * MIB, sha256="0" * 64,
                  architecture="llama", kind="chat", quantization="Q4_1", parameter_count=1,
                  context_length=8192, n_layer=30, n_embd=576, n_head_kv=3, n_head=9)
    return Manifest(**{**fields, **changes})


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def manager(loop, slots=16, context=2048, reserve=512 * MIB) -> ModelRegistry:
    return ModelRegistry(loop, store=None, config=EngineConfig(slots=slots, context_length=context),
                        memory_reserve=reserve)


@pytest.mark.parametrize("changes, per_token", [
    ({}, 2 * 30 * (576 * 3 // 9) * 2),
    ({"n_head_kv": None}, 2 * 30 * 576 * 2),            # no GQA facts: every head has its KV
    ({"n_head_kv": 2, "n_head": None}, 2 * 30 * 576 * 2 * 2),
    ({"n_head_kv": None, "n_head": None}, 2 * 30 * 576 * 2),
    ({"n_layer": None}, 0), ({"n_layer": 0}, 0), ({"n_embd": None}, 0), ({"n_embd": 0}, 0),
    ({"n_layer": 1, "n_embd": 7, "n_head_kv": 1, "n_head": 2}, 2 * 1 * 3 * 2),   # rounds down
])
def test_kv_bytes_per_token_for_each_head_layout(changes, per_token):
    assert kv_bytes_per_token(manifest(**changes)) == per_token


@pytest.mark.parametrize("trained, setting, expected", [
    (8192, 2048, 2048), (1024, 2048, 1024), (2048, 2048, 2048), (16, 2048, MIN_CONTEXT),
    (None, 4096, 4096),
])
def test_the_default_context_is_the_setting_within_the_training_and_the_minimum(
        loop, trained, setting, expected):
    m = manager(loop, context=setting)
    assert m.planner.context_for(manifest(context_length=trained), None) == expected


def test_a_requested_context_may_run_from_the_minimum_to_the_trained_length(loop):
    m = manager(loop)
    assert m.planner.context_for(manifest(), MIN_CONTEXT) == MIN_CONTEXT
    assert m.planner.context_for(manifest(), 8192) == 8192
    assert m.planner.context_for(manifest(context_length=None), 2048) == 2048   # trained unknown: the setting
    for requested in (MIN_CONTEXT - 1, 8193):
        with raises_http() as refused:
            m.planner.context_for(manifest(), requested)
        error = refused.value
        assert error.kind is ErrorKind.INVALID_REQUEST and error.param == "options.context_length"
        assert error.message == ("'options.context_length' must be from 32 to the model's trained "
                                 f"context, 8192; got {requested}")


def test_the_estimate_has_weights_kv_for_every_chat_slot_and_buffers(loop):
    parts = manager(loop, slots=3).planner.estimate(manifest(), 100)
    assert parts == {"weights": 100 * MIB, "kv_cache": 3 * 100 * kv_bytes_per_token(manifest()),
                     "buffers": BUFFER_OVERHEAD}
    assert manager(loop, slots=3).planner.estimate(manifest(kind="embedding"), 100)["kv_cache"] == 0


def memory(monkeypatch, available: int) -> None:
    monkeypatch.setattr(manager_module.readings, "meminfo",
                        lambda: {"MemTotal": 64 << 30, "MemAvailable": available})


@pytest.mark.parametrize("slots, fits", [(1, True), (16, False)])
def test_admission_refuses_what_all_the_slots_would_not_fit(loop, monkeypatch, slots, fits):
    one_slot = manifest().size + 2048 * kv_bytes_per_token(manifest()) + BUFFER_OVERHEAD
    memory(monkeypatch, one_slot + 100 * MIB + 512 * MIB)     # room for one slot's KV, not sixteen
    m = manager(loop, slots=slots)
    if fits:
        m.planner.admit(manifest(), 2048)
    else:
        with raises_http() as refused:
            m.planner.admit(manifest(), 2048)
        assert refused.value.kind.status == 507 and "nothing was changed" in refused.value.message


def test_admission_is_refused_one_byte_past_what_is_free(loop, monkeypatch):
    m = manager(loop, slots=2, reserve=300 * MIB)
    needed = sum(m.planner.estimate(manifest(), 1024).values())
    memory(monkeypatch, needed + 300 * MIB)
    m.planner.admit(manifest(), 1024)                                  # exactly fits
    memory(monkeypatch, needed + 300 * MIB - 1)
    with raises_http() as refused:
        m.planner.admit(manifest(), 1024)
    assert refused.value.kind is ErrorKind.INSUFFICIENT_MEMORY


def test_the_507_itemises_the_estimate_in_mib(loop, monkeypatch):
    m = manager(loop, slots=2, reserve=300 * MIB)
    kv = 2 * 1024 * kv_bytes_per_token(manifest())
    memory(monkeypatch, 300 * MIB + 10 * MIB)
    with raises_http() as refused:
        m.planner.admit(manifest(), 1024)
    needed = 100 * MIB + kv + BUFFER_OVERHEAD
    assert refused.value.message == (
        f"loading 'm' with a context of 1024 needs about {needed // MIB} MiB (weights 100, KV cache "
        f"{kv // MIB} as f16, buffers {BUFFER_OVERHEAD // MIB}) but only 10 MiB are free after a reserve "
        "of 300 MiB; nothing was changed")


def test_the_507_never_shows_negative_free_memory(loop, monkeypatch):
    memory(monkeypatch, 100 * MIB)
    with raises_http() as refused:
        manager(loop, reserve=512 * MIB).planner.admit(manifest(), 1024)
    assert "but only 0 MiB are free after a reserve of 512 MiB" in refused.value.message
