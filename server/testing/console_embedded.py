"""The real daemon with its embedded console (`serve --console`), as a subprocess on free ports."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from .daemon import ROOT

CHAT_ONLY = ('[models]\npreload = ["smollm2-135m-instruct"]\n[engine]\nslots = 4\n'
             'context_length = 1024\n[rate_limits]\ninference = 0\n[http]\nshutdown_grace = 2.0\n')
NO_MODELS = "[models]\npreload = []\n[http]\nshutdown_grace = 2.0\n"


class EmbeddedDaemon:
    def __init__(self, data_dir: str, config: str):
        self.data_dir = data_dir
        os.makedirs(data_dir, exist_ok=True)
        with open(os.path.join(data_dir, "config.toml"), "w") as f:
            f.write(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stackd", "serve", "--console", "--data-dir", data_dir,
             "--inference-port", "0", "--cluster-port", "0", "--console-port", "0"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr), daemon=True).start()
        self.ports: dict[str, int] = {}
        deadline = time.monotonic() + 300
        for line in self.proc.stdout:
            self.stdout.append(line)
            found = re.search(r"(inference|cluster|console) listening on http://[^:]+:(\d+)", line)
            if found:
                self.ports[found.group(1)] = int(found.group(2))
            if "console" in self.ports:
                break
            assert time.monotonic() < deadline, "daemon did not start"
        else:
            raise AssertionError(f"daemon exited: {''.join(self.stdout)} {''.join(self.stderr)}")
        threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout), daemon=True).start()
        self.port = self.ports["console"]
        self.url = f"http://127.0.0.1:{self.port}"

    @staticmethod
    def _drain(stream, sink):
        for line in stream:
            sink.append(line)

    @property
    def admin_password(self) -> str:
        with open(os.path.join(self.data_dir, "console-admin.password")) as f:
            return f.read().strip()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)
