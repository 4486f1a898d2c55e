"""Type stubs for the native engine module (native/bindings.cpp)."""
from typing import Any, Literal, TypedDict

import numpy as np

FINISH_REASONS: list[str | None]
STATUS_RUNNING: int
STATUS_STOPPED: int
STATUS_LENGTH: int
STATUS_ABORTED: int
STATUS_ERROR: int
SUBMIT_ACCEPTED: int
SUBMIT_QUEUE_FULL: int
SUBMIT_OVER_SHARE: int

# (field, Prometheus name after "stackd_", labels, help), from native/engine/counters.h
COUNTERS: list[tuple[str, str, str, str]]

class EngineStats(TypedDict):
    """Engine.stats(); tests/observe checks these names against COUNTERS."""
    n_steps: int
    n_tokens_decoded: int
    n_tokens_sampled: int
    t_schedule_us: int
    t_batch_us: int
    t_decode_us: int
    n_graphs_reused: int
    t_sample_us: int
    t_emit_us: int
    n_prompt_tokens: int
    n_generation_tokens: int
    n_prefix_cache_hit_tokens: int
    n_finished_stop: int
    n_finished_length: int
    n_draft_tokens: int
    n_draft_accepted_tokens: int
    n_cancelled: int
    n_errors: int
    n_tp_gather_full: int
    n_tp_gather_candidates: int
    n_prompt_cache_hits: int
    n_prompt_cache_misses: int
    n_prompt_cache_rejected: int
    n_prompt_cache_bytes_read: int
    n_prompt_cache_bytes_written: int
    n_prompt_cache_saves: int
    n_prompt_cache_saves_skipped: int
    n_prompt_cache_evictions: int
    n_prompt_cache_superseded: int
    n_prompt_cache_restored_tokens: int
    t_prompt_cache_restore_us: int
    n_prompt_cache_preloads: int
    n_prompt_cache_preloaded_tokens: int

# (field, Prometheus name after "stackd_", help), from native/engine/timings.h
HISTOGRAMS: list[tuple[str, str, str]]
GAUGES: list[tuple[str, str, str]]

class EngineHistograms(TypedDict):
    """Engine.metrics()["histograms"]: (bounds, counts per bucket + one above all, sum)."""
    queue_time: tuple[list[float], list[int], float]
    time_to_first_token: tuple[list[float], list[int], float]
    inter_token_latency: tuple[list[float], list[int], float]
    e2e_request_latency: tuple[list[float], list[int], float]
    request_prompt_tokens: tuple[list[float], list[int], float]
    request_generation_tokens: tuple[list[float], list[int], float]

class EngineGauges(TypedDict):
    num_requests_running: float
    num_requests_waiting: float
    kv_cache_usage_ratio: float
    slots_busy: float

class EngineMetrics(TypedDict):
    histograms: EngineHistograms
    gauges: EngineGauges

class Timings:
    """A finished request's durations on the engine's steady clock (microseconds)."""
    t_queue_us: int              # submitted -> slot
    t_prompt_us: int             # slot -> first token
    t_first_token_us: int        # submitted -> first token
    t_predicted_us: int          # first token -> last token
    n_drafted: int               # drafted tokens verified (speculative decoding)
    n_draft_accepted: int        # of them, accepted
    def __init__(self, *, t_queue_us: int, t_prompt_us: int, t_first_token_us: int,
                 t_predicted_us: int, n_drafted: int = 0, n_draft_accepted: int = 0) -> None: ...

# A logprobs entry: (token, logprob, piece, [(token, logprob, piece) of the top alternatives])
LogprobEntry = tuple[int, float, bytes, list[tuple[int, float, bytes]]]

class Event:
    """What the engine reports about one request after a step (read-only)."""
    id_request: int
    text: bytes                        # UTF-8 released by this event
    n_tokens: int                      # tokens generated in this event
    status: int                        # STATUS_*; anything but STATUS_RUNNING finishes
    n_prompt: int
    n_cached: int                      # prompt tokens reused from the KV cache
    n_generated: int
    logprobs: list[LogprobEntry] | None
    prompt_logprobs: list[LogprobEntry] | None   # the first sample's event, when asked: prompt tokens 2..
    embedding: np.ndarray | None       # embedding requests: n_inputs * n_embd floats
    error: str | None
    timings: Timings | None            # the finishing event only
    stop: str | None                   # the finishing event: the stop string that ended the text
    def __init__(self, *, id_request: int, status: int = ..., text: bytes = b"", n_tokens: int = 0,
                 n_prompt: int = 0, n_cached: int = 0, n_generated: int = 0, error: str = "",
                 logprobs: list[LogprobEntry] | None = None, embedding: np.ndarray | None = None,
                 timings: Timings | None = None, stop: str = "",
                 prompt_logprobs: list[LogprobEntry] | None = None) -> None: ...

