"""Configuration: defaults < TOML file < environment < command-line flags.

Every setting has a dotted name (`http.max_connections`). In the TOML file it
is that key in its table; in the environment it is STACKD_ + the name in upper
case with dots as underscores (STACKD_HTTP_MAX_CONNECTIONS); on the command
line the common ones have flags (--host, --inference-port, ...). The file is
--config PATH, else $STACKD_CONFIG, else DATA_DIR/config.toml when it exists.
Per-key rate limits ([rate_limits.keys.<name>]) can only come from the file.
"""
from __future__ import annotations

import copy
import os
import tomllib
from dataclasses import dataclass

from .http.limits import Limits
from .chat.limits import InferenceLimits, ReasoningBudget
from .engine.accel import PATHS as KERNEL_PATHS
from .engine.config import KV_TYPES
from .system import durations

MAX_REPLICAS = 64                              # cluster.replicas and options.replicas at most
RATE_LIMIT_GROUPS = ("inference", "cluster")   # the [rate_limits] settings that are groups

DEFAULTS: dict = {
    "host": "127.0.0.1",
    "inference_port": 8080,
    "cluster_port": 5381,
    "data_dir": "./data",
    "log_level": "info",
    "http": {
        "max_head_bytes": Limits.max_head_bytes,
        "max_headers": Limits.max_headers,
        "max_body_bytes": Limits.max_body_bytes,
        "head_timeout": Limits.head_timeout,
        "body_timeout": Limits.body_timeout,
        "keepalive_timeout": Limits.keepalive_timeout,
        "write_timeout": Limits.write_timeout,
        "max_connections": Limits.max_connections,
        "write_high_water": Limits.write_high_water,
        "max_pipeline": Limits.max_pipeline,
        "shutdown_grace": Limits.shutdown_grace,
        "access_log": True,
    },
    "rate_limits": {
        "inference": 100,     # requests per minute per key; 0 = unlimited
        "cluster": 1000,
        "refusal_delay": 1.0, # seconds a 429 is held back (at most its Retry-After); 0: at once
    },
    "engine": {
        "slots": 16,              # sequences decoded together per chat model
        "context_length": 2048,   # tokens per sequence (prompt + completion)
        "batch": 512,             # tokens per decode step at most (prefill chunk bound)
        "threads": 0,             # 0: every core
        "max_queue": 256,         # waiting requests per model beyond which 503
        "flash_attn": "auto",     # auto, on, off
        "kv_type": "f16",         # KV cache: f16, q8_0 (about half the bytes; flash attention on)
        # KV cache memory: lazy (taken as its cells fill) or eager (all of it at load, as llama.cpp does)
        "kv_commit": "lazy",
        "kernels": "auto",        # our matmuls and decode attention (kernels/): auto (when the CPU has AVX2), off, or a path
        # prefills too on ggml's per-row arithmetic (decode steps always are): greedy answers
        # independent of what shares a step, long prompts prefilled slower (bench/README.md); needs kernels
        "batch_invariant": False,
        # draftless speculative decoding: ngram (prompt lookup, docs/engine.md) or off; drafted
        # tokens per sequence and step at most; the step's tokens drafts may fill up to
        "speculative": "ngram",
        "speculative_draft_max": 8,
        "speculative_step_tokens": 16,
        "isolation": "worker",    # worker: each model's engine in a supervised process; inline
        # workers' OpenMP threads at a barrier: passive (sleep), active (spin), inherit (the
        # daemon's environment). Spinning teams of two workers on the same cores starve each other
        # and the event loop (docs/engine.md, "Engine threads").
        "omp_wait_policy": "auto",   # auto: chat workers libgomp's default, embedding workers passive
        "embedding_nice": 5,      # embedding workers' niceness (0-19): chat streams and the loop first
        "restart_hold": 10.0,     # seconds a request waits for its model's restarting worker; 0: 503 at once
    },
    "inference": {
        "limits": InferenceLimits.defaults(),
        "reasoning_budget": ReasoningBudget.defaults(),   # thinking tokens per reasoning_effort; -1: no bound
    },
    "power": {
        "idle_mw": 2000,          # this node's draw with its engines idle
        "max_mw": 15000,          # this node's draw at full compute
        "min_voltage_mv": 5000,   # the input voltages this node accepts from a power module
        "max_voltage_mv": 20000,
    },
    "models": {
        "preload": ["smollm2-135m-instruct", "all-minilm-l6-v2"],
        "autoload": True,         # an inference request loads a stored model (making room: docs/api.md)
        "pinned": [],             # models never unloaded to make room or for being idle (and serve --model's)
        "keep_alive": "5m",       # idle time before a model is unloaded: seconds or "5m"; 0 at once; < 0 never
        "load_wait": 60.0,        # seconds a request waits for its model's load; then 503 with Retry-After
        "memory_reserve_mb": 512, # memory a load must leave free
        "memory_limit_mb": 0,     # the most memory this node offers to models; 0 = all
        "registry": "",           # base URL of the OCI model registry pulls come from
        "registries": [],         # other registries a name may carry as its host (host/ns/name:tag)
        "import_dir": "",         # files POST /v1/models/import may add; empty: DATA_DIR/import
        "registry_username": "",
        "registry_password": "",
        "max_pull_gb": 64,        # a declared blob larger than this is refused before downloading
        "disk_reserve_mb": 1024,  # disk a pull must leave free
        "pull_stall_timeout": 30.0,
        # the prompt cache on disk (DATA_DIR/models/kv): prompt prefixes' KV kept across unloads
        # and restarts (docs/engine.md, "Prompt cache"); all models' files at most (0: off), and
        # the shortest prompt saved, and how many of a model's most recently used files its
        # load restores into idle slots (0: none; at most its slots)
        "prompt_cache_mb": 1024,
        "prompt_cache_min_tokens": 512,
        "prompt_cache_preload": 2,
    },
    "debug": {
        "trace_reply_timeout": 30.0,  # seconds a worker has to answer a trace's start or stop
    },
    "cluster": {
        "role": "leader",         # leader | follower
        "leader": "",             # followers: the leader's cluster URL, e.g. http://10.0.0.1:5381
        "secret": "",             # shared by every node; or secret_file. Never logged, never answered
        "secret_file": "",
        "advertise": "",          # this node's cluster URL as the others reach it; empty: from host and port
        "rpc_port": 50052,        # first port of ggml RPC server children
        "replicas": "all",        # replicas of a model that fits one node: all (every node that can hold it) or N
    },
    "ollama": {
        "enabled": False,         # serve --ollama: Ollama's API on its own port, for the clients that speak only it
        "port": 11434,            # Ollama's own default
        "host": "",               # empty: the node's `host`
        "max_blob_mb": 512,       # POST /api/blobs/:digest at most (the body is held in memory)
        # networks whose requests need no key (an inference-only principal with its own rate
        # limit, per minute); none by default
        "anonymous_networks": [],
        "anonymous_rate_limit": 60,
    },
    "console": {
        "enabled": False,         # serve --console: the console beside the node, on one loop
        "port": 8000,
        "host": "",               # empty: the node's `host`
        "database_url": "",       # empty: SQLite at DATA_DIR/console.db
        "coordinator": "",        # cluster URL of the node whose topology /api/topology shows
        "coordinator_key_file": "",   # file holding that node's API key; empty: DATA_DIR/console-node.key
        "login_rate_limit": 10,   # login attempts per minute, per account and per client address
        "refresh_token_days": 30, # a refresh token (and its rotations) lives this long at most
        "upstream_timeout": 5.0,  # seconds for a device's answer (topology, models, health checks)
        "device_check_interval": 30.0,  # seconds between health checks of each device
        "dashboard_interval": 2.0,  # seconds between two samples of each device's /metrics
        "dashboard_samples": 450,   # per device, in memory (15 minutes at 2 s)
        "dashboard_devices": 100,   # devices sampled (the first, by creation)
        "dashboard_days": 7,        # one-minute history kept in the console's database
    },
}

