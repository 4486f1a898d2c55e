"""What a daemon imports before it serves counts in its memory on a device (the engine-worker
issue caps the whole process tree at llama-server's + 50 MB). These modules are loaded by
the first request or check that needs them, not at start."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def imported_by(code: str) -> list[str]:
    """What `code`, run in a fresh interpreter, prints as JSON."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# Everything `serve` imports on its way to listening with its models loaded (server/daemon.py,
# the modules its start-up functions import, and its route modules: daemon.import_api).
STARTUP = ("stackd.daemon", "stackd.store.defaults", "stackd.runtime.registry", "stackd.store.store",
           "stackd.store.pulling", "stackd.cluster.power", "stackd.api.cluster.rpc",
           "stackd.cluster.rpc_server", "testing.loopback_peers")
LOADED_ON_DEMAND = {
    "stackd_gguf_constants": "gguf-py's constants (hundreds of enum members): the first GGUF check",
    "stackd_llama_grammar": "the JSON-schema-to-GBNF converter: the first JSON-output request",
    "email": "the email package (formatdate): the Date header is written by server/http/server.py",
    "numpy": "numpy: the first embedding vector",
    "llama_cpp": "llama-cpp-python's package (numpy and its ctypes binding)",
}


def test_a_daemon_start_leaves_the_on_demand_modules_unloaded():
    code = (f"import importlib, json, sys\nfor name in {STARTUP!r}:\n    importlib.import_module(name)\n"
            "from stackd.daemon import import_api\nimport_api()\n"     # the routes, while models load
            f"print(json.dumps(sorted(set(sys.modules) & {set(LOADED_ON_DEMAND)!r})))")
    loaded = imported_by(code)
    assert loaded == [], {name: LOADED_ON_DEMAND[name] for name in loaded}


def test_the_on_demand_modules_load_when_needed():
    code = ("import json, sys\n"
            "from stackd.chat import gbnf\n"
            "from stackd.store import defaults, gguf_check\n"
            "assert gbnf.json_gbnf() and 'root' in gbnf.json_schema_to_gbnf('{\"type\": \"integer\"}')\n"
            "assert gguf_check.check_gguf(defaults.smollm2_path()).quantization == 'Q4_1'\n"
            "print(json.dumps(sorted(n for n in sys.modules if n.startswith('stackd_'))))")
    assert imported_by(code) == ["stackd_gguf_constants", "stackd_llama_grammar"]
