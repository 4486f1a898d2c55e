"""The native engine module (server._engine), re-exported.

llama_cpp is imported first on purpose: it loads llama.cpp's shared libraries from
its own directory, and our module's `libllama.so.0` dependency then binds to that
same copy by soname. One llama.cpp per process (see CMakeLists.txt).
"""
import llama_cpp  # noqa: F401  (load order matters, see above)

from .._engine import (  # noqa: E402
    COUNTERS,
    FINISH_REASONS,
    GAUGES,
    HISTOGRAMS,
    STATUS_ABORTED,
    STATUS_ERROR,
    STATUS_LENGTH,
    STATUS_RUNNING,
    STATUS_STOPPED,
    SPLIT_MODE_LAYER,
    SPLIT_MODE_TENSOR,
    SUBMIT_ACCEPTED,
    SUBMIT_OVER_SHARE,
    SUBMIT_QUEUE_FULL,
    Engine,
    Event,
    Sampler,
    SamplingParams,
    Scheduler,
    TextStream,
    Timings,
    Vocab,
)

# The sampling parameters' names, as the native module binds them (its one list, in sampling.h).
SAMPLING_FIELDS = tuple(name for name in dir(SamplingParams) if not name.startswith("_"))

__all__ = ["SAMPLING_FIELDS", "Engine", "Event", "COUNTERS", "HISTOGRAMS", "GAUGES", "Timings", "Sampler", "SamplingParams",
           "Scheduler", "TextStream", "FINISH_REASONS", "STATUS_RUNNING", "STATUS_STOPPED", "STATUS_LENGTH",
           "STATUS_ABORTED", "STATUS_ERROR", "SUBMIT_ACCEPTED", "SUBMIT_QUEUE_FULL", "SUBMIT_OVER_SHARE", "Vocab"]