ENV_PREFIX = "STACKD_"


class ConfigError(ValueError):
    pass


@dataclass
class Settings:
    values: dict
    per_key_limits: dict[str, dict[str, int]]
    source: str | None
    # The cluster secret, read from cluster.secret or cluster.secret_file and then blanked in
    # `values`, so that nothing that prints settings can print it. None: a one-node cluster.
    cluster_secret: bytes | None = None

    def __getitem__(self, dotted: str):
        node = self.values
        for part in dotted.split("."):
            node = node[part]
        return node

    @property
    def data_dir(self) -> str:
        return self.values["data_dir"]

    def limits(self) -> Limits:
        http = self.values["http"]
        return Limits(**{k: v for k, v in http.items() if k in Limits.__dataclass_fields__})


def _flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _coerce(name: str, value, default, from_text: bool = False):
    """Check `value` against the type of the setting's default; text from the environment
    is parsed, values from the TOML file must already have the right type."""
    kind = type(default)
    if name in DURATION_SETTINGS and isinstance(value, (int, float)) and not isinstance(value, bool):
        return value                      # a number of seconds, beside "5m" (checked in _check)
    if kind is list:
        if from_text and isinstance(value, str):
            return [item.strip() for item in value.split(",") if item.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"setting {name}: expected a list of strings")
        return value
    if from_text and isinstance(value, str) and kind is not str:
        text = value.strip()
        try:
            if kind is bool:
                if text.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(text)
                return text.lower() in ("1", "true", "yes", "on")
            return kind(text)
        except ValueError:
            raise ConfigError(f"setting {name}: {value!r} is not a valid {kind.__name__}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not kind:
        raise ConfigError(f"setting {name}: expected {kind.__name__}, got {type(value).__name__}")
    return value


# Settings that take a duration (system/durations.py): seconds or text; _check makes them seconds.
DURATION_SETTINGS = {"models.keep_alive"}


def _set(tree: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        tree = tree[part]
    tree[leaf] = value


def _check(values: dict) -> None:
    for port in ("inference_port", "cluster_port"):
        if not 0 <= values[port] <= 65535:
            raise ConfigError(f"setting {port}: {values[port]} is not a TCP port")
    for name, value in _flatten(values["http"], "http.").items():
        if not isinstance(value, bool) and value <= 0:
            raise ConfigError(f"setting {name}: must be positive, got {value}")
    for name in RATE_LIMIT_GROUPS:
        if values["rate_limits"][name] < 0:
            raise ConfigError(f"setting rate_limits.{name}: must be 0 (unlimited) or more")
    if values["rate_limits"]["refusal_delay"] < 0:
        raise ConfigError("setting rate_limits.refusal_delay: must be 0 (answer at once) or more")
    engine = values["engine"]
    for name in ("slots", "context_length", "batch", "max_queue"):
        if engine[name] < 1:
            raise ConfigError(f"setting engine.{name}: must be positive")
    if not 1 <= engine["slots"] <= 256:
        raise ConfigError("setting engine.slots: must be from 1 to 256")
    if engine["threads"] < 0:
        raise ConfigError("setting engine.threads: must be 0 (every core) or more")
    if engine["flash_attn"] not in ("auto", "on", "off"):
        raise ConfigError("setting engine.flash_attn: must be auto, on or off")
    if engine["kv_type"] not in KV_TYPES:
        raise ConfigError("setting engine.kv_type: must be " + " or ".join(KV_TYPES))
    if engine["kv_commit"] not in ("lazy", "eager"):
        raise ConfigError("setting engine.kv_commit: must be lazy or eager")
    if engine["kernels"] not in ("auto", "off", *KERNEL_PATHS):
        raise ConfigError("setting engine.kernels: must be auto, off, or a code path to force "
                          "(" + ", ".join(KERNEL_PATHS) + ")")
    if engine["batch_invariant"] and engine["kernels"] == "off":
        raise ConfigError("setting engine.batch_invariant: needs engine.kernels = auto "
                          "(the per-row switch is on the kernels' backend)")
    if engine["speculative"] not in ("ngram", "off"):
        raise ConfigError("setting engine.speculative: must be ngram or off")
    if not 1 <= engine["speculative_draft_max"] <= 64:
        raise ConfigError("setting engine.speculative_draft_max: must be from 1 to 64")
    if not 2 <= engine["speculative_step_tokens"] <= 512:
        raise ConfigError("setting engine.speculative_step_tokens: must be from 2 to 512")
    if engine["isolation"] not in ("worker", "inline"):
        raise ConfigError("setting engine.isolation: must be worker or inline")
    if engine["omp_wait_policy"] not in ("auto", "passive", "active", "inherit"):
        raise ConfigError("setting engine.omp_wait_policy: must be auto, passive, active or inherit")
    if engine["restart_hold"] < 0:
        raise ConfigError("setting engine.restart_hold: must be 0 (503 at once) or more")
    if not 0 <= engine["embedding_nice"] <= 19:
        raise ConfigError("setting engine.embedding_nice: must be from 0 to 19")
    for name, value in values["inference"]["limits"].items():
        if value <= 0:
            raise ConfigError(f"setting inference.limits.{name}: must be positive")
    for name, value in values["inference"]["reasoning_budget"].items():
        if value < -1:
            raise ConfigError(f"setting inference.reasoning_budget.{name}: must be -1 (no bound) or more")
    power = values["power"]
    if not 0 < power["idle_mw"] <= power["max_mw"]:
        raise ConfigError("settings power.idle_mw and power.max_mw: need 0 < idle_mw <= max_mw")
    if not 0 < power["min_voltage_mv"] <= power["max_voltage_mv"]:
        raise ConfigError("settings power.min_voltage_mv and power.max_voltage_mv: need 0 < min <= max")
    try:
        values["models"]["keep_alive"] = durations.seconds(values["models"]["keep_alive"])
    except durations.DurationError as exc:
        raise ConfigError(f"setting models.keep_alive: {exc}") from None
    if values["models"]["load_wait"] < 0:
        raise ConfigError("setting models.load_wait: must be 0 (503 at once while loading) or more")
    if values["models"]["memory_limit_mb"] < 0:
        raise ConfigError("setting models.memory_limit_mb: must be 0 (all) or more")
    if values["models"]["prompt_cache_mb"] < 0:
        raise ConfigError("setting models.prompt_cache_mb: must be 0 (off) or more")
    if values["models"]["prompt_cache_min_tokens"] < 1:
        raise ConfigError("setting models.prompt_cache_min_tokens: must be positive")
    if not 0 <= values["models"]["prompt_cache_preload"] <= 64:
        raise ConfigError("setting models.prompt_cache_preload: must be 0 (none) to 64")
    for url in values["models"]["registries"]:
        if not _is_registry_url(url):
            raise ConfigError(f"setting models.registries: {url!r} is not http(s)://host[:port]")
    if values["inference"]["limits"]["key_share"] > 1:
        raise ConfigError("setting inference.limits.key_share: must be a fraction from 0 to 1")
    if values["debug"]["trace_reply_timeout"] <= 0:
        raise ConfigError("setting debug.trace_reply_timeout: must be positive")
    _check_console(values["console"])
    _check_ollama(values["ollama"])
    _check_cluster(values)


MIN_SECRET_BYTES = 16


def _check_cluster(values: dict) -> None:
    cluster = values["cluster"]
    if cluster["role"] not in ("leader", "follower"):
        raise ConfigError("setting cluster.role: must be leader or follower")
    follower = cluster["role"] == "follower"
    if follower and not cluster["leader"]:
        raise ConfigError("setting cluster.leader: a follower needs the leader's cluster URL")
    if not follower and cluster["leader"]:
        raise ConfigError("setting cluster.leader: only a follower names a leader")
    for name in ("leader", "advertise"):
        if cluster[name] and not _is_http_url(cluster[name]):
            raise ConfigError(f"setting cluster.{name}: expected http://host:port")
    if cluster["secret"] and cluster["secret_file"]:
        raise ConfigError("settings cluster.secret and cluster.secret_file: give one of them")
    if follower and not (cluster["secret"] or cluster["secret_file"]):
        raise ConfigError("setting cluster.secret (or cluster.secret_file): a follower needs the cluster secret")
    wildcard = values["host"] in ("0.0.0.0", "::", "")
    if (cluster["secret"] or cluster["secret_file"]) and wildcard and not cluster["advertise"]:
        raise ConfigError("setting cluster.advertise: required when host is a wildcard address")
    replicas = str(cluster["replicas"]).strip()
    if replicas != "all" and not (replicas.isdigit() and 1 <= int(replicas) <= MAX_REPLICAS):
        raise ConfigError(f"setting cluster.replicas: all, or a number from 1 to {MAX_REPLICAS}")
    cluster["replicas"] = replicas if replicas == "all" else int(replicas)
    if not 1 <= cluster["rpc_port"] <= 65535:
        raise ConfigError(f"setting cluster.rpc_port: {cluster['rpc_port']} is not a TCP port")


def _is_http_url(text: str) -> bool:
    from urllib.parse import urlsplit
    try:
        url = urlsplit(text)
        return url.scheme == "http" and bool(url.hostname) and url.port is not None and url.path in ("", "/")
    except ValueError:
        return False


def _is_registry_url(text: str) -> bool:
    from urllib.parse import urlsplit
    try:
        url = urlsplit(text)
        url.port                                   # raises on a bad port
    except ValueError:
        return False
    return url.scheme in ("http", "https") and bool(url.hostname) and url.path in ("", "/") \
        and not (url.query or url.fragment or url.username or url.password)


def _read_secret(cluster: dict) -> bytes | None:
    """The secret's bytes (surrounding whitespace stripped); the values' copy is blanked.
    Messages never quote it."""
    secret = cluster["secret"].strip().encode()
    if cluster["secret_file"]:
        try:
            with open(cluster["secret_file"], "rb") as f:
                mode = os.fstat(f.fileno()).st_mode & 0o777
                secret = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"setting cluster.secret_file: cannot read it: {exc.strerror}") from None
        if mode & 0o077:
            raise ConfigError(f"setting cluster.secret_file: other users may read it (mode {mode:04o}): "
                              "make it owner-only (chmod 600)")
    cluster["secret"] = ""
    if not secret:
        if cluster["secret_file"]:
            raise ConfigError("setting cluster.secret_file: the file is empty")
        return None
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(f"setting cluster.secret: at least {MIN_SECRET_BYTES} characters")
    return secret


def _check_ollama(ollama: dict) -> None:
    if not 0 <= ollama["port"] <= 65535:
        raise ConfigError(f"setting ollama.port: {ollama['port']} is not a TCP port")
    if not 1 <= ollama["max_blob_mb"] <= 1 << 20:
        raise ConfigError("setting ollama.max_blob_mb: must be from 1 to 1048576")
    if ollama["anonymous_rate_limit"] < 0:
        raise ConfigError("setting ollama.anonymous_rate_limit: must be 0 (unlimited) or more")
    from .auth.networks import parse_networks
    try:
        parse_networks(ollama["anonymous_networks"])
    except ValueError as exc:
        raise ConfigError(f"setting ollama.anonymous_networks: {exc}") from None


def _check_console(console: dict) -> None:
    if not 0 <= console["port"] <= 65535:
        raise ConfigError(f"setting console.port: {console['port']} is not a TCP port")
    if console["login_rate_limit"] < 0:
        raise ConfigError("setting console.login_rate_limit: must be 0 (unlimited) or more")
    for name in ("refresh_token_days", "upstream_timeout", "device_check_interval"):
        if console[name] <= 0:
            raise ConfigError(f"setting console.{name}: must be positive")
    from .console.limits import DASHBOARD_LIMITS
    for name, (low, high) in DASHBOARD_LIMITS.items():
        if not low <= console[name] <= high:
            raise ConfigError(f"setting console.{name}: must be between {low} and {high}")
    url = console["database_url"]
    if url and not url.startswith(("sqlite", "postgres")):
        raise ConfigError("setting console.database_url: must be a sqlite:// or postgresql:// URL")


def load(cli: dict | None = None, environ: dict | None = None) -> Settings:
    """Resolve settings. `cli` holds dotted names of flags the user actually gave."""
    cli = {k: v for k, v in (cli or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    defaults = _flatten(DEFAULTS)
    values = copy.deepcopy(DEFAULTS)

    data_dir = cli.get("data_dir") or environ.get(ENV_PREFIX + "DATA_DIR") or DEFAULTS["data_dir"]
    path = cli.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    if path is None and os.path.exists(os.path.join(data_dir, "config.toml")):
        path = os.path.join(data_dir, "config.toml")
    per_key: dict[str, dict[str, int]] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                document = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        per_key = _per_key_limits(document.get("rate_limits", {}).pop("keys", {}))
        for name, value in _flatten(document).items():
            if name not in defaults:
                raise ConfigError(f"{path}: unknown setting {name!r}")
            _set(values, name, _coerce(name, value, defaults[name]))

    for name, default in defaults.items():
        env_name = ENV_PREFIX + name.upper().replace(".", "_")
        if env_name in environ:
            _set(values, name, _coerce(env_name, environ[env_name], default, from_text=True))

    for name, value in cli.items():
        if name in defaults:
            _set(values, name, _coerce(name, value, defaults[name]))

    values["data_dir"] = os.path.abspath(values["data_dir"])
    _check(values)
    secret = _read_secret(values["cluster"])
    return Settings(values, per_key, path, cluster_secret=secret)


def _per_key_limits(raw) -> dict[str, dict[str, int]]:
    if not isinstance(raw, dict):
        raise ConfigError("rate_limits.keys must be a table of key names")
    out = {}
    for key_name, groups in raw.items():
        if not isinstance(groups, dict):
            raise ConfigError(f"rate_limits.keys.{key_name} must be a table")
        for group, limit in groups.items():
            if group not in RATE_LIMIT_GROUPS or type(limit) is not int or limit < 0:
                raise ConfigError(f"rate_limits.keys.{key_name}.{group}: expected a known group "
                                  "and a whole number of requests per minute")
        out[key_name] = dict(groups)
    return out
