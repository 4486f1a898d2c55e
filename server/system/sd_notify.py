"""systemd's notification protocol, for a firmware image that starts the daemon as a service.

`Type=notify` waits for READY=1 (sent once both ports listen and the preloaded models serve);
`WatchdogSec=` restarts a daemon that stops sending WATCHDOG=1. The pings are scheduled on the
event loop itself, so a wedged loop stops them and systemd steps in. STOPPING=1 on shutdown.
The protocol is one datagram to $NOTIFY_SOCKET: no library needed. Without NOTIFY_SOCKET
(not started by systemd) every call does nothing.
"""
from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        path = environ.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) if self.address else None
        if self.sock is not None:
            self.sock.setblocking(False)   # a listener that stops reading must never stall the loop
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        self.watchdog_interval = int(usec) / 2e6 if usec.isdigit() and int(usec) > 0 and mine else 0.0
        self._timer = None

    def notify(self, state: str) -> None:
        if self.sock is None:
            return
        try:
            self.sock.sendto(state.encode(), self.address)
        except OSError:
            pass                     # systemd gone or the socket full: never the daemon's problem

    def ready(self, status: str = "serving") -> None:
        self.notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")

    def stopping(self) -> None:
        self.stop_watchdog()
        self.notify("STOPPING=1")

    def start_watchdog(self, loop) -> None:
        """Ping at half the watchdog interval, from the loop: only while it is responsive."""
        if self.sock is None or not self.watchdog_interval:
            return

        def ping():
            self.notify("WATCHDOG=1")
            self._timer = loop.call_later(self.watchdog_interval, ping)

        ping()

    def stop_watchdog(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
