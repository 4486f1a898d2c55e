"""Model names as Ollama's clients write them, and the store's ids.

Ollama names are `[host/][namespace/]name[:tag]`, the tag `latest` when none is written and the
namespace `library` when none is. The store keeps a pulled model as Ollama names it
(store/pulling.py model_id_for: `name:tag`, `ns/name:tag`, `host/ns/name:tag`) and the default
models without a tag; so a name is looked up as written, then without `library/`, then with or
without `:latest`. Listings name each model by its id (see `shown`)."""
from __future__ import annotations

from ...errors import Code, DomainError
from ...http.errors import invalid
from ...store.store import valid_model_id

LATEST = ":latest"
LIBRARY = "library/"


def candidates(name: str, registry_host: str = "") -> list[str]:
    """The store ids `name` may stand for, the likeliest first. `registry_host`: the configured
    registry's host[:port], which a pull leaves out of the ids of its models (a name that
    carries another host is that registry's model, never this one's)."""
    name = name.strip()
    lower = name.lower()
    out = [name] if lower == name else [name, lower]
    if registry_host and lower.startswith(registry_host.lower() + "/"):
        out.append(lower[len(registry_host) + 1:])
    for base in list(out):
        if base.startswith(LIBRARY):
            out.append(base[len(LIBRARY):])
    for base in list(out):
        tagged = ":" in base.rsplit("/", 1)[-1]
        if base.endswith(LATEST):
            out.append(base[:-len(LATEST)])
        elif not tagged:
            out.append(base + LATEST)
    return list(dict.fromkeys(out))


def store_id(store, name, field: str = "model", registry_host: str = "") -> str:
    """The store's id of the model `name` names; a 404 in Ollama's words when none is stored."""
    if not isinstance(name, str) or not name.strip():
        raise invalid(f"'{field}' is required: a model name such as \"smollm2-135m-instruct\"", field)
    if len(name) > 256:
        raise invalid(f"'{field}' is longer than 256 characters", field)
    for candidate in candidates(name, registry_host):
        if valid_model_id(candidate) and store.get(candidate) is not None:
            return candidate
    raise DomainError(Code.MODEL_NOT_FOUND, f"model '{name}' not found, try pulling it first", param=field)


def new_id(name, field: str) -> str:
    """A name for a model about to be stored (copy, create): as written, less `library/` and a
    `:latest` tag (the store's own spelling of Ollama's defaults)."""
    if not isinstance(name, str) or not name.strip():
        raise invalid(f"'{field}' is required: a model name such as \"mymodel:latest\"", field)
    model_id = name.strip().lower()
    if model_id.startswith(LIBRARY):
        model_id = model_id[len(LIBRARY):]
    if model_id.endswith(LATEST):
        model_id = model_id[:-len(LATEST)]
    if not valid_model_id(model_id):
        raise invalid(f"'{field}' is not a valid model name: [namespace/]name[:tag] of lower-case letters, "
                      "digits, '.', '_' and '-'", field)
    return model_id


def shown(model_id: str) -> str:
    """A store id as this port names it: the id itself, without the `:latest` Ollama would add,
    because clients send the names they list to OpenAI's routes on the same port too (Copilot's
    provider chats through /v1/chat/completions), which take the store's ids as they are."""
    return model_id
