"""Ollama's model routes over the store and the registry of loaded models (the same models as
port 8080's): GET / and /api/version (what clients probe), /api/tags (the store), /api/show (one
model's facts, template and capabilities), /api/ps (the loaded ones and when each goes),
/api/pull (the registry stackd pulls Ollama's layout from, with Ollama's NDJSON progress),
/api/delete, /api/copy, /api/create (from a stored model, a GGUF file of the import directory,
or a blob sent to /api/blobs/:digest, through every check an import passes)."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import time

from ...auth import permissions as perm
from ...chat import infill as fim
from ...chat.formats import THINKING_MARKS
from ...errors import Code, DomainError
from ...http.errors import ApiError, ErrorKind, invalid
from ...http.response import Response, StreamingResponse, json_response
from ...store import gguf_check
from ...store.gguf_check import GGUFError
from ...system import offload
from ..errors import answer_of
from ..inference import params
from ..inference.infill import fim_tokens
from . import loading, names, timing
from .chat import NDJSON, line
from .errors import error_line

# Copilot's bring-your-own-model provider asks for at least 0.6.4; clients gate features on it
VERSION = "0.6.4"
RUNNING = b"Ollama is running"


def root(ctx, request) -> Response:
    return Response(200, RUNNING, b"text/plain; charset=utf-8")


def version(ctx, request) -> Response:
    return json_response({"version": VERSION})


# ---- facts of a model -------------------------------------------------------------------------

def parameter_size(count: int) -> str:
    """Ollama's parameter_size: "135M", "1.5B"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return str(count)


def details(manifest) -> dict:
    return {"parent_model": "", "format": "gguf", "family": manifest.architecture,
            "families": [manifest.architecture], "parameter_size": parameter_size(manifest.parameter_count),
            "quantization_level": manifest.quantization}


def listed(manifest) -> dict:
    name = names.shown(manifest.id)
    return {"name": name, "model": name, "modified_at": timing.rfc3339(manifest.created or time.time()),
            "size": manifest.size, "digest": manifest.sha256, "details": details(manifest)}


def tags(ctx, request) -> Response:
    return json_response({"models": [listed(m) for m in ctx.models.store.list()]})


_facts: dict[str, tuple[str, bool]] = {}       # blob digest -> (chat template, declares FIM tokens)


def _read_facts(path: str) -> tuple[str, bool]:
    found = {"template": "", "fim": False}

    def read(meta) -> None:
        if meta.type_name("tokenizer.chat_template") == "string":
            found["template"] = meta.string("tokenizer.chat_template") or ""
        keys = [key for role in ("pre", "suf", "mid") for key in fim.DECLARED[role]]
        found["fim"] = sum(meta.type_name(k) in ("uint32", "int32") for k in keys) >= 3

    gguf_check.check_gguf(path, extra_checks=(read,))
    return found["template"], found["fim"]


async def facts(ctx, manifest) -> tuple[str, bool]:
    """The model's chat template and whether its vocabulary has FIM tokens, read from its GGUF
    once per file (a model need not be loaded to be shown)."""
    known = _facts.get(manifest.sha256)
    if known is None:
        try:
            known = await offload.run(_read_facts, ctx.models.store.model_path(manifest))
        except (GGUFError, OSError) as exc:
            raise DomainError(Code.INVALID, f"model '{manifest.id}' cannot be read: {exc}", param="model") from None
        _facts[manifest.sha256] = known
    return known


async def capabilities(ctx, manifest, template: str, declares_fim: bool) -> list[str]:
    """Only what the model does here: completion (a chat model), tools (its template renders
    them), thinking (its template thinks), insert (FIM tokens: /api/generate's suffix), embedding."""
    if manifest.kind == "embedding":
        return ["embedding"]
    out = ["completion"]
    if "tools" in template:
        out.append("tools")
    if any(mark in template for mark in THINKING_MARKS):
        out.append("thinking")
    loaded = ctx.models.loaded.get(manifest.id)
    if loaded is not None:                    # the tokens as llama.cpp finds them, by text too
        declares_fim = not (await fim_tokens(ctx, loaded)).missing()
    if declares_fim:
        out.append("insert")
    return out


