"""One typed engine configuration, from the settings' `engine` section to the C++ engine.

Each setting has one name all the way: `engine.max_queue` in the config file is
`EngineConfig.max_queue` here and `engine_params.max_queue` in native/engine/engine.h (the
keyword the worker hands to Engine(...)). The runtime builds it once from the settings and
passes it down; `params()` is what one model's engine is started with.
"""
from __future__ import annotations

from dataclasses import dataclass

FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}      # llama_flash_attn_type
# The KV cache's element types (engine.kv_type, a load's options.kv_type): their ggml_type.
KV_TYPES = {"f16": 1, "q8_0": 8}


def kv_bytes(n_values: int, kv_type: str) -> int:
    """Bytes of a row of `n_values` K or V values stored as `kv_type`: f16 2 bytes a value,
    q8_0 blocks of 32 int8 and one f16 scale, 34 bytes (llama.cpp refuses a quantized cache for
    a head size that is not a multiple of 32)."""
    return 2 * n_values if kv_type == "f16" else -(-n_values // 32) * 34


@dataclass(frozen=True)
class EngineConfig:
    slots: int = 16                 # sequences decoded together (chat models)
    context_length: int = 2048      # default tokens per sequence; a load may ask for another
    batch: int = 512                # tokens per decode step at most
    threads: int = 0                # 0: every core
    max_queue: int = 256            # waiting requests beyond which submit refuses
    flash_attn: str = "auto"        # auto | on | off
    kv_type: str = "f16"            # f16 | q8_0: the KV cache's default type; a load may ask for another
    key_share: float = 1.0          # most of the slots and queue one API key may hold
    speculative: str = "ngram"      # draftless speculative decoding: ngram | off
    speculative_draft_max: int = 8  # drafted tokens per sequence and step at most
    speculative_step_tokens: int = 16   # a step's tokens that drafts may fill up to
    isolation: str = "worker"       # worker: each model's engine in a supervised process; inline
    kv_commit: str = "lazy"         # KV cache pages taken as written | all at load (accel.commit_on_write)
    kernels: str = "auto"           # our matmuls (kernels/, engine/accel.py): auto | off
    batch_invariant: bool = False   # every step on ggml's per-row paths (accel.register)
    omp_wait_policy: str = "auto"   # workers' OpenMP barrier waits: auto | passive | active | inherit
    embedding_nice: int = 0         # embedding workers' niceness
    restart_hold: float = 10.0      # seconds a request waits for its model's restarting worker

    @classmethod
    def from_settings(cls, engine: dict, key_share: float) -> "EngineConfig":
        """`engine`: the settings' validated `engine` section (config.py); `key_share` comes
        from inference.limits, where the other per-key limits are."""
        return cls(key_share=key_share, **{name: engine[name] for name in cls.__dataclass_fields__
                                          if name != "key_share"})

    def params(self, model_path: str, embeddings: bool, context_length: int,
               kv_type: str | None = None) -> dict:
        """The C++ engine's keyword arguments for one model (engine_params, same names);
        `kv_type`: the load's (options.kv_type), else the setting; an embedding model keeps
        f16 (an encoder has no KV cache, and a pooled batch is not decoded token by token)."""
        kv_type = "f16" if embeddings else (kv_type or self.kv_type)
        return dict(model_path=model_path, embeddings=embeddings, slots=self.slots,
                    context_length=context_length, batch=self.batch, threads=self.threads,
                    max_queue=self.max_queue, flash_attn=FLASH_ATTN[self.flash_attn],
                    key_share=self.key_share,
                    # engine_params: a draft length of 0 is drafting off
                    speculative_draft_max=self.speculative_draft_max if self.speculative == "ngram" else 0,
                    speculative_step_tokens=self.speculative_step_tokens, kv_type=KV_TYPES[kv_type])

    def omp_wait_policy_for(self, embeddings: bool) -> str:
        """`auto`: a generation worker keeps libgomp's default (spin a little, then sleep: what
        llama-server and an inline engine do; sleeping at once cost most of its tokens/s on a quiet
        machine (bench/README.md, "OpenMP waits"), where ggml's barriers after each operation are the hot path), an embedding
        worker sleeps at once (its bulk batches must not spin against the chat model's threads
        on the same cores)."""
        if self.omp_wait_policy != "auto":
            return self.omp_wait_policy
        return "passive" if embeddings else "inherit"
