"""The prompt cache on disk as the runtime sets it up (the cache itself is the engine's:
native/engine/prompt_cache.h): where a model's files go, what their key holds beyond what the
engine knows of itself, and the settings (models.prompt_cache_mb, models.prompt_cache_min_tokens,
models.prompt_cache_preload).

A chat model's engine saves the KV state of each prompt of at least min_tokens into
DATA_DIR/models/kv/<its blob's sha256>/, and restores the longest saved prefix of a later prompt
that no slot holds in memory, in that engine or the next one on the same data dir (after an
unload, a worker's restart, a reboot). A load puts the prompt_cache_preload most recently used
files back into idle slots before it serves, so that the next turn of the conversations served
last reuses its prefix in memory, as if the model had never gone. The key of a file is the model's digest, the kernels'
arithmetic (engine.kernels and the code path it resolves to on this CPU, which the process that
registers the kernels adds: accel.keyed; engine.batch_invariant),
engine.flash_attn, and what the engine adds (KV type, context length, slots, the model's shape):
a file made under any other is never restored. The store removes a model's directory with its
blob (`stackd models rm`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..engine.config import EngineConfig

MIB = 1024 * 1024
KEY_VERSION = 1


@dataclass(frozen=True)
class PromptCacheConfig:
    root: str = ""                  # DATA_DIR/models/kv; empty: off
    max_mb: int = 0                 # every model's files at most; 0: off
    min_tokens: int = 512           # prompts shorter than this are not saved
    disk_reserve_mb: int = 0        # free disk a save must leave (models.disk_reserve_mb)
    preload: int = 0                # most recently used files a load restores into idle slots

    @classmethod
    def from_settings(cls, store, models: dict) -> "PromptCacheConfig":
        """`models`: the settings' validated `models` section; `store`: the ModelStore."""
        return cls(root=store.prompt_cache, max_mb=models["prompt_cache_mb"],
                   min_tokens=models["prompt_cache_min_tokens"], disk_reserve_mb=models["disk_reserve_mb"],
                   preload=models["prompt_cache_preload"])

    @property
    def enabled(self) -> bool:
        return bool(self.root) and self.max_mb > 0

    def key(self, sha256: str, config: EngineConfig) -> str:
        # The code path `auto` resolves to is added where the kernels are registered (the
        # worker, or the daemon before an inline engine: accel.keyed): the daemon never loads
        # the kernels' library itself (tests/kernels/test_accel.py).
        return (f"stackd-prompt-cache-{KEY_VERSION};model={sha256};kernels={config.kernels};"
                f"batch_invariant={int(config.batch_invariant)};flash_attn_setting={config.flash_attn}")

    def params(self, sha256: str, kind: str, config: EngineConfig) -> dict:
        """The Engine(...) keywords for a model of blob `sha256`; none (the cache off) for an
        embedding model or when the cache is off."""
        if not self.enabled or kind == "embedding":
            return {}
        return dict(prompt_cache_dir=os.path.join(self.root, sha256), prompt_cache_root=self.root,
                    prompt_cache_key=self.key(sha256, config), prompt_cache_min_tokens=self.min_tokens,
                    prompt_cache_bytes=self.max_mb * MIB, prompt_cache_disk_reserve=self.disk_reserve_mb * MIB,
                    prompt_cache_preload=self.preload)
