"""The native engine module (server._engine), re-exported.

llama.cpp's library is loaded first on purpose, from the very file llama-cpp-python's
package loads (`llama_cpp/lib/libllama.so`, or LLAMA_CPP_LIB_PATH): our module's
`libllama.so.0` dependency then binds to that copy by soname, and a later `import llama_cpp`
in the same process opens the same file again. One llama.cpp per process (see
CMakeLists.txt). The package itself is not imported: it would bring numpy and its ctypes
binding, ~28 MB the daemon does not use.
"""
import ctypes
import importlib.util
import os


def _load_llama_library() -> None:
    lib_dir = os.environ.get("LLAMA_CPP_LIB_PATH") or os.path.join(
        importlib.util.find_spec("llama_cpp").submodule_search_locations[0], "lib")
    ctypes.CDLL(os.path.join(lib_dir, "libllama.so"), mode=ctypes.RTLD_GLOBAL)


_load_llama_library()

from .._engine import (COUNTERS, FINISH_REASONS, GAUGES, HISTOGRAMS, STATUS_ABORTED, STATUS_ERROR, STATUS_LENGTH, STATUS_RUNNING, STATUS_STOPPED, SPLIT_MODE_LAYER, SPLIT_MODE_TENSOR, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_QUEUE_FULL, Engine, Event, Sampler, SamplingParams, Scheduler, TextStream, Timings, Vocab, decode_events_wire, encode_events_wire)

# The sampling parameters' names, as the native module binds them (its one list, in sampling.h).
SAMPLING_FIELDS = tuple(name for name in dir(SamplingParams) if not name.startswith("_"))

__all__ = ["SAMPLING_FIELDS", "Engine", "Event", "COUNTERS", "HISTOGRAMS", "GAUGES", "Timings", "Sampler", "SamplingParams",
           "Scheduler", "TextStream", "FINISH_REASONS", "STATUS_RUNNING", "STATUS_STOPPED", "STATUS_LENGTH",
           "STATUS_ABORTED", "STATUS_ERROR", "SUBMIT_ACCEPTED", "SUBMIT_QUEUE_FULL", "SUBMIT_OVER_SHARE", "Vocab",
           "decode_events_wire", "encode_events_wire"]
