"""JSON schemas and JSON as GBNF grammars.

A schema is converted by llama.cpp's own converter (common/json-schema-to-grammar.cpp, in
stackd._chat), the one llama-server uses. llama-cpp-python's Python port lags it: its string rule
lets raw control characters into a string, so a "strict" schema let a small model write a newline
and run on inside a string value until max_tokens. The any-JSON grammar of json_object is
llama-cpp-python's JSON_GBNF (its string rule is right), loaded as described below.

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
    """The GBNF grammar of the JSON schema `schema` (a JSON text); ValueError when llama.cpp's
    converter cannot express it."""
    from .. import _chat        # on first use: most requests never need a grammar
    return _chat.json_schema_to_grammar(schema)


def json_gbnf() -> str:
    """The GBNF grammar of any JSON value (response_format json_object)."""
    return _module().JSON_GBNF