class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int
    presence_penalty: float
    frequency_penalty: float
    repeat_penalty: float
    penalty_last_n: int
    logit_bias: list[tuple[int, float]]
    grammar: str
    grammar_lazy: bool
    grammar_triggers: list[str]
    grammar_prefill: list[int]
    reasoning_budget: int
    reasoning_start: str
    reasoning_end: str
    reasoning_forced: list[int]
    reasoning_open: bool
    logprobs: bool
    n_top_logprobs: int
    prompt_logprobs: bool        # every prompt token's log-probability too (echo)
    min_tokens: int
    ignore_eos: bool
    speculative: bool            # false: this request is never drafted for
    def __init__(self) -> None: ...

class TraceRecords:                       # a stopped recording
    def __len__(self) -> int: ...
    def take(self, n: int) -> list[dict[str, Any]]: ...   # the next n records (fewer at the end)

class _ModelFacts:                        # stub only: what Engine and Vocab both answer
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]: ...
    def piece(self, token: int, special: bool = False) -> bytes: ...   # special: a control token's text too
    def meta(self, key: str) -> str: ...
    chat_template: str
    description: str
    n_ctx_train: int
    n_embd: int
    n_vocab: int

class Engine(_ModelFacts):
    def __init__(self, model_path: str, embeddings: bool = False, slots: int = 4,
                 context_length: int = 2048, batch: int = 512, threads: int = 0,
                 max_queue: int = 256, flash_attn: int = -1, key_share: float = 1.0,
                 quiet: bool = True, rpc_endpoints: list[str] = ..., split_mode: int = ...,
                 tensor_split: list[float] = ..., n_gpu_layers: int = 0, n_ubatch: int = 0,
                 n_lanes: int = 1, speculative_draft_max: int = 8,
                 speculative_step_tokens: int = 16, kv_type: int = 1, tp_rank: int = -1, tp_size: int = 0,
                 tp_transport: str = "", prompt_cache_dir: str = "", prompt_cache_root: str = "",
                 prompt_cache_key: str = "", prompt_cache_min_tokens: int = 512, prompt_cache_bytes: int = 0,
                 prompt_cache_disk_reserve: int = 0) -> None: ...   # n_lanes: contexts stepping in turn (engine.h)
    # prompt_cache_*: the prompt cache on disk (native/engine/prompt_cache.h), off without a dir
    # or a budget (bytes); prompt_cache_flush() returns once its queued files are written
    def prompt_cache_flush(self) -> None: ...
    # tp_rank/tp_size: tensor parallelism (native/engine/lockstep.h), -1 off; one lane, no embeddings;
    # tp_transport: "" the kernels' library, "memory:<name>" an in-process channel (tests)
    # kv_type: the KV cache's ggml_type (1 F16, 8 Q8_0); Q8_0 turns flash attention on
    def submit(self, id: int, prompt: list[int], max_tokens: int, stop: list[str],
               sampling: SamplingParams, owner: int = 0) -> int: ...   # a SUBMIT_* code
    # a request's choices, every one or none, each (id, prompt, max_tokens, sampling): a SUBMIT_*
    # code (the first refused one's), ValueError on a bad grammar (native/engine/engine.h)
    def submit_all(self, jobs: list[tuple[int, list[int], int, SamplingParams]], stop: list[str],
                   owner: int = 0) -> int: ...
    def submit_embedding(self, id: int, inputs: list[list[int]], owner: int = 0) -> int: ...
    def fail_next_decodes(self, n: int) -> None: ...   # testing: the next n decodes fail
    def set_tp_full_rows(self, on: bool) -> None: ...   # testing: a split's rows gathered whole
    def set_compute_scale(self, scale: float) -> None: ...   # power budget: threads and slots
    def cancel(self, id: int) -> None: ...
    def take_events(self) -> list[Event]: ...
    # an engine worker's socket to the daemon (native/engine/frame_sink.h): the engine thread
    # sends most steps' events itself; relay_events sends the rest (-> does any end a request);
    # send_frame / flush_sink -> whether bytes still wait for the socket to be writable
    def attach_sink(self, fd: int) -> None: ...
    def relay_events(self) -> bool: ...
    def send_frame(self, data: bytes) -> bool: ...
    def flush_sink(self) -> bool: ...
    def sink_pending(self) -> bool: ...
    def sink_broken(self) -> bool: ...
    def fileno(self) -> int: ...
    # a tensor-parallel follower: mirrors its leader until "stop", "closed", "lost: ..." or "error: ..."
    def follow(self) -> str: ...
    tensor_lost: str                   # the leader's group was lost: why (every request then fails), else ""
    def close(self) -> None: ...
    def stats(self) -> EngineStats: ...
    def metrics(self) -> EngineMetrics: ...
    def trace_start(self) -> bool: ...            # False: a recording already runs
    def trace_stop(self) -> TraceRecords: ...
    n_params: int
    model_size: int
    token_bos: int
    token_eos: int
    n_slots: int
    n_ctx_seq: int
    n_lanes: int   # as resolved: 1 for an embedding model, never more than n_slots

