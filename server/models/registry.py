"""Loaded models by id. Loading runs in a worker thread so the event loop never stalls."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..engine import Engine
from ..engine.runner import ModelRunner
from ..http.errors import ApiError, ErrorKind
from .defaults import DEFAULTS


@dataclass
class EngineSettings:
    n_slots: int = 16
    context_length: int = 2048
    n_batch: int = 512
    n_threads: int = 0
    max_queue: int = 256
    flash_attn: int = -1


@dataclass
class LoadedModel:
    id: str
    kind: str                 # "chat" or "embedding"
    path: str
    runner: ModelRunner
    created: int
    formatter: object = None  # chat models: the sandboxed Jinja chat template
    state: str = "loaded"
    max_input: int = 0        # tokens one input may have (embeddings: the trained context)

    @property
    def engine(self) -> Engine:
        return self.runner.engine

    @property
    def context_length(self) -> int:
        return self.engine.n_ctx_seq


@dataclass
class ModelRegistry:
    loop: asyncio.AbstractEventLoop
    settings: EngineSettings = field(default_factory=EngineSettings)
    loaded: dict[str, LoadedModel] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)   # load order, for "the most recent chat model"

    async def load_default(self, model_id: str) -> LoadedModel:
        kind, locate = DEFAULTS[model_id]
        path = await self.loop.run_in_executor(None, locate)
        return await self.load(model_id, path, kind)

    async def load(self, model_id: str, path: str, kind: str) -> LoadedModel:
        s = self.settings
        embeddings = kind == "embedding"

        def construct() -> Engine:
            return Engine(path, embeddings=embeddings, n_slots=s.n_slots,
                          n_ctx_seq=s.context_length, n_batch=s.n_batch, n_threads=s.n_threads,
                          n_max_waiting=s.max_queue, flash_attn=s.flash_attn)

        engine = await self.loop.run_in_executor(None, construct)
        model = LoadedModel(model_id, kind, path, ModelRunner(self.loop, engine), int(time.time()))
        if embeddings:
            model.max_input = engine.n_ctx_train
        else:
            from ..inference.templates import formatter_for
            model.formatter = formatter_for(engine)
        self.loaded[model_id] = model
        self.order = [m for m in self.order if m != model_id] + [model_id]
        return model

    def get(self, model_id: str, kind: str) -> LoadedModel:
        model = self.loaded.get(model_id)
        if model is None:
            raise ApiError(ErrorKind.MODEL_NOT_FOUND, f"the model '{model_id}' does not exist or is "
                           "not loaded; GET /v1/models lists the models", param="model")
        if model.kind != kind:
            raise ApiError(ErrorKind.INVALID_REQUEST,
                           f"the model '{model_id}' is a {model.kind} model, not a {kind} model",
                           param="model")
        return model

    def active_chat_model(self) -> str | None:
        chat = [m for m in self.order if self.loaded[m].kind == "chat"]
        return chat[-1] if chat else None

    def close(self) -> None:
        for model in self.loaded.values():
            model.runner.close()
        self.loaded.clear()
        self.order.clear()
