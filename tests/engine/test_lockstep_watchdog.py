"""The follower's frozen-leader watchdog (native/engine/lockstep.h, kLeaderSilenceMs): a leader
alive but silent (SIGSTOP, a hung process, a link that drops packets without closing) ends its
followers' follow() with "lost: ..." once it has sent nothing for the bound, and a leader that
keeps its keepalives coming never does. Real engines on the default model; the in-process channel
is the only fake (it stands for the kernels' link), and the leader's silence is a channel nobody
writes to any more. The bound is shortened per test (lockstep_set_leader_silence, taken by the
engines made while it is set); the tests assert what follow() returns, never how long it took."""
import threading
import time
import uuid

import pytest

from stackd import _engine
from stackd.engine import worker
from stackd.engine.core import STATUS_ERROR, Engine
from stackd.store import defaults

from .conftest import Driver

STEP, STOP = 1, 2
KEEPALIVE_MS = _engine.LOCKSTEP_KEEPALIVE_MS


def silent_for(ms: int) -> str:
    return f"the leader sent nothing for {ms} ms (its keepalive is every {KEEPALIVE_MS} ms)"


class Following:
    def __init__(self, follower: Engine, run=None):
        self.reason = None
        self.thread = threading.Thread(target=lambda: setattr(self, "reason", (run or Engine.follow)(follower)),
                                       daemon=True)
        self.thread.start()

    def result(self, timeout=120.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "follow() did not return"
        return self.reason


def follower(name: str, silence_ms: int) -> Engine:
    """A rank-1 engine on the in-process channel `name`, its watchdog's bound `silence_ms`."""
    previous = _engine.lockstep_set_leader_silence(silence_ms)
    try:
        return Engine(defaults.smollm2_path(), slots=2, context_length=128, batch=64, tp_rank=1, tp_size=2,
                      tp_transport=f"memory:{name}")
    finally:
        _engine.lockstep_set_leader_silence(previous)


def send(name: str, **message) -> None:
    _engine.lockstep_channel_send(name, _engine.lockstep_encode(message))


def keepalive(index: int) -> dict:
    return dict(kind=STEP, index=index)


def test_the_bound_and_its_setting():
    assert _engine.LOCKSTEP_LEADER_SILENCE_MS == 10 * KEEPALIVE_MS == 10000
    with pytest.raises(ValueError, match="silence bound of -1 ms: it is 1 ms or more"):
        _engine.lockstep_set_leader_silence(-1)
    assert _engine.lockstep_set_leader_silence(0) == _engine.LOCKSTEP_LEADER_SILENCE_MS   # unchanged by the refusal
    assert _engine.lockstep_set_leader_silence(1) == _engine.LOCKSTEP_LEADER_SILENCE_MS
    assert _engine.lockstep_set_leader_silence(0) == 1            # 0: the default again
    assert _engine.lockstep_set_leader_silence(0) == _engine.LOCKSTEP_LEADER_SILENCE_MS


@pytest.mark.parametrize("first", ["keepalive", "batch"])
def test_a_leader_silent_after_one_message_loses_its_follower(first):
    """One message (a keepalive, or a batch the follower decodes), then nothing: follow() ends
    lost with the reason, and the follower's lockstep says it lost its group."""
    name = uuid.uuid4().hex
    engine = follower(name, 300)
    try:
        if first == "batch":
            send(name, kind=STEP, index=0, tokens=[1, 2], pos=[0, 1], seq=[0, 0], logits=[0, 1])
        else:
            send(name, **keepalive(0))
        assert engine.tensor_lost == ""
        assert Following(engine).result() == "lost: " + silent_for(300)
        assert engine.tensor_lost.startswith("the tensor-parallel group was lost")
        assert engine.tensor_lost.endswith(": " + silent_for(300))
        assert engine.stats()["n_steps"] == (1 if first == "batch" else 0)
    finally:
        _engine.lockstep_channel_close(name)
        engine.close()


def test_keepalives_longer_than_the_bound_keep_the_follower():
    """Keepalives every 100 ms for three bounds of 1 s, then a batch and a stop: follow() ends
    with the stop, not lost."""
    name = uuid.uuid4().hex
    engine = follower(name, 1000)
    try:
        following = Following(engine)
        index = 0
        for _ in range(30):
            send(name, **keepalive(index))
            index += 1
            time.sleep(0.1)
        send(name, kind=STEP, index=index, tokens=[1, 2], pos=[0, 1], seq=[0, 0], logits=[0, 1])
        send(name, kind=STOP, index=index + 1)
        assert following.result() == "stop"
        assert engine.tensor_lost == ""
        assert engine.stats()["n_steps"] == 1
    finally:
        _engine.lockstep_channel_close(name)
        engine.close()


def test_the_watchdog_waits_for_the_leaders_first_message():
    """A leader still loading its shard has sent nothing yet: that is not silence. Three bounds
    without a message, then the leader's first message: the follower is still following it."""
    name = uuid.uuid4().hex
    engine = follower(name, 200)
    try:
        following = Following(engine)
        time.sleep(0.6)
        send(name, kind=STOP, index=0)
        assert following.result() == "stop"
        assert engine.tensor_lost == ""
    finally:
        _engine.lockstep_channel_close(name)
        engine.close()


def test_a_real_idle_leader_keeps_its_follower_past_the_bound():
    """A leader engine idle for twice a 2.5 s bound (its own keepalives every second), then a
    request: the follower followed it all and ends with the leader's stop."""
    name = uuid.uuid4().hex
    previous = _engine.lockstep_set_leader_silence(2500)
    try:
        params = dict(slots=2, context_length=128, batch=64, tp_size=2, tp_transport=f"memory:{name}")
        leader = Engine(defaults.smollm2_path(), tp_rank=0, **params)
        engine = Engine(defaults.smollm2_path(), tp_rank=1, **params)
    finally:
        _engine.lockstep_set_leader_silence(previous)
    following = Following(engine)
    try:
        driver = Driver(leader)
        rid = driver.submit([1, 2, 3], max_tokens=4)
        assert driver.wait([rid])[rid]["status"] != STATUS_ERROR
        time.sleep(5.0)                                     # idle: keepalives only
        rid = driver.submit([1, 2, 3, 4], max_tokens=4)
        assert driver.wait([rid])[rid]["status"] != STATUS_ERROR
    finally:
        leader.close()
    assert following.result() == "stop"
    assert engine.tensor_lost == ""
    engine.close()


def test_the_worker_exits_peer_lost_on_a_silent_leader():
    """The follower's worker (server/engine/worker.py, follow) turns the watchdog's "lost" into
    its peer-lost exit, as it does a closed link."""
    name = uuid.uuid4().hex
    engine = follower(name, 300)
    try:
        send(name, **keepalive(0))
        assert Following(engine, run=worker.follow).result() == worker.EXIT_TENSOR_PEER_LOST
    finally:
        _engine.lockstep_channel_close(name)
        engine.close()