# The lockstep's control message (tests): a dict of kind, index, prev_rc, ops [(op, seq, seq_dst, p0, p1,
# delta)], tokens, pos, seq, logits; decode checks it against a follower's context (ValueError: why)
def lockstep_encode(message: dict[str, Any]) -> bytes: ...
def lockstep_decode(data: bytes, n_batch: int, n_seq_max: int, n_vocab: int, n_ctx_seq: int) -> dict[str, Any]: ...
def lockstep_channel_send(name: str, data: bytes) -> None: ...
def lockstep_channel_close(name: str) -> None: ...

class Scheduler:
    def __init__(self, n_slots: int, n_batch: int, n_ctx_seq: int, n_max_waiting: int = 256,
                 n_max_slots_per_owner: int = 0, share_time: bool = False) -> None: ...
    def enqueue(self, id: int, prompt: list[int], max_tokens: int, owner: int = 0) -> bool: ...
    def fail(self, id: int) -> None: ...
    def set_active_slots(self, n: int) -> None: ...
    def cancel(self, id: int) -> bool: ...
    def schedule(self) -> dict[str, Any]: ...
    def apply(self, outcomes: list[tuple[int, int, int]]) -> list[int]: ...
    def charge(self, decode_us: int, sample_us: list[int]) -> None: ...
    def slot_cache(self, slot: int) -> list[int]: ...
    def request(self, id: int) -> dict[str, int] | None: ...
    def release(self, id: int) -> None: ...
    n_waiting: int
    n_running: int

class TextStream:
    def __init__(self, stops: list[str] = ...) -> None: ...
    def push(self, piece: bytes) -> bytes: ...
    def flush(self) -> bytes: ...
    stopped: bool
    matched: str | None                # the stop string that ended the text

class Vocab(_ModelFacts):
    def __init__(self, model_path: str) -> None: ...
    token_bos: int
    token_eos: int

class SamplerCounts(TypedDict):
    rejected: int
    by_logit: int
    by_rejection: int
    full: int
    checked: int

class Sampler:
    """One request's sampler on a vocabulary, outside any engine (tests and benchmarks)."""
    def __init__(self, vocab: Vocab, params: SamplingParams, full_vocabulary: bool = False) -> None: ...
    def sample(self, logits: np.ndarray, suppress_eog: bool = False, eog: list[int] = ...) -> int: ...
    def accept(self, token: int) -> None: ...
    counts: SamplerCounts
    thinking: Literal["off", "idle", "counting", "forcing", "done"]   # the thinking budget's state
    thinking_tokens: int

def encode_events_wire(events: list[Event]) -> bytes: ...
def decode_events_wire(data: bytes) -> list[Event]: ...   # ValueError: not the layout

def rpc_serve(endpoint: str, cache_dir: str, n_threads: int, device: int = 0) -> None: ...
    # serve a device (its address; 0: this CPU) to ggml RPC clients on 127.0.0.1:port; never returns
def splice(a: int, b: int) -> tuple[int, int, int]: ...
    # copy both ways between two socket fds until one side ends, off the GIL:
    # (0 if a -> b ended first else 1, bytes a -> b, bytes b -> a)
