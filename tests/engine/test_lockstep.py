"""Tensor parallelism's lockstep (native/engine/lockstep.h): the control message the leader sends
before each decode (round trip, every hostile variant refused with a reason, limits at the edge),
and a leader and a follower on the real default model joined by the in-process channel (the
transport is the only fake: the kernels' links are tested in tests/kernels and end to end in
tests/engine/test_tensor_e2e.py). Both hold the whole model here, so the follower's llama.cpp
checks every batch against its own KV cells: a KV operation not mirrored makes its next decode
fail where the leader's did not, which the next message's prev_rc catches."""
import random
import threading
import time
import uuid

import pytest

from stackd import _engine
from stackd.engine.core import STATUS_ERROR, STATUS_RUNNING, SUBMIT_ACCEPTED, Engine, SamplingParams
from stackd.store import defaults

from .conftest import Driver, chat_prompt

LIMITS = dict(n_batch=64, n_seq_max=4, n_vocab=1000, n_ctx_seq=256)
KV_SEQ_RM, KV_SEQ_CP, KV_SEQ_KEEP, KV_SEQ_ADD, KV_CLEAR = 1, 2, 3, 4, 5
STEP, STOP = 1, 2


def message(**fields) -> dict:
    base = dict(kind=STEP, index=7, prev_rc=0, gather=0, ops=[(KV_SEQ_RM, 2, 0, 5, -1, 0), (KV_CLEAR, 0, 0, 0, 0, 0)],
                tokens=[1, 999, 0], pos=[0, 1, 255], seq=[0, 3, 1], logits=[0, 1, 1])
    return {**base, **fields}


def decode(data: bytes, **limits):
    return _engine.lockstep_decode(data, **{**LIMITS, **limits})


def refused(data: bytes, words: str, **limits) -> None:
    with pytest.raises(ValueError, match=words):
        decode(data, **limits)


# ---- the message -----------------------------------------------------------------------------

def test_round_trip():
    sent = message(ops=[(KV_SEQ_RM, -1, 0, -1, -1, 0), (KV_SEQ_CP, 0, 3, 0, 256, 0), (KV_SEQ_KEEP, 1, 0, 0, 0, 0),
                        (KV_SEQ_ADD, 2, 0, 0, 10, -256), (KV_CLEAR, 0, 0, 0, 0, 0)], prev_rc=1, index=2**32 - 1,
                   gather=17)
    data = _engine.lockstep_encode(sent)
    assert len(data) == 32 + 5 * 24 + 3 * 13
    got = decode(data)
    assert got == {**sent, "ops": [tuple(op) for op in sent["ops"]]}
    stop = decode(_engine.lockstep_encode(dict(kind=STOP, index=3, prev_rc=-3)))
    assert (stop["kind"], stop["index"], stop["prev_rc"], stop["tokens"], stop["ops"]) == (STOP, 3, -3, [], [])
    assert stop["gather"] == 0
    assert int.from_bytes(data[4:6], "little") == 2           # the version with the gather field
    assert int.from_bytes(data[28:32], "little") == 17        # where version 1 had 0 (reserved)


def test_limits_at_the_edge():
    full = dict(tokens=[0] * 64, pos=list(range(64)), seq=[3] * 64, logits=[1] * 64)
    assert len(decode(_engine.lockstep_encode(message(**full)))["tokens"]) == 64
    refused(_engine.lockstep_encode(message(tokens=[0] * 65, pos=[0] * 65, seq=[0] * 65, logits=[0] * 65)),
            "65 tokens, over this context's 64")
    refused(_engine.lockstep_encode(message(tokens=[1000, 0, 0])), "token 1000 outside the vocabulary")
    refused(_engine.lockstep_encode(message(tokens=[-1, 0, 0])), "token -1 outside")
    refused(_engine.lockstep_encode(message(pos=[0, 256, 0])), "position 256 outside")
    refused(_engine.lockstep_encode(message(pos=[-1, 0, 0])), "position -1 outside")
    refused(_engine.lockstep_encode(message(seq=[0, 4, 0])), "sequence 4 outside the slots")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_RM, 4, 0, 0, -1, 0)])), "removal outside")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_RM, 0, 0, 257, -1, 0)])), "removal outside")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_RM, -2, 0, 0, -1, 0)])), "removal outside")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_CP, 0, 4, 0, -1, 0)])), "copy outside")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_KEEP, -1, 0, 0, 0, 0)])), "keep outside")
    refused(_engine.lockstep_encode(message(ops=[(KV_SEQ_ADD, 0, 0, 0, -1, 257)])), "shift outside")
    refused(_engine.lockstep_encode(message(ops=[(9, 0, 0, 0, 0, 0)])), "unknown KV operation 9")
    refused(_engine.lockstep_encode(dict(kind=STOP, tokens=[1], pos=[0], seq=[0], logits=[0])), "stop that carries")
    # the logits gather: 0 (rows whole) to 64 candidates a row, and only with a batch
    assert decode(_engine.lockstep_encode(message(gather=64)))["gather"] == 64
    refused(_engine.lockstep_encode(message(gather=65)), "gather of 65 candidates a row, over the 64")
    refused(_engine.lockstep_encode(message(gather=2**32 - 1)), "gather of 4294967295 candidates")
    refused(_engine.lockstep_encode(message(tokens=[], pos=[], seq=[], logits=[], gather=1)), "gather without a batch")
    refused(_engine.lockstep_encode(dict(kind=STOP, gather=1)), "gather without a batch")


