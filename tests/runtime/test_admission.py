"""Load admission: the memory estimate and its refusal, without a model."""
import asyncio

import pytest

from stackd.http.errors import ApiError

from tests.answers import raises_http
from stackd.runtime import planner as manager_module
from stackd.engine.config import EngineConfig
from stackd.runtime.planner import BUFFER_OVERHEAD, MIB, kv_bytes_per_token
from stackd.runtime.registry import ModelRegistry
from stackd.store.store import Manifest

MANIFEST = Manifest(id="m", file="blobs/sha256-" + "0" * 64, size=100 * MIB, sha256="0" * 64,
                    architecture="llama", kind="chat", quantization="Q4_1", parameter_count=1,
                    context_length=8192, n_layer=30, n_embd=576, n_head_kv=3, n_head=9)


def manager(slots=16, reserve=512 * MIB) -> ModelRegistry:
    return ModelRegistry(asyncio.new_event_loop(), store=None, config=EngineConfig(slots=slots),
                        memory_reserve=reserve)


def test_kv_bytes_per_token_counts_k_and_v_of_every_layer_in_f16():
    # 2 (K and V) * 30 layers * (576 * 3 / 9) * 2 bytes
    assert kv_bytes_per_token(MANIFEST) == 2 * 30 * 192 * 2


def test_the_estimate_counts_every_slot():
    parts = manager(slots=16).planner.estimate(MANIFEST, 2048)
    assert parts["kv_cache"] == 16 * 2048 * kv_bytes_per_token(MANIFEST)
    assert parts["weights"] == MANIFEST.size and parts["buffers"] == BUFFER_OVERHEAD


def test_an_embedding_model_has_no_kv_slots():
    embedding = Manifest(**{**MANIFEST.to_json(), "kind": "embedding"})
    assert manager().planner.estimate(embedding, 512)["kv_cache"] == 0


@pytest.mark.parametrize("slots, fits", [(1, True), (16, False)])
def test_admission_refuses_what_all_the_slots_would_not_fit(monkeypatch, slots, fits):
    one_slot = MANIFEST.size + 2048 * kv_bytes_per_token(MANIFEST) + BUFFER_OVERHEAD
    free = one_slot + 100 * MIB                    # room for one slot's KV, not for sixteen
    monkeypatch.setattr(manager_module.readings, "meminfo",
                        lambda: {"MemTotal": 8 << 30, "MemAvailable": free + 512 * MIB})
    m = manager(slots=slots)
    if fits:
        m.planner.admit(MANIFEST, 2048)
    else:
        with raises_http() as refused:
            m.planner.admit(MANIFEST, 2048)
        assert refused.value.kind.status == 507 and "nothing was changed" in refused.value.message
