"""llama-cpp-python's JSON-schema-to-GBNF converter, without llama-cpp-python's package.

`llama_cpp/llama_grammar.py` is plain Python (standard library only), but importing it as
`llama_cpp.llama_grammar` runs the package's __init__, which loads numpy and the whole ctypes
binding: about 28 MB of the daemon's memory for two functions. So the file is loaded on its
own, from the installed package, under a private name (the same code as the wheel's, never a
copy of it). A process that has imported the package already reuses its module.
"""
from __future__ import annotations

from ..system.imports import module_from_package_file

_module = module_from_package_file("llama_cpp", "llama_grammar.py", "stackd_llama_grammar")
json_schema_to_gbnf = _module.json_schema_to_gbnf
JSON_GBNF = _module.JSON_GBNF
