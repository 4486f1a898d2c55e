"""The systemd notification protocol against a fake NOTIFY_SOCKET."""
import asyncio
import os
import socket

from stackd.system.sd_notify import Notifier


def fake_systemd(tmp_path):
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    return sock, path


def test_ready_and_stopping_are_datagrams(tmp_path):
    sock, path = fake_systemd(tmp_path)
    notifier = Notifier({"NOTIFY_SOCKET": path})
    notifier.ready()
    assert sock.recv(4096).decode().split("\n")[0] == "READY=1"
    notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"


def test_abstract_socket_names(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"stackd-test-{os.getpid()}"
    sock.bind("\0" + name)
    sock.settimeout(60)
    Notifier({"NOTIFY_SOCKET": "@" + name}).notify("X=1")
    assert sock.recv(100) == b"X=1"


def test_watchdog_pings_come_from_the_loop(tmp_path):
    sock, path = fake_systemd(tmp_path)
    notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000"})   # pings every 10 ms
    assert notifier.watchdog_interval == 0.01

    async def run():
        notifier.start_watchdog(asyncio.get_running_loop())
        await asyncio.sleep(0.2)
        notifier.stop_watchdog()

    asyncio.run(run())
    pings = []
    sock.setblocking(False)
    while True:
        try:
            pings.append(sock.recv(100))
        except BlockingIOError:
            break
    assert len(pings) >= 2 and set(pings) == {b"WATCHDOG=1"}


def test_a_watchdog_meant_for_another_pid_is_ignored(tmp_path):
    _, path = fake_systemd(tmp_path)
    assert Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000", "WATCHDOG_PID": "1"}).watchdog_interval == 0


def test_without_systemd_nothing_happens():
    notifier = Notifier({})
    notifier.ready()
    notifier.stopping()


def test_a_listener_that_stops_reading_never_blocks_the_sender(tmp_path):
    _, path = fake_systemd(tmp_path)                 # bound, never read
    notifier = Notifier({"NOTIFY_SOCKET": path})
    for _ in range(5000):                            # far past the socket's queue
        notifier.notify("WATCHDOG=1")
