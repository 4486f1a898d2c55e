"""The real daemon with its embedded console (`serve --console`), as a subprocess on free ports."""
from __future__ import annotations

import os
import signal

from .daemon import Daemon

CHAT_ONLY = ('[models]\npreload = ["smollm2-135m-instruct"]\n[engine]\nslots = 4\n'
             'context_length = 1024\n[rate_limits]\ninference = 0\n[http]\nshutdown_grace = 2.0\n')
NO_MODELS = "[models]\npreload = []\n[http]\nshutdown_grace = 2.0\n"


class EmbeddedDaemon(Daemon):
    """`port` and `url` are the console's."""

    def __init__(self, data_dir: str, config: str):
        super().__init__(data_dir, config, models=True, console=True, start_timeout=300.0)
        self.port = self.ports["console"]
        self.url = f"http://127.0.0.1:{self.port}"

    @property
    def admin_password(self) -> str:
        with open(os.path.join(self.data_dir, "console-admin.password")) as f:
            return f.read().strip()

    def stop(self, signum=signal.SIGTERM, timeout: float = 60.0) -> int:
        return super().stop(signum, timeout)
