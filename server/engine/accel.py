"""Our kernels (kernels/, libstackd_kernels.so), plugged into this process's ggml.

`register(mode)` adds our ACCEL backend device to ggml's registry; every model loaded after
it puts its Q4_1 matmul weights in our repacked buffer and runs those matmuls on our kernels.
Call it in the process that runs the engine, before its model loads: an engine worker
(server/engine/worker.py) does so first thing, the daemon before an inline engine
(runtime/supervisor.py). A model loaded earlier keeps ggml's own kernels. The op-level
self-check and timer are a test-only library (testing.kernels_check), not this one.

One ggml per process: our library's runpath names the directory llama-cpp-python loads
llama.cpp from, as server._engine's does, so whichever loads first, the other binds to the
same libggml.so.0 by soname and the device lands in the registry libllama reads. Loading it
does not need llama_cpp's Python package (a worker does without it).
"""
from __future__ import annotations

import ctypes
import os

LIBRARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "libstackd_kernels.so")
# The library's path numbers, in order (kernels/src/cpu_features.h Path); SIMD_BASELINES: the
# least a CPU needs for `auto` to register ours (x86: AVX2; aarch64: the dot products). A CPU
# with neither keeps ggml's kernels.
PATHS = ("scalar", "avx2", "avx512-vnni", "neon-dotprod", "neon-i8mm")
SIMD_BASELINES = ("avx2", "neon-dotprod")
# The weight types the kernels repack, by ggml's type numbers (ggml.h's enum ggml_type).
TYPES = {"q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14}
# The steps on ggml's per-row paths (stackd_kernels_batch_invariant): decode and verification
# steps, or every step (engine.batch_invariant).
NO_STEPS, DECODE_STEPS, ALL_STEPS = 0, 1, 2

_lib: ctypes.CDLL | None = None
_registered: str | None = None


def library() -> ctypes.CDLL:
    """The loaded library, with its C signatures declared."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(LIBRARY)
        lib.stackd_kernels_register.argtypes = [ctypes.c_int]
        lib.stackd_kernels_cpu_supports.argtypes = [ctypes.c_int]
        lib.stackd_kernels_rpc_device.restype = ctypes.c_void_p
        lib.stackd_kernels_batch_invariant.argtypes = [ctypes.c_int]
        lib.stackd_kernels_tensors.argtypes = [ctypes.c_int]
        lib.stackd_kernels_tensors.restype = ctypes.c_int64
        lib.stackd_kernels_attention.argtypes = [ctypes.c_int]
        lib.stackd_kernels_prefill_attention.argtypes = [ctypes.c_int]
        lib.stackd_kernels_chunked.argtypes = [ctypes.c_int]
        lib.stackd_kernels_runs.argtypes = [ctypes.c_int64, ctypes.c_int64]
        lib.stackd_kernels_commit_on_write.restype = None
        lib.stackd_kernels_profile.argtypes = [ctypes.c_int]
        lib.stackd_kernels_fusion.argtypes = [ctypes.c_int]
        lib.stackd_kernels_fused_nodes.restype = ctypes.c_uint64
        lib.stackd_kernels_profile_read.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
        _lib = lib
    return _lib


def cpu_supports(path: str) -> bool:
    return bool(library().stackd_kernels_cpu_supports(PATHS.index(path)))


def register(mode: str = "auto", batch_invariant: bool = False) -> str | None:
    """Register the kernels per `mode` (engine.kernels: auto | off, or a path name to force
    one). Returns the code path in use, or None when off or the CPU has neither AVX2 nor the
    dot-product instructions (SIMD_BASELINES). Idempotent;
    once registered, a later call can change the path but not unregister. ggml's ops around
    ours run their per-row paths in decode and verification steps (kernels/src/backend.cpp,
    "One arithmetic per row"), so drafting never changes a greedy answer; `batch_invariant`
    (engine.batch_invariant) has prefills do so too, so that what shares a step never changes
    a row's numbers, at a cost in long prompts."""
    global _registered
    if mode == "off":
        return _registered
    if mode == "auto":
        if not any(cpu_supports(baseline) for baseline in SIMD_BASELINES):
            return _registered
        path = -1
    elif mode in PATHS:
        if not cpu_supports(mode):
            raise ValueError(f"engine.kernels: this CPU cannot run the {mode} path")
        path = PATHS.index(mode)
    else:
        raise ValueError(f"engine.kernels: must be auto or off, got {mode!r}")
    library().stackd_kernels_batch_invariant(ALL_STEPS if batch_invariant else DECODE_STEPS)
    chosen = library().stackd_kernels_register(path)
    if chosen < 0:                  # a ggml without OpenMP (backend.cpp): ggml's kernels only
        return _registered
    _registered = PATHS[chosen]
    return _registered


def commit_on_write(mode: str = "lazy") -> None:
    """engine.kv_commit: `lazy` has every ggml CPU buffer allocated from now on in this process
    clear to zero by giving its pages back (kernels/src/lazy_commit.h), so a KV cache takes
    memory as its cells fill instead of all of it when llama.cpp clears it at creation; `eager`
    keeps ggml's memset. Call it before the model loads, with or without our kernels; once
    installed, it stays for the life of the process."""
    if mode == "lazy":
        library().stackd_kernels_commit_on_write()


def set_attention(ours: bool) -> None:
    """Decode attention on our kernel (the default once registered) or on ggml's, from the next
    step on (kernels/README.md, "Decode attention"): bench/kernels_engine.py's A/B."""
    library().stackd_kernels_attention(int(ours))


def set_prefill_attention(ours: bool) -> None:
    """A prompt's attention on our kernel too (the decode kernel, one query row at a time; the
    default) or on ggml's tiled flash attention, from the next step on: bench/roofline.py's A/B
    (a 2,000-token prompt's first token 0.80x ggml's time, bench/README.md "Roofline")."""
    library().stackd_kernels_prefill_attention(int(ours))


def set_chunked(on: bool) -> None:
    """The chunked form for the products a tensor split cuts (kernels/README.md, "The
    arithmetic"; the default) or the plain form, from the next step on: bench/kernels_engine.py's
    A/B. Off, a tensor split's answers are no longer one node's."""
    library().stackd_kernels_chunked(int(on))


# What kernels/src/profile.h times, in its order: our nodes by kind (thread 0's share) and the
# graphs' whole compute on ggml's team.
PROFILE_PHASES = ("matmul", "lm_head", "attention", "get_rows", "exchange", "norms", "graph")


def profile(on: bool) -> None:
    """Start (clearing the totals) or stop timing where graphs' time goes on our side, in this
    process (kernels/src/profile.h): bench/roofline.py's phase table. Off by default."""
    library().stackd_kernels_profile(int(on))


def profile_read() -> dict:
    """{phase: (seconds, count)} since profile(True), and "nodes": the graphs' computing nodes
    (one barrier of ggml's each; view and fused-away nodes not counted)."""
    n = len(PROFILE_PHASES)
    ns, counts, nodes = (ctypes.c_uint64 * n)(), (ctypes.c_uint64 * n)(), ctypes.c_uint64()
    got = library().stackd_kernels_profile_read(ns, counts, ctypes.byref(nodes))
    assert got == n, f"kernels/src/profile.h has {got} phases, accel.PROFILE_PHASES {n}"
    out: dict = {name: (ns[i] / 1e9, counts[i]) for i, name in enumerate(PROFILE_PHASES)}
    out["nodes"] = nodes.value
    return out


def set_fusion(on: bool) -> None:
    """Fewer nodes a graph (kernels/src/fusion.h: a residual add with the norm after it, the
    products of the same activations; the same numbers) or ggml's nodes as built, from the next
    step on: bench/roofline.py's A/B."""
    library().stackd_kernels_fusion(int(on))


def fused_nodes() -> int:
    """Nodes fused away in this process's graphs so far."""
    return library().stackd_kernels_fused_nodes()


# The runs of the chunked form (kernels/README.md, "The arithmetic") of a whole weight, from its
# K alone, as kernels/src/backend.cpp computes them (the shard planner cuts on them, in the
# daemon, which never loads the kernels): long runs widen less often (23 % of a 1B model's
# ffn_down at 16 tokens with runs of 256, 6 % with 1,024).
#   attn_output: the largest power of two dividing K (n_head x head_dim), 32 to 256
#   ffn_down:    the longest of FFN_RUNS that cuts K (the FFN's width) into FFN_RUNS_AT_LEAST or
#                more, else 256 (SmolLM2's 1,536 keeps 256, so that two nodes take 768 each)
FFN_RUNS = (1024, 512)
FFN_RUNS_AT_LEAST = 8
FFN_RUN_DEFAULT = 256


def ffn_chunk_columns(n_ff: int) -> int:
    for run in FFN_RUNS:
        if n_ff % run == 0 and n_ff // run >= FFN_RUNS_AT_LEAST:
            return run
    return FFN_RUN_DEFAULT


def attn_chunk_columns(k: int) -> int:
    return min(256, max(32, k & -k)) if k > 0 else 32


def shard_runs(q_total: int, ffn_total: int) -> tuple[int, int] | None:
    """A shard's runs from what it records of the whole model (cluster/shard.py: the attention
    output's and the FFN's widths), or None when it records neither (a whole model, whose
    weights give their own)."""
    if q_total <= 0 or ffn_total <= 0:
        return None
    return attn_chunk_columns(q_total), ffn_chunk_columns(ffn_total)


def set_runs(attn_output: int, ffn_down: int) -> None:
    """A tensor split's shard: the whole weights' runs (its own K is a slice), before its first
    decode; (0, 0) goes back to each weight's own. ValueError unless attn_output is a multiple
    of 32 and ffn_down of 256, each up to 65,536."""
    if library().stackd_kernels_runs(int(attn_output), int(ffn_down)) != 0:
        raise ValueError(f"runs of {attn_output} and {ffn_down} weights: multiples of 32 and 256 "
                         f"up to 65536 are needed")


def rpc_device() -> int:
    """The address of the ggml device an RPC server child serves so that its part of a split
    computes as this node's engine does: our MUL_MAT/GET_ROWS on weights it repacks when the
    leader uploads them, ggml-cpu for the rest (kernels/README.md, "Served over RPC"). 0 when
    the kernels are not registered in this process (then the child serves ggml's CPU)."""
    if _registered is None:
        return 0
    return library().stackd_kernels_rpc_device() or 0


def registered() -> str | None:
    """The path registered in this process, or None."""
    return _registered


def keyed(params: dict) -> dict:
    """An engine's keywords with the code path registered here added to its prompt cache's key
    (runtime/prompt_cache.py), after register(): files saved on one path are never restored on
    another, whose sums may round otherwise. The daemon builds the rest of the key without
    loading this library."""
    if params.get("prompt_cache_key"):
        params = dict(params, prompt_cache_key=f"{params['prompt_cache_key']};path={_registered or 'none'}")
    return params


def tensors() -> dict[str, int]:
    """Weights on our kernels in this process's loaded models, per type (those with none left
    out): which tensors run on which kernels. Every other weight runs on ggml's."""
    if _registered is None:
        return {}
    counts = {name: library().stackd_kernels_tensors(number) for name, number in TYPES.items()}
    return {name: n for name, n in counts.items() if n}


def report() -> dict:
    """What a loaded model's description says of the kernels: the path, and the weights on
    ours per type (tensors()); {"path": None, "tensors": {}} when they are off."""
    return {"path": _registered, "tensors": tensors()}


# ---- tensor parallelism (kernels/src/tp.h; kernels/README.md, "Tensor parallelism") ----------



class TensorParallelError(RuntimeError):
    """The tensor-parallel group could not be joined, or has failed (the library's reason)."""


def _tp_library() -> ctypes.CDLL:
    lib = library()
    if not getattr(lib, "_tp_declared", False):
        lib.stackd_tp_attach.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                         ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                         ctypes.c_int]
        lib.stackd_tp_detach.restype = None
        lib.stackd_tp_error.restype = ctypes.c_char_p
        lib.stackd_tp_send_control.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.stackd_tp_recv_control.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                               ctypes.c_int]
        lib.stackd_tp_counters.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
        lib.stackd_tp_counters.restype = None
        lib.stackd_tp_exchange_ns.restype = ctypes.c_uint64
        lib._tp_declared = True
    return lib


