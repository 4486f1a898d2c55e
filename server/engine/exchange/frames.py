"""The exchange's wire: the handshake that proves the cluster secret both ways, and the frames
that carry partial sums.

Handshake, on a fresh TCP connection (node i dials each node of a lower index; the dialled node
speaks first):

    acceptor -> dialer    HELLO (8 bytes) + nonce_a (32 random bytes, fresh per connection)
    dialer   -> acceptor  u16 index_d + nonce_d (32) + HMAC(secret, DIAL | context)
    acceptor -> dialer    HMAC(secret, ACCEPT | context)
    context = mesh id + nonce_a + nonce_d + u16 index_d + u16 index_a

A dialer without the secret gets the greeting and nothing more (the acceptor closes without a
word); an acceptor without it is refused by the dialer before a frame goes out. Either proof is
worthless on another connection (another nonce) or another mesh (the mesh id: a placement's).
The link's frames are then signed with a session key, HMAC(secret, SESSION | context).

Frame, both ways (little endian):

    u32 magic  u16 kind  u16 sender  u64 step  u32 length | payload (length bytes) | tag (16 bytes)
    tag = ChaCha20-Poly1305(session key, nonce = header[4:16], associated data = header + payload,
                            nothing encrypted)  (RFC 8439; its 16-byte tag)

Poly1305 rather than HMAC-SHA256: several times faster (bench/README.md, "Measurements behind
design choices"), a cost both ends of every exchange pay (kernels/src/tp_tag.h). Its one-time key needs a nonce
that never repeats under a key: the nonce is the header's kind, sender and step; the session key
is fresh per connection and tags one group's frames, whose step counter only rises, and a node
sends one frame of a kind per step.

The receiver knows what it waits for: the peer's index, the step, the payload's length. A
header that differs in any of them (or a magic, a kind it does not know) is refused before the
payload is read, so nothing is ever allocated from a count on the wire; a tag that does not
match is refused after. Each step is sent once, so a frame replayed on its link has a step
that is no longer awaited; a frame reflected back to its sender names the wrong sender.

Kinds: partial sums (1) and logits rows (3) have a length both sides know; a control message
(2, the leader's batch and KV operations for the followers' lockstep) is the one frame whose
length the receiver learns from the header, bounded by MAX_CONTROL before anything is allocated.
One step counter numbers every frame of a placement, whatever its kind. The engine's exchange
runs in C++ inside the kernels' backend (kernels/src/tp.h), on this same wire.
"""
from __future__ import annotations

import functools
import hmac
import struct

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

HELLO = b"stkx/1\n\0"
NONCE_BYTES = 32
MAC_BYTES = 32
TAG_BYTES = 16
DIAL = b"stackd exchange dial\0"
ACCEPT = b"stackd exchange accept\0"
SESSION = b"stackd exchange session\0"
PROOF = struct.Struct("<H")                   # the dialer's index, before its nonce and MAC
PROOF_BYTES = PROOF.size + NONCE_BYTES + MAC_BYTES

MAGIC = 0x31585453                            # "STX1"
KIND_PARTIAL = 1                              # a node's partial sum, float64 (kernels/src/tp.h)
KIND_CONTROL = 2                              # the leader's lockstep message to a follower (opaque)
KIND_LOGITS = 3                               # a follower's rows of the vocabulary projection, float32
KINDS = frozenset({KIND_PARTIAL, KIND_CONTROL, KIND_LOGITS})
HEADER = struct.Struct("<IHHQI")
HEADER_BYTES = HEADER.size                    # 20
MAX_PAYLOAD = 64 << 20                        # what any one frame may carry (an 8k hidden x 2k batch)
MAX_CONTROL = 4 << 20                         # a control frame's length is not known in advance: at most this


class FrameError(ValueError):
    """A frame or handshake message is refused; the link that carried it is closed."""


def context(mesh_id: bytes, nonce_a: bytes, nonce_d: bytes, index_d: int, index_a: int) -> bytes:
    return mesh_id + nonce_a + nonce_d + struct.pack("<HH", index_d, index_a)


def mac(secret: bytes, label: bytes, ctx: bytes) -> bytes:
    return hmac.digest(secret, label + ctx, "sha256")


def session_key(secret: bytes, ctx: bytes) -> bytes:
    return mac(secret, SESSION, ctx)


@functools.lru_cache(maxsize=64)
def _aead(key: bytes) -> ChaCha20Poly1305:
    return ChaCha20Poly1305(key)


def tag(key: bytes, header, payload) -> bytes:
    header = bytes(header)
    return _aead(bytes(key)).encrypt(header[4:HEADER_BYTES - 4], b"", header + bytes(payload))


def encode(key: bytes, sender: int, step: int, payload, kind: int = KIND_PARTIAL) -> bytes:
    """One frame: header, payload, tag."""
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"a frame carries at most {MAX_PAYLOAD} bytes")
    header = HEADER.pack(MAGIC, kind, sender, step, len(payload))
    return header + bytes(payload) + tag(key, header, payload)


def check_header(header, sender: int, step: int, length: int) -> None:
    """The header is what the receiver waits for, else FrameError (before any payload is read)."""
    if len(header) < HEADER_BYTES:
        raise FrameError("a frame's header is cut short")
    magic, kind, got_sender, got_step, got_length = HEADER.unpack_from(header)
    if magic != MAGIC:
        raise FrameError("not an exchange frame (bad magic)")
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind}")
    if got_sender != sender:
        raise FrameError(f"a frame from node {got_sender} on node {sender}'s link")
    if got_length != length:
        raise FrameError(f"a frame of {got_length} bytes where {length} were awaited")
    if got_step != step:
        raise FrameError(f"a frame of step {got_step} where step {step} was awaited")


def check_tag(key: bytes, frame) -> None:
    """`frame` is header + payload + tag, whole; its tag must be the link's."""
    view = memoryview(frame)
    end = len(view) - TAG_BYTES
    if end < HEADER_BYTES:
        raise FrameError("a frame is cut short")
    if not hmac.compare_digest(tag(key, view[:HEADER_BYTES], view[HEADER_BYTES:end]), view[end:]):
        raise FrameError("a frame's signature does not match the link's key")


class FrameReader:
    """Frames from a byte stream fed in pieces, each checked against what is awaited next: from
    `sender`, steps from `step` on, one after the other, of `length` bytes each. `feed(data)`
    returns the payloads now whole (in order) or raises FrameError; after an error the reader
    is spent (its link is closed). The all-reduce reads frames in place (Mesh); this is the same
    check for a stream, what the fuzzer drives."""

    def __init__(self, key: bytes, sender: int, step: int, length: int):
        if not 0 <= length <= MAX_PAYLOAD:
            raise FrameError(f"a frame carries at most {MAX_PAYLOAD} bytes")
        self.key, self.sender, self.step, self.length = key, sender, step, length
        self.size = HEADER_BYTES + length + TAG_BYTES
        self.buffer = bytearray()
        self.failed = False

    def feed(self, data: bytes) -> list[bytes]:
        if self.failed:
            raise FrameError("the link was closed after a bad frame")
        self.buffer += data
        out = []
        try:
            while True:
                if len(self.buffer) >= HEADER_BYTES:
                    check_header(self.buffer, self.sender, self.step, self.length)
                if len(self.buffer) < self.size:
                    return out
                frame = bytes(self.buffer[:self.size])
                check_tag(self.key, frame)
                del self.buffer[:self.size]
                out.append(frame[HEADER_BYTES:HEADER_BYTES + self.length])
                self.step += 1
        except FrameError:
            self.failed = True
            self.buffer.clear()
            raise
