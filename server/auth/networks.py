"""Requests without a key from networks the operator lists (the Ollama port's `ollama.
anonymous_networks`): Ollama's clients mostly have no key field (Home Assistant's, Continue's),
so an operator may let a home or office network in without one. Such a request is one
principal, allowed inference alone, with a rate limit of its own (`ollama.anonymous_rate_limit`
per minute, shared by every such request); a request that sends a key is the key's, as on
every port; a request without one from anywhere else is a 401. Nothing is listed by default."""
from __future__ import annotations

import ipaddress

from ..http.errors import ApiError, ErrorKind
from .permissions import INFERENCE, PUBLIC
from .principal import Principal
from .ratelimit import RateLimiter

ANONYMOUS = Principal("anonymous", "anonymous-network", "anonymous (listed network)", frozenset({INFERENCE}))
GROUP = "anonymous"


def parse_networks(entries) -> list:
    """CIDR strings ("192.168.1.0/24", "::1/128", a bare address) -> networks; ValueError says which."""
    out = []
    for entry in entries:
        try:
            out.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an address or network (such as 192.168.1.0/24)") from None
    return out


def address_of(peer: str):
    """The client's address from the connection's "host:port" (IPv6 hosts have colons too)."""
    host = peer.rsplit(":", 1)[0].strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    return address.ipv4_mapped or address if address.version == 6 else address


class NetworkGuard:
    """A port's guard (`guard`: the key guard) that lets a request without credentials from
    one of `networks` in as ANONYMOUS."""

    def __init__(self, guard, networks: list, rate_limit: int, refusal_delay: float = 0.0):
        self.guard = guard
        self.versioned = guard.versioned
        self.networks = networks
        self.limiter = RateLimiter({GROUP: rate_limit}, refusal_delay=refusal_delay)

    def listed(self, peer: str) -> bool:
        address = address_of(peer)
        return address is not None and any(address in network for network in self.networks
                                           if network.version == address.version)

    def __call__(self, request, route) -> None:
        if route.permission is PUBLIC or request.headers.get(b"authorization") is not None \
                or not self.listed(request.peer):
            return self.guard(request, route)
        if route.permission not in ANONYMOUS.allowed:
            raise ApiError(ErrorKind.PERMISSION, "a request without a key may only run inference: "
                           f"'{route.permission}' takes a key that allows it")
        request.key = ANONYMOUS
        if route.group is not None:
            request.rate_headers = self.limiter.admit(ANONYMOUS.id, ANONYMOUS.name, GROUP)

    def precheck(self, headers: dict, route, session) -> None:
        """Without credentials, the peer's address decides once the request is whole (the body
        timeout bounds a slow one); with them, the key guard's early check."""
        if headers.get(b"authorization") is None:
            return
        self.guard.precheck(headers, route, session)