def tp_attach(rank: int, socks_or_fds: list, keys: list, vocab_cut: list[int], deadline_ms: int = 2000,
              spin_us: int = 50) -> None:
    """Join a tensor-parallel group as `rank` of len(socks_or_fds): entry i is the connected,
    authenticated socket (or its fd) to node i, None at `rank` (a Mesh's links: mesh.links[i].sock);
    keys[i] its link's 32-byte session key (mesh.links[i].key). The library takes the sockets
    over: a socket object is detached here, so Python never closes them. vocab_cut: n + 1 row
    boundaries of the vocabulary projection (cluster/shard.py's vocab_cut()). deadline_ms bounds every exchange;
    spin_us is how long one tries its sockets, yielding the core between tries, before sleeping
    in poll (a wake-up costs what the exchange does: bench/README.md, "Kernels: one exchange of
    the tensor split"; the daemon's groups spin 2 ms,
    runtime/tensor_group.py). Needs register() first (the kernels
    run the exchanges inside their graphs) and must come before the graphs that exchange run.
    TensorParallelError with the library's reason when refused (the fds are closed then)."""
    n = len(socks_or_fds)
    if len(keys) != n or len(vocab_cut) != n + 1:
        raise ValueError("tp_attach: one socket and one key per node, n + 1 vocabulary boundaries")
    for i, key in enumerate(keys):
        if i != rank and (key is None or len(key) != 32):
            raise ValueError(f"tp_attach: the session key of the link to node {i} is 32 bytes")
    fds = (ctypes.c_int * n)()
    key_bytes = bytearray(32 * n)
    for i, (sock, key) in enumerate(zip(socks_or_fds, keys)):
        if i == rank:
            fds[i] = -1
            continue
        fds[i] = sock if isinstance(sock, int) else sock.detach()
        key_bytes[32 * i:32 * (i + 1)] = key
    cut = (ctypes.c_int64 * (n + 1))(*vocab_cut)
    if _tp_library().stackd_tp_attach(rank, n, fds, bytes(key_bytes), cut, int(deadline_ms), int(spin_us)) != 0:
        raise TensorParallelError(tp_error())


