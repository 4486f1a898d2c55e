"""Model references and digests: what names a model in a registry ("ns/name:tag", optionally
after a registry host) and a blob in it (sha256:<64 hex>), parsed and validated before anything
is sent or named after them; and PullError, the error of every part of a pull.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


# Every pattern here is used with fullmatch: match() with "$" also accepts a trailing "\n".
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


class PullError(Exception):
    """`status` is the HTTP status the API should answer: 400 bad name or bad digest,
    404 unknown model/tag, 409 same blob being downloaded by another client, 413 too large,
    507 no disk, 502 registry misbehaved, 504 stall/timeout."""

    def __init__(self, message: str, status: int = 502):
        super().__init__(message)
        self.message = message
        self.status = status


# ---------------------------------------------------------------- references

_COMPONENT_RE = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
MAX_REFERENCE = 200


_HOST_RE = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*"
                      r"(?::[0-9]{1,5})?")


def _host_ok(host: str) -> bool:
    if not isinstance(host, str) or len(host) > 253 or not _HOST_RE.fullmatch(host):
        return False
    _, _, port = host.partition(":")
    return not port or 1 <= int(port) <= 65535


def looks_like_host(part: str) -> bool:
    """Ollama's rule: a first part with a dot or a port, or `localhost`, is a registry host."""
    return "." in part or ":" in part or part == "localhost"


@dataclass(frozen=True)
class Reference:
    namespace: str = "library"
    name: str = ""
    tag: str = "latest"
    host: str = ""                 # a registry named in the reference; "" is the configured one

    def __post_init__(self) -> None:
        # constructed directly (not through parse_reference): the same rules, so that
        # path() is always safe to put in a URL
        if not (_component_ok(self.namespace) and "." not in self.namespace
                and self.namespace != "localhost" and _component_ok(self.name)
                and isinstance(self.tag, str) and _TAG_RE.fullmatch(self.tag) and ".." not in self.tag
                and (self.host == "" or _host_ok(self.host))):
            raise PullError(f"invalid model reference {self.namespace!r}/{self.name!r}:{self.tag!r}", 400)

    def path(self) -> str:
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.host + '/' if self.host else ''}{self.namespace}/{self.name}:{self.tag}"

    @property
    def scope(self) -> str:
        return f"repository:{self.path()}:pull"


def _component_ok(text: str) -> bool:
    return isinstance(text, str) and 1 <= len(text) <= 64 and ".." not in text and _COMPONENT_RE.fullmatch(text) is not None


def parse_reference(text: str) -> Reference:
    """"name", "name:tag", "ns/name:tag", each optionally after a registry host
    ("host[:port]/ns/name:tag", "host/name"); anything else is PullError(400). Whether a
    named host may be pulled from is the caller's decision (pulling.py)."""
    def bad(why: str) -> PullError:
        return PullError(f"invalid model name {text[:64]!r}: {why}", 400)

    if not isinstance(text, str) or not text:
        raise PullError("invalid model name: empty", 400)
    if len(text) > MAX_REFERENCE:
        raise bad(f"longer than {MAX_REFERENCE} characters")
    if not text.isascii() or not text.isprintable():
        raise bad("only ASCII letters, digits and . _ - / : are allowed")
    head, slash, last = text.rpartition("/")
    last, sep, tag = last.partition(":")
    if sep:
        if not _TAG_RE.fullmatch(tag) or ".." in tag:
            raise bad("the tag must be 1-128 of [A-Za-z0-9._-], not starting with . or -")
    else:
        tag = "latest"
    parts = (head.split("/") if slash else []) + [last]
    host = ""
    if len(parts) > 1 and looks_like_host(parts[0]):
        host = parts.pop(0)
        if not _host_ok(host):
            raise bad("the registry host must be a lower-case host name or address, with an optional port")
        # repository names on the wire are lower case (OCI distribution); Hugging Face's
        # repository names, written with capitals on its pages, are matched without case
        parts = [part.lower() for part in parts]
    if len(parts) > 2:
        raise bad("expected name, name:tag or namespace/name:tag, optionally after a registry host")
    for part in parts:
        if not _component_ok(part):
            raise bad("each part must be 1-64 of [a-z0-9] with single . _ - inside")
    if len(parts) == 2:
        namespace, name = parts
        if looks_like_host(namespace):
            raise bad("the registry host must come first")
    else:
        namespace, name = "library", parts[0]
    return Reference(namespace, name, tag, host)
