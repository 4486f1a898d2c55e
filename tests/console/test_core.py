"""The shared pieces the console brought into the core: settings, the guard over any
authenticator, the Date of the overload 503, Request as a compiled type, the login throttle."""
from __future__ import annotations

import pytest

from stackd import compiled, config
from stackd.auth import levels
from stackd.auth.guard import Guard
from stackd.auth.permissions import PUBLIC
from stackd.auth.principal import Authenticator, Principal
from stackd.console.throttle import MAX_BUCKETS, LoginThrottle
from stackd.http.errors import ApiError

from tests.answers import raises_http
from stackd.http.request import Request, Session

pytestmark = pytest.mark.slow


def test_console_settings_follow_the_precedence(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("[console]\nport = 8100\nlogin_rate_limit = 5\n")
    settings = config.load({"config": str(file)}, environ={"STACKD_CONSOLE_PORT": "8200",
                                                            "STACKD_CONSOLE_ENABLED": "true"})
    assert settings["console.port"] == 8200 and settings["console.login_rate_limit"] == 5
    assert settings["console.enabled"] is True
    settings = config.load({"config": str(file), "console.port": 8300}, environ={})
    assert settings["console.port"] == 8300
    assert config.load({}, environ={})["console.enabled"] is False


@pytest.mark.parametrize("name,value,ok", [
    ("STACKD_CONSOLE_PORT", "65535", True), ("STACKD_CONSOLE_PORT", "65536", False),
    ("STACKD_CONSOLE_LOGIN_RATE_LIMIT", "0", True), ("STACKD_CONSOLE_LOGIN_RATE_LIMIT", "-1", False),
    ("STACKD_CONSOLE_UPSTREAM_TIMEOUT", "0.1", True), ("STACKD_CONSOLE_UPSTREAM_TIMEOUT", "0", False),
    ("STACKD_CONSOLE_REFRESH_TOKEN_DAYS", "0", False),
    ("STACKD_CONSOLE_DEVICE_CHECK_INTERVAL", "0", False),
    ("STACKD_CONSOLE_DATABASE_URL", "postgresql://u@h/db", True),
    ("STACKD_CONSOLE_DATABASE_URL", "mysql://u@h/db", False),
])
def test_console_settings_are_checked_at_their_edges(name, value, ok):
    if ok:
        config.load({}, environ={name: value})
    else:
        with pytest.raises(config.ConfigError, match=name.removeprefix("STACKD_").lower()
                           .replace("console_", "console.", 1)):
            config.load({}, environ={name: value})


class CountingAuthenticator(Authenticator):
    def __init__(self, principal):
        self.principal = principal
        self.generation = 0
        self.versioned = self
        self.calls = 0

    def authenticate(self, token):
        self.calls += 1
        return self.principal


class Route:
    def __init__(self, permission, group=None):
        self.permission, self.group = permission, group


def request(header: bytes | None, session: Session) -> Request:
    headers = {b"authorization": header} if header else {}
    return Request("GET", "/", "", headers, b"", b"id", True, None, {}, 0.0, "peer", session)


def test_the_guard_caches_per_connection_until_the_generation_moves():
    auth = CountingAuthenticator(Principal("user", "u1", "ann", levels.allowed(levels.VIEWER),
                                           level=levels.VIEWER))
    guard, session = Guard(auth, None), Session()
    route = Route(levels.permission(levels.VIEWER))
    for _ in range(3):
        guard(request(b"Bearer t", session), route)
    assert auth.calls == 1
    auth.generation += 1                         # a level changed somewhere
    guard(request(b"Bearer t", session), route)
    assert auth.calls == 2
    guard(request(b"Bearer other", session), route)   # another credential on the connection
    assert auth.calls == 3
    with raises_http() as refused:
        guard(request(b"Bearer t", session), Route(levels.permission(levels.OPERATOR)))
    assert refused.value.kind.status == 403
    guard(request(None, session), Route(PUBLIC))          # open routes need nothing
    with raises_http() as missing:
        guard(request(None, session), route)
    assert missing.value.kind.status == 401


def test_the_guard_re_checks_a_cached_credential_past_its_expiry():
    auth = CountingAuthenticator(Principal("user", "u1", "ann", levels.allowed(levels.USER),
                                           expires=1.0))       # long past
    guard, session = Guard(auth, None), Session()
    for _ in range(3):
        guard(request(b"Bearer t", session), Route(None))
    assert auth.calls == 3        # first time, then every time: the authenticator decides


def test_the_overload_503_carries_the_current_date(loop, monkeypatch):
    from stackd.http import server as http_server
    from stackd.http.access_log import AccessLog
    from stackd.http.limits import Limits
    from stackd.observe.metrics import Metrics

    server = http_server.HttpServer(loop, Limits(), Metrics(), AccessLog(enabled=False))
    assert server.date in server.overloaded_response
    monkeypatch.setattr(http_server, "_http_date", lambda: b"Mon, 01 Jan 2046 00:00:00 GMT")
    server.sweep()
    server._sweeper.cancel()
    assert b"date: Mon, 01 Jan 2046 00:00:00 GMT\r\n" in server.overloaded_response
    assert server.overloaded_response.startswith(b"HTTP/1.1 503")


@pytest.mark.skipif(compiled.pure_requested(), reason="the Python twin is a plain class")
def test_request_is_a_compiled_type_with_fixed_fields():
    made = request(None, Session())
    with pytest.raises(AttributeError):
        made.unexpected = 1


def test_login_throttle_forgets_refilled_buckets():
    now = [0.0]
    throttle = LoginThrottle(10, clock=lambda: now[0])
    for i in range(MAX_BUCKETS // 2 + 10):      # two buckets each: past the bound
        throttle.admit(f"user{i}", "10.0.0.1" if i < 5 else f"a{i}")
    assert len(throttle.buckets) <= MAX_BUCKETS + 2   # bounded even while none has refilled
    assert "user:user0" not in throttle.buckets       # the oldest went first
    assert f"user:user{MAX_BUCKETS // 2 + 9}" in throttle.buckets
    now[0] += 120                                # every bucket has refilled
    for i in range((MAX_BUCKETS - len(throttle.buckets)) // 2 + 2):    # up to the bound again
        throttle.admit(f"late{i}", f"b{i}")
    # the refilled ones went; the live ones stayed
    assert not [name for name in throttle.buckets if name.startswith(("user:user", "addr:a"))]
    assert "user:late0" in throttle.buckets
