"""Where llama.cpp's library is: the folder llama-cpp-python's package loads it from, or
LLAMA_CPP_LIB_PATH. A light module (no import of llama_cpp, nothing loaded): the daemon tells
its workers the folder before it loads the library itself (runtime/worker_process.py)."""
import importlib.util
import os

ENV = "LLAMA_CPP_LIB_PATH"


def library_dir() -> str:
    return os.environ.get(ENV) or os.path.join(
        importlib.util.find_spec("llama_cpp").submodule_search_locations[0], "lib")
