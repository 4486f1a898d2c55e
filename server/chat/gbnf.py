"""llama-cpp-python's JSON-schema-to-GBNF converter, without llama-cpp-python's package.

`llama_cpp/llama_grammar.py` is plain Python (standard library only), but importing it as
`llama_cpp.llama_grammar` runs the package's __init__, which loads numpy and the whole ctypes
binding: about 28 MB of the daemon's memory for two functions. So the file is loaded on its
own, from the installed package, under a private name (the same code as the wheel's, never a
copy of it). A process that has imported the package already reuses its module.

It is loaded by the first request that asks for JSON output, not at the daemon's start: the
file is large (~1.5 MB of the daemon's memory) and most requests never need it.
"""
from __future__ import annotations

import functools
from types import ModuleType

from ..system.imports import module_from_package_file


@functools.cache
def _module() -> ModuleType:
    return module_from_package_file("llama_cpp", "llama_grammar.py", "stackd_llama_grammar")


def json_schema_to_gbnf(schema: str) -> str:
    """The GBNF grammar of the JSON schema `schema` (a JSON text)."""
    return _module().json_schema_to_gbnf(schema)


def json_gbnf() -> str:
    """The GBNF grammar of any JSON value (response_format json_object)."""
    return _module().JSON_GBNF