def model_info(manifest) -> dict:
    arch = manifest.architecture
    info = {"general.architecture": arch, "general.basename": manifest.id.split(":")[0].rsplit("/", 1)[-1],
            "general.parameter_count": manifest.parameter_count,
            "general.file_type": manifest.quantization}
    for key, value in ((f"{arch}.context_length", manifest.context_length),
                       (f"{arch}.embedding_length", manifest.n_embd), (f"{arch}.block_count", manifest.n_layer),
                       (f"{arch}.attention.head_count", manifest.n_head),
                       (f"{arch}.attention.head_count_kv", manifest.n_head_kv)):
        if value is not None:
            info[key] = value
    return info


DEFAULT_PARAMETERS = (f"temperature {params.DEFAULT_TEMPERATURE}\ntop_k {params.DEFAULT_TOP_K}\n"
                      f"top_p {params.DEFAULT_TOP_P}\nmin_p {params.DEFAULT_MIN_P}")


async def show(ctx, request) -> Response:
    body = request.json()
    model_id = loading.resolve(ctx, body)
    manifest = ctx.models.manifest(model_id)
    template, declares_fim = await facts(ctx, manifest)
    return json_response({
        "license": "", "modelfile": f"# stackd: the model {model_id} of the store\nFROM {names.shown(model_id)}\n",
        "parameters": DEFAULT_PARAMETERS if manifest.kind == "chat" else "", "template": template,
        "details": details(manifest), "model_info": model_info(manifest),
        "capabilities": await capabilities(ctx, manifest, template, declares_fim),
        "modified_at": timing.rfc3339(manifest.created or time.time())})


# Ollama shows a model kept for ever with an expiry this far out
FOR_EVER = "2318-08-31T00:00:00Z"


def ps(ctx, request) -> Response:
    out = []
    for model_id in list(ctx.models.loaded):
        try:
            manifest = ctx.models.manifest(model_id)
        except DomainError:                    # removed from the store while loaded
            continue
        described = ctx.models.describe(manifest)
        expires = described.get("expires_at")
        keep = described.get("keep_alive", -1)
        if expires is not None:
            expires_at = timing.rfc3339(expires)
        elif keep is None or keep < 0 or described.get("pinned"):
            expires_at = FOR_EVER
        else:                                  # in use: its clock starts when the last request ends
            expires_at = timing.rfc3339(time.time() + keep)
        size = manifest.size + (described.get("kv_cache") or {}).get("bytes", 0)
        out.append({**listed(manifest), "size": size, "size_vram": 0, "expires_at": expires_at,
                    "context_length": described.get("context_length")})
    return json_response({"models": out})


# ---- pull, delete, copy, create ---------------------------------------------------------------

def stream_of(body: dict) -> bool:
    value = body.get("stream", True)
    if not isinstance(value, bool):
        raise invalid("'stream' must be a boolean", "stream")
    return value


async def progress(first: dict, events):
    yield line(first)
    try:
        async for event in events:
            yield line(event)
    except (ApiError, DomainError) as exc:    # the head is sent: report in the stream, then end it
        yield line(error_line(answer_of(exc)))


def ollama_event(event: dict) -> dict:
    """The store's progress is Ollama's already; its last line says only success."""
    return {"status": "success"} if event.get("status") == "success" else event


async def _mapped(events):
    async for event in events:
        yield ollama_event(event)


async def pull(ctx, request) -> Response | StreamingResponse:
    body = request.json()
    name = body.get("model", body.get("name"))
    if not isinstance(name, str) or not name.strip() or len(name) > 256:
        raise invalid("'model' is required: a registry name such as \"smollm2:135m\"", "model")
    events = _mapped(ctx.pulls.pull(name.strip()))
    if stream_of(body):
        first = await anext(events)            # a bad name or a missing registry is a plain 4xx
        return StreamingResponse(progress(first, events), NDJSON)
    async for _ in events:
        pass
    return json_response({"status": "success"})


def push(ctx, request) -> Response:
    raise invalid("pushing is not supported: stackd pulls models from registries, it does not publish "
                  "to them", "model")


async def delete(ctx, request) -> Response:
    """The model out of memory (its requests end with 503) and out of the store; its blob goes
    when no other model names it."""
    model_id = loading.resolve(ctx, request.json())
    if model_id in ctx.models.loaded:
        await ctx.models.unload(model_id)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, ctx.models.store.remove, model_id)
    except KeyError:
        raise DomainError(Code.MODEL_NOT_FOUND, f"model '{model_id}' not found", param="model") from None
    return Response(200, b"", b"application/json")