def tp_detach() -> None:
    """Leave the group: links closed, graphs computed on this node alone again."""
    _tp_library().stackd_tp_detach()


def tp_active() -> bool:
    return bool(_tp_library().stackd_tp_active())


def tp_failed() -> bool:
    """Whether an exchange failed (a peer lost, a bad frame, the deadline): decodes fail from then on."""
    return bool(_tp_library().stackd_tp_failed())


def tp_error() -> str:
    return (_tp_library().stackd_tp_error() or b"").decode(errors="replace")


def tp_send_control(payload: bytes) -> None:
    """Leader: `payload` to every follower (a KIND_CONTROL frame)."""
    if _tp_library().stackd_tp_send_control(payload, len(payload)) != 0:
        raise TensorParallelError(tp_error())


def tp_recv_control(timeout_ms: int = -1) -> bytes | None:
    """Follower: the leader's next control payload, or None when `timeout_ms` passes first."""
    data, size = ctypes.c_void_p(), ctypes.c_size_t()
    got = _tp_library().stackd_tp_recv_control(ctypes.byref(data), ctypes.byref(size), int(timeout_ms))
    if got == 1:
        return None
    if got != 0:
        raise TensorParallelError(tp_error())
    return ctypes.string_at(data.value, size.value) if size.value else b""


def tp_counters() -> dict[str, int]:
    """Exchanges done (partial sums and logits), bytes sent, control frames, and the microseconds
    spent in the exchanges (sending, waiting for peers, checking), since attach."""
    values = [ctypes.c_uint64() for _ in range(3)]
    lib = _tp_library()
    lib.stackd_tp_counters(*(ctypes.byref(v) for v in values))
    counters = dict(zip(("exchanges", "bytes_sent", "control_frames"), (v.value for v in values)))
    counters["exchange_us"] = lib.stackd_tp_exchange_ns() // 1000
    return counters



def tp_set_test_link(delay_us: int = 0, free_links: bool = False) -> None:
    """Tests and benches only (server/faults.py: a worker's test configuration; bench/cluster.py
    --link-delay-us, --free-links): each exchange's frames held `delay_us` (0 to 1 s) before they
    go, or `free_links`: no partial sum and no logits sent (wrong answers: the speed of a link
    that costs nothing). Set before tp_attach; kept across attaches."""
    set_link = library().stackd_tp_set_test_link
    set_link.restype = None
    set_link(int(delay_us), int(bool(free_links)))
