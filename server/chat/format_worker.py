"""The child process that runs llama.cpp's template analysis (stackd._chat.analyze).

llama.cpp's C++ jinja runtime has no bound on time, operations or memory, so it never runs in
the daemon: the daemon (formats.py) starts this process, bounds its address space here, kills it
when an analysis runs past its time, and starts another. One JSON request a line on stdin, one
JSON answer a line on stdout; bytes fields travel as base64.

    python -m stackd.chat.format_worker MEMORY_BYTES PARENT_PID
"""
from __future__ import annotations

import base64
import json
import resource
import sys

from ..system.process import die_with_parent

BYTES_FIELDS = ("prompt", "parser", "generation_prompt")


def main() -> None:
    memory, parent = int(sys.argv[1]), int(sys.argv[2])
    die_with_parent(parent)      # a daemon killed mid-analysis must not leave a looping template
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from .. import _chat

    for line in sys.stdin:
        request = json.loads(line)
        try:
            result = _chat.analyze(**request)
            for name in BYTES_FIELDS:
                result[name] = base64.b64encode(result[name]).decode()
            answer = {"ok": result}
        except MemoryError:
            answer = {"error": "it ran out of memory"}
        except Exception as exc:       # llama.cpp's words: a template or schema it cannot take
            answer = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