def header_with(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


def test_hostile_headers():
    data = _engine.lockstep_encode(message())
    refused(b"", "0 bytes is shorter than its header")
    refused(data[:31], "31 bytes is shorter")
    refused(header_with(data, 0, b"XTLK"), "magic")
    refused(header_with(data, 4, (1).to_bytes(2, "little")), "version 1, this engine speaks 2")
    refused(header_with(data, 4, (3).to_bytes(2, "little")), "version 3")
    refused(header_with(data, 6, (3).to_bytes(2, "little")), "unknown message kind 3")
    refused(header_with(data, 16, (3).to_bytes(4, "little")), "counts make")            # n_ops
    refused(header_with(data, 16, (1 << 16 + 1).to_bytes(4, "little")), "over the 65536")
    refused(header_with(data, 20, (2).to_bytes(4, "little")), "counts make")            # n_tokens
    refused(header_with(data, 20, (2**32 - 1).to_bytes(4, "little")), "over this context's")
    refused(header_with(data, 24, (2).to_bytes(4, "little")), "one sequence per token")
    refused(header_with(data, 28, (65).to_bytes(4, "little")), "over the 64")            # gather
    refused(data + b"\0", "counts make")
    refused(data[:-1], "counts make")
    flags_at = len(data) - 2
    refused(header_with(data, flags_at, b"\x02"), "output flag")


def test_fuzzed_messages_are_refused_or_within_limits():
    """Truncations, flipped bytes and random bytes: a reason, or a message whose every field fits."""
    rng = random.Random(36)
    good = _engine.lockstep_encode(message())
    cases = [good[:n] for n in range(len(good))] + [rng.randbytes(rng.randrange(0, 200)) for _ in range(300)]
    for _ in range(2000):
        mutated = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        cases.append(bytes(mutated))
    accepted = 0
    for data in cases:
        try:
            got = decode(data)
        except ValueError as exc:
            assert str(exc)
            continue
        accepted += 1
        assert len(got["tokens"]) <= LIMITS["n_batch"]
        assert all(0 <= t < LIMITS["n_vocab"] for t in got["tokens"])
        assert all(0 <= p < LIMITS["n_ctx_seq"] for p in got["pos"])
        assert all(0 <= s < LIMITS["n_seq_max"] for s in got["seq"])
        assert 0 <= got["gather"] <= 64
    assert accepted > 0                       # flips of the index or prev_rc still parse


# ---- a leader and a follower over the in-process channel --------------------------------------

def pair(**kw):
    name = f"memory:{uuid.uuid4().hex}"
    params = dict(slots=4, context_length=256, batch=64, speculative_draft_max=4, **kw)
    leader = Engine(defaults.smollm2_path(), tp_rank=0, tp_size=2, tp_transport=name, **params)
    follower = Engine(defaults.smollm2_path(), tp_rank=1, tp_size=2, tp_transport=name, **params)
    return name, leader, follower


class Following:
    def __init__(self, follower: Engine):
        self.follower = follower
        self.reason = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        self.reason = self.follower.follow()

    def result(self, timeout=60.0) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "follow() did not return"
        return self.reason


@pytest.fixture(scope="module")
def single():
    engine = Engine(defaults.smollm2_path(), slots=4, context_length=256, batch=64, speculative_draft_max=4)
    yield engine
    engine.close()


def run_all(engine, prompts, **sampling):
    driver = Driver(engine)
    ids = [driver.submit(p, max_tokens=40, **sampling) for p in prompts]
    results = driver.wait(ids)
    return [results[i] for i in ids]


def test_follower_mirrors_every_step(single):
    """Four requests at once (a batch of 4 slots), a draft-heavy prompt, a prompt repeated (its
    cached prefix kept: a partial removal), prompt log-probabilities (the prefix decoded again),
    logprobs, then the leader's close: the follower followed every decode without a mismatch."""
    name, leader, follower = pair()
    following = Following(follower)
    prompts = [chat_prompt(leader, text) for text in
               ("Repeat exactly: the cat sat on the mat, the cat sat on the mat.", "Name three colors.",
                "What is 17 times 23?", "Write a haiku about the sea.")]
    try:
        got = run_all(leader, prompts)
        again = run_all(leader, prompts[:2], logprobs=True, n_top_logprobs=2)
        rows = run_all(leader, prompts[1:2], prompt_logprobs=True)
        want = run_all(single, prompts)
        assert [r["text"] for r in got] == [r["text"] for r in want]
        assert [r["text"] for r in again] == [r["text"] for r in want[:2]]
        assert all(r["status"] != STATUS_ERROR for r in got + again + rows)
        assert rows[0]["events"][0].prompt_logprobs
        assert leader.stats()["n_draft_tokens"] > 0      # drafts were verified and rolled back
    finally:
        leader.close()
    assert following.result() == "stop"
    led, followed = leader.stats(), follower.stats()
    # the follower also decoded the prompt_logprobs prefix again (leader: not a plan's step)
    assert followed["n_tokens_decoded"] >= led["n_tokens_decoded"] > 0
    assert followed["n_steps"] >= led["n_steps"]
    follower.close()


def test_follower_takes_no_requests_and_close_ends_follow():
    name, leader, follower = pair()
    with pytest.raises(RuntimeError, match="follower takes no requests"):
        follower.submit(1, [1, 2, 3], 4, [], SamplingParams())
    with pytest.raises(RuntimeError, match="only a tensor-parallel follower"):
        leader.follow()
    following = Following(follower)
    follower.close()
    assert following.result() == "closed"
    leader.close()


def test_parameters_refused():
    path = defaults.smollm2_path()
    with pytest.raises(ValueError, match="rank 0 of 1"):
        Engine(path, slots=2, context_length=128, tp_rank=0, tp_size=1, tp_transport="memory:x")
    with pytest.raises(ValueError, match="rank 2 of 2"):
        Engine(path, slots=2, context_length=128, tp_rank=2, tp_size=2, tp_transport="memory:x")
    with pytest.raises(ValueError, match="embedding"):
        Engine(path, embeddings=True, slots=2, context_length=128, tp_rank=0, tp_size=2, tp_transport="memory:x")
    with pytest.raises(ValueError, match="unknown tensor-parallel transport"):
        Engine(path, slots=2, context_length=128, tp_rank=0, tp_size=2, tp_transport="carrier-pigeon")
    engine = Engine(path, slots=4, context_length=128, n_lanes=2, tp_rank=0, tp_size=2,
                    tp_transport=f"memory:{uuid.uuid4().hex}")
    assert engine.n_lanes == 1                 # tensor parallelism steps one context
    engine.close()


def follow_messages(messages: list[dict]) -> str:
    """A follower fed these messages (a hostile or broken leader); its reason."""
    name = uuid.uuid4().hex
    follower = Engine(defaults.smollm2_path(), slots=4, context_length=256, batch=64, tp_rank=1, tp_size=2,
                      tp_transport=f"memory:{name}")
    for m in messages:
        _engine.lockstep_channel_send(name, m if isinstance(m, bytes) else _engine.lockstep_encode(m))
    following = Following(follower)
    try:
        return following.result()
    finally:
        _engine.lockstep_channel_close(name)
        follower.close()


def step(index, tokens, pos, seq=0, prev_rc=0, ops=()):
    return dict(kind=STEP, index=index, prev_rc=prev_rc, ops=list(ops), tokens=tokens, pos=pos,
                seq=[seq] * len(tokens), logits=[0] * (len(tokens) - 1) + [1])


def test_hostile_leader_ends_follow_with_a_reason():
    assert follow_messages([step(0, [1, 2], [0, 1]), dict(kind=STOP, index=1)]) == "stop"
    reason = follow_messages([step(0, [1, 2], [0, 1]), step(2, [3], [2])])
    assert reason == "error: control message 2 where 1 was due"
    reason = follow_messages([b"garbage"])
    assert reason.startswith("error: bad control message 0: a control message of 7 bytes")
    reason = follow_messages([step(0, [60000], [0])])            # outside SmolLM2's 49152
    assert reason == "error: bad control message 0: a token 60000 outside the vocabulary"
    reason = follow_messages([step(0, [1], [300])])              # context_length 256
    assert "position 300 outside" in reason
    # a removal the follower never saw: its cells differ, its decode fails where the leader's did not
    reason = follow_messages([step(0, [1, 2, 3], [0, 1, 2]), step(1, [4], [1]), step(2, [5], [2])])
    assert reason.startswith("error: out of step: the leader's last decode returned 0, this node's")
    # a batch whose logits come as candidates (the memory channel gathers nothing: both hold the whole model)
    assert follow_messages([{**step(0, [1, 2], [0, 1]), "gather": 64}, dict(kind=STOP, index=1)]) == "stop"
    # the same with the removal mirrored: in step
    assert follow_messages([step(0, [1, 2, 3], [0, 1, 2]), step(1, [4], [1], ops=[(KV_SEQ_RM, 0, 0, 1, -1, 0)]),
                            step(2, [5], [2]), dict(kind=STOP, index=3)]) == "stop"


def test_lost_link_ends_follow():
    name = uuid.uuid4().hex
    follower = Engine(defaults.smollm2_path(), slots=2, context_length=128, tp_rank=1, tp_size=2,
                      tp_transport=f"memory:{name}")
    following = Following(follower)
    _engine.lockstep_channel_close(name)
    assert following.result().startswith("lost: ")
    follower.close()


def test_leader_loses_its_group():
    """The link goes: the request in flight ends with the group's loss, and so does every later one, at once."""
    name = f"memory:{uuid.uuid4().hex}"
    leader = Engine(defaults.smollm2_path(), slots=2, context_length=128, batch=64, tp_rank=0, tp_size=2,
                    tp_transport=name)
    driver = Driver(leader)
    try:
        assert leader.tensor_lost == ""
        first = driver.submit(chat_prompt(leader, "Count to fifty."), max_tokens=100)
        lost_midway = []

        def cut(event):
            if event.status == STATUS_RUNNING and not lost_midway:
                lost_midway.append(event)
                _engine.lockstep_channel_close(name.split(":", 1)[1])

        result = driver.wait([first], on_event=cut)[first]
        assert lost_midway and result["status"] == STATUS_ERROR
        error = result["events"][-1].error
        assert error.startswith("the tensor-parallel group was lost")
        assert leader.tensor_lost == error
        later = driver.submit([1, 2, 3], max_tokens=4)
        again = driver.wait([later])[later]
        assert again["status"] == STATUS_ERROR and again["events"][-1].error == error
        assert again["events"][0].n_generated == 0
        assert leader.submit(99, [1, 2], 4, [], SamplingParams()) == SUBMIT_ACCEPTED   # accepted, then ended
    finally:
        leader.close()


def test_an_idle_leader_finds_its_group_lost_and_keeps_its_followers_in_step():
    """Between requests the leader sends a message without a batch every second: the follower
    stays in step across them, and a closed link is found without a request."""
    name, leader, follower = pair()
    following = Following(follower)
    driver = Driver(leader)
    rid = driver.submit([1, 2, 3], max_tokens=4)
    driver.wait([rid])
    time.sleep(2.5)                            # two keepalives at least
    rid = driver.submit([1, 2, 3, 4], max_tokens=4)
    assert driver.wait([rid])[rid]["status"] != STATUS_ERROR
    leader.close()
    assert following.result() == "stop"
    follower.close()

    name = uuid.uuid4().hex
    leader = Engine(defaults.smollm2_path(), slots=2, context_length=128, tp_rank=0, tp_size=2,
                    tp_transport=f"memory:{name}")
    try:
        _engine.lockstep_channel_close(name)
        for _ in range(100):
            if leader.tensor_lost:
                break
            time.sleep(0.1)
        assert leader.tensor_lost.startswith("the tensor-parallel group was lost")
    finally:
        leader.close()


# ---- the worker's start: the mesh listener passed after the start frame -------------------------

@pytest.mark.parametrize("glued", [True, False], ids=["read-together", "read-apart"])
def test_the_listener_comes_off_the_socket_with_the_start_frame(glued):
    """Whether the worker's first read takes the start frame and the listener's marker byte
    together (the kernel ends that read after the descriptor) or apart, the frame is whole and
    the descriptor is the listener's."""
    import socket

    from stackd.engine import worker
    from stackd.engine.wire import frame

    ours, theirs = socket.socketpair()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    tensor = {"rank": 0, "size": 2}
    try:
        ours.sendall(frame({"op": "start", "tensor": tensor}))
        if glued:
            socket.send_fds(ours, [b"L"], [listener.fileno()])
        reader, frames, fds = worker.receive_start(theirs)
        assert [m for m, _ in frames] == [{"op": "start", "tensor": tensor}]
        if not glued:
            assert fds == []
            socket.send_fds(ours, [b"L"], [listener.fileno()])
        got = worker.mesh_listener(theirs, tensor, fds)
        passed = socket.socket(fileno=got)
        assert passed.getsockname() == listener.getsockname()
        passed.close()
        ours.sendall(frame({"op": "next"}))                  # nothing of the marker is left behind
        assert [m for m, _ in reader.feed(theirs.recv(1 << 16))] == [{"op": "next"}]
    finally:
        for s in (ours, theirs, listener):
            s.close()
