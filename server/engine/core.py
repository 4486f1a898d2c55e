"""The native engine module (server._engine), re-exported.

llama.cpp's library is loaded first on purpose, from the very file llama-cpp-python's
package loads (`llama_cpp/lib/libllama.so`, or LLAMA_CPP_LIB_PATH): our module's
`libllama.so.0` dependency then binds to that copy by soname, and a later `import llama_cpp`
in the same process opens the same file again. One llama.cpp per process (see
CMakeLists.txt). The package itself is not imported: it would bring numpy and its ctypes
binding, ~28 MB the daemon does not use.
"""
import ctypes
import os

from .llama_library import library_dir


def _load_llama_library() -> None:
    ctypes.CDLL(os.path.join(library_dir(), "libllama.so"), mode=ctypes.RTLD_GLOBAL)


_load_llama_library()

from .._engine import (COUNTERS, FINISH_REASONS, GAUGES, HISTOGRAMS, STATUS_ABORTED, STATUS_ERROR, STATUS_LENGTH, STATUS_RUNNING, STATUS_STOPPED, SPLIT_MODE_LAYER, SPLIT_MODE_TENSOR, SUBMIT_ACCEPTED, SUBMIT_OVER_SHARE, SUBMIT_QUEUE_FULL, Engine, Event, Sampler, SamplingParams, Scheduler, TextStream, Timings, Vocab, decode_events_wire, encode_events_wire)

# The sampling parameters' names, as the native module binds them (its one list, in sampling.h).
SAMPLING_FIELDS = tuple(name for name in dir(SamplingParams) if not name.startswith("_"))



def template_facts(model) -> dict:
    """What the daemon's chat template needs of a model (an Engine or a Vocab): its template
    text and the text of its BOS and EOS tokens (empty when it has none). A template that
    writes `{{ bos_token }}` (Llama 3's, Gemma's, Mistral's) gets the token's own text, as
    llama.cpp's server renders it, and tokenizing with special tokens turns it back into it."""
    def text(token: int) -> str:
        return model.piece(token, True).decode("utf-8", "replace") if token >= 0 else ""

    return {"chat_template": model.chat_template, "bos_text": text(model.token_bos),
            "eos_text": text(model.token_eos)}


__all__ = ["SAMPLING_FIELDS", "template_facts", "Engine", "Event", "COUNTERS", "HISTOGRAMS", "GAUGES", "Timings", "Sampler", "SamplingParams",
           "Scheduler", "TextStream", "FINISH_REASONS", "STATUS_RUNNING", "STATUS_STOPPED", "STATUS_LENGTH",
           "STATUS_ABORTED", "STATUS_ERROR", "SUBMIT_ACCEPTED", "SUBMIT_QUEUE_FULL", "SUBMIT_OVER_SHARE", "Vocab",
           "decode_events_wire", "encode_events_wire"]
