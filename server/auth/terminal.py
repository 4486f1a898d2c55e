"""Terminal tokens, verified on the node: what the terminal endpoint (spec 4.5, reserved) will call.

A terminal token is a console-signed JWT for one device: `aud` "terminal", a `device` claim,
the user in `sub`, 5 minutes of life, a unique `jti`. The node accepts it only against the
console keys `pair` stored, only for its own device id, only once (replayed `jti`s are
remembered until they expire).
"""
from __future__ import annotations

import time

from .jwt_verify import TokenError, keys_from_jwks, verify
from .pairing import load_pairing

AUDIENCE = "terminal"


class TerminalVerifier:
    def __init__(self, pairing: dict, clock=time.time):
        self.device_id = pairing["device_id"]
        self.issuer = pairing["issuer"]
        self.keys = keys_from_jwks(pairing["jwks"])
        self.clock = clock
        self._seen: dict[str, int] = {}     # jti -> exp

    @classmethod
    def from_data_dir(cls, data_dir: str) -> "TerminalVerifier":
        pairing = load_pairing(data_dir)
        if pairing is None:
            raise TokenError("this node is not paired with a console")
        return cls(pairing)

    def verify(self, token: str | bytes) -> dict:
        """The token's claims, or TokenError saying why it is refused."""
        claims = verify(token, self.keys, audience=AUDIENCE, issuer=self.issuer)
        if claims.get("device") != self.device_id:
            raise TokenError("token is for another device")
        self._forget_expired()
        jti = claims["jti"]
        if jti in self._seen:
            raise TokenError("token was used already")
        self._seen[jti] = int(claims["exp"])
        return claims

    def _forget_expired(self) -> None:
        now = self.clock()
        for jti in [j for j, exp in self._seen.items() if exp < now - 60]:
            del self._seen[jti]
