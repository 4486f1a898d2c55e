"""llama-cpp-python's JSON-schema-to-GBNF converter, without llama-cpp-python's package.

`llama_cpp/llama_grammar.py` is plain Python (standard library only), but importing it as
`llama_cpp.llama_grammar` runs the package's __init__, which loads numpy and the whole ctypes
binding: about 28 MB of the daemon's memory for two functions. So the file is loaded on its
own, from the installed package, under a private name (the same code as the wheel's, never a
copy of it). A process that has imported the package already reuses its module.
"""
from __future__ import annotations

import importlib.util
import os
import sys


def _llama_grammar():
    loaded = sys.modules.get("llama_cpp.llama_grammar")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("llama_cpp")          # finds it, runs nothing
    path = os.path.join(package.submodule_search_locations[0], "llama_grammar.py")
    spec = importlib.util.spec_from_file_location("stackd_llama_grammar", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                          # dataclasses look it up by name
    spec.loader.exec_module(module)
    return module


_module = _llama_grammar()
json_schema_to_gbnf = _module.json_schema_to_gbnf
JSON_GBNF = _module.JSON_GBNF
