"""The model a request names, loaded as its options ask: `num_ctx` is the context a load sets
(a model loaded with less is loaded again with it once its requests have ended, as Ollama
does; one loaded with at least as much serves as it is), `keep_alive` the time it stays once
idle (0: unloaded as soon as nobody uses it). Also how long getting it took: Ollama's load_duration."""
from __future__ import annotations

import time
from urllib.parse import urlsplit

from ...http.errors import invalid
from . import names


class Got:
    __slots__ = ("model", "load_ns")

    def __init__(self, model, load_ns: int):
        self.model, self.load_ns = model, load_ns


async def model_for(ctx, model_id: str, kind: str, num_ctx: int | None, keep_alive: float | None) -> Got:
    registry = ctx.models
    started = time.monotonic_ns()
    if num_ctx is not None:
        manifest = registry.manifest(model_id)
        trained = manifest.context_length
        if trained is not None and num_ctx > trained:
            raise invalid(f"'options.num_ctx' is {num_ctx}; this model was trained with {trained} tokens "
                          "of context at most", "options.num_ctx")
        if kind == "chat":
            await registry.load_with_context(model_id, num_ctx)
    model = await registry.get(model_id, kind)
    if keep_alive is not None:
        registry.set_keep_alive(model_id, keep_alive)
    return Got(model, time.monotonic_ns() - started)


async def load_only(ctx, model_id: str, num_ctx: int | None, keep_alive: float | None, started: int) -> dict:
    """A chat or generate with nothing to answer, Ollama's way to load a model (done_reason
    "load", with its durations) or, keep_alive 0, to unload it ("unload"): once nobody uses it,
    never another client's request cut short. -> the answer's final fields."""
    if keep_alive == 0:
        await ctx.models.unload_when_idle(model_id)
        return {"done": True, "done_reason": "unload"}
    got = await model_for(ctx, model_id, "chat", num_ctx, keep_alive)
    return {"done": True, "done_reason": "load", "total_duration": time.monotonic_ns() - started,
            "load_duration": got.load_ns}


def resolve(ctx, body: dict, field: str = "model") -> str:
    """The store id of the body's model (Ollama's older clients write `name`)."""
    name = body.get(field)
    if name is None and field == "model":
        name = body.get("name")
    return names.store_id(ctx.models.store, name, field, registry_host(ctx))


def registry_host(ctx) -> str:
    """host[:port] of models.registry as a name writes it ("" when none is configured)."""
    url = ctx.pulls.settings.url
    if not url:
        return ""
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    host = (parts.hostname or "").lower()
    return host if parts.port in (None, default) else f"{host}:{parts.port}"