def _put_as(ctx, manifest, new_id: str, field: str) -> None:
    """`manifest`'s model stored under `new_id` too: one blob, two names (a copy costs no disk).
    A loaded model's name is not taken over: its requests would answer with another model."""
    if new_id in ctx.models.loaded:
        raise ApiError(ErrorKind.CONFLICT, f"'{field}': the model '{new_id}' is loaded; unload it (keep_alive 0) "
                       "before replacing it", param=field)
    ctx.models.store.put(dataclasses.replace(manifest, id=new_id, created=int(time.time())))


async def copy(ctx, request) -> Response:
    body = request.json()
    source = loading.resolve(ctx, body, "source")
    destination = names.new_id(body.get("destination"), "destination")
    _put_as(ctx, ctx.models.manifest(source), destination, "destination")
    return Response(200, b"", b"application/json")


# Fields of Ollama's create that would change the model or bake in a prompt: stackd stores GGUF
# files as they are and takes prompts and sampling per request.
UNSUPPORTED_CREATE = {
    "quantize": "stackd stores a model as its GGUF file is; quantize it before",
    "adapters": "LoRA adapters are not applied",
    "template": "the GGUF's own chat template is used",
    "system": "a system prompt is sent with each request",
    "parameters": "sampling options are sent with each request",
    "messages": "a conversation is sent with each request",
}


async def create(ctx, request) -> Response | StreamingResponse:
    body = request.json()
    model_id = names.new_id(body.get("model", body.get("name")), "model")
    for name, why in UNSUPPORTED_CREATE.items():
        if body.get(name):
            raise invalid(f"'{name}' is not supported: {why}", name)
    stream = stream_of(body)
    source, files = body.get("from"), body.get("files")
    if (source is None) == (files is None):
        raise invalid("give 'from' (a model of the store, or a .gguf file of the import directory) or "
                      "'files' (a .gguf blob sent to /api/blobs/:digest)", "from")
    loop = asyncio.get_running_loop()
    if files is not None:
        await loop.run_in_executor(None, _from_blob, ctx, model_id, files)
    elif not isinstance(source, str) or not source:
        raise invalid("'from' must be a model name or a .gguf file's path", "from")
    elif source.endswith(".gguf"):     # a file of the import directory: an import, for admin keys alone
        if perm.ADMIN not in request.key.allowed:
            raise ApiError(ErrorKind.PERMISSION, "'from' names a file: adding a local file takes an admin key "
                           "(as POST /v1/models/import does)", param="from")
        await loop.run_in_executor(None, ctx.imports.add_requested, source, model_id)
    else:
        _put_as(ctx, ctx.models.manifest(loading.resolve(ctx, body, "from")), model_id, "model")
    if stream:
        return StreamingResponse(_lines({"status": "success"}), NDJSON)
    return json_response({"status": "success"})


async def _lines(*entries):
    for entry in entries:
        yield line(entry)


def _from_blob(ctx, model_id: str, files) -> object:
    """The one .gguf of `files` ({file name: "sha256:<hex>"}), a blob already sent, checked as a
    pulled model is (its structure, then its vocabulary by llama.cpp in a child process)."""
    if not isinstance(files, dict) or not files:
        raise invalid("'files' must be an object {\"model.gguf\": \"sha256:<digest>\"}", "files")
    ggufs = [(name, digest) for name, digest in files.items() if isinstance(name, str) and name.endswith(".gguf")]
    if len(ggufs) != 1 or len(files) != 1:
        raise invalid("'files' must name exactly one .gguf file (safetensors are not converted here)", "files")
    (_, digest), = ggufs
    hex_digest = blob_hex(digest, "files")
    store = ctx.models.store
    if not os.path.exists(store.blob_path(hex_digest)):
        raise invalid(f"'files': no blob {digest}; send it first to POST /api/blobs/{digest}", "files")
    try:
        manifest = store.manifest_for_blob(model_id, hex_digest, source="local")
    except GGUFError as exc:
        raise invalid(f"'files': the blob is not a GGUF model llama.cpp can load: {exc}", "files") from None
    if model_id in ctx.models.loaded:
        raise ApiError(ErrorKind.CONFLICT, f"the model '{model_id}' is loaded; unload it (keep_alive 0) "
                       "before replacing it", param="model")
    store.put(manifest)
    return manifest


def blob_hex(digest, field: str = "digest") -> str:
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71 \
            or any(c not in "0123456789abcdef" for c in digest[7:]):
        raise invalid(f"'{field}' must be a digest \"sha256:<64 lower-case hex digits>\"", field)
    return digest[7:]
