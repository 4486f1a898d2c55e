"""The dialer's probe of its relay: a relay that greets is alive; one that accepts connections
(its kernel does) but never greets, as a stopped process, is a lost peer, and so is a closed
port. The probe never gets a client through to the RPC server (it serves one at a time)."""
from __future__ import annotations

import socket
import threading

import pytest

from stackd.system import relay

from .conftest import SECRET, run
from .test_relay import rpc_hello

pytestmark = pytest.mark.slow


@pytest.fixture
def silent():
    """A port whose connections are accepted by the kernel and never answered."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_relay_that_greets_is_alive_and_the_probe_leaves_its_server_free(loop, peers):
    child = run(loop, peers.start())
    assert relay.greets("127.0.0.1", child.port, relay.PROBE_TIMEOUT)
    assert relay.greets("127.0.0.1", child.port, relay.PROBE_TIMEOUT)   # the server still takes a client:
    sock = relay.dial("127.0.0.1", child.port, SECRET, child.placement_id)
    assert len(rpc_hello(sock)) > 0
    sock.close()


def test_a_silent_or_closed_port_does_not_greet(silent):
    assert not relay.greets("127.0.0.1", silent, 0.2)
    assert not relay.greets("127.0.0.1", closed_port(), 0.2)


def test_a_dialer_whose_relay_goes_silent_reports_it_lost(silent, monkeypatch):
    monkeypatch.setattr(relay, "PROBE_INTERVAL", 0.05)
    monkeypatch.setattr(relay, "PROBE_TIMEOUT", 0.2)
    lost = threading.Event()
    endpoints = []

    def on_lost(endpoint):
        endpoints.append(endpoint)
        lost.set()
    dialer = relay.Dialer("127.0.0.1", silent, SECRET, "p", on_lost=on_lost).start()
    assert lost.wait(60) and endpoints == [f"127.0.0.1:{silent}"]
    dialer.listener.close()
