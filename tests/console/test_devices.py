"""Device records, pairing (with the real `python -m stackd pair`), terminal tokens end to end."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import jwt
import pytest
from sqlalchemy import select, update

from stackd.auth.jwt_verify import TokenError
from stackd.auth.keys import KeyStore
from stackd.auth.terminal import TerminalVerifier
from stackd.console.db.schema import devices, pairing_tokens

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORD_FIELDS = {"id", "name", "inference_url", "cluster_url", "status", "last_seen_at",
                 "created_by", "created_at"}


def pair(harness, token: str, data_dir: str, name: str = "paired-node"):
    return subprocess.run(
        [sys.executable, "-m", "stackd", "pair", "--console", f"http://127.0.0.1:{harness.port}",
         "--token", token, "--data-dir", data_dir, "--name", name,
         "--inference-url", harness.node_url, "--cluster-url", harness.node_url],
        cwd=ROOT, capture_output=True, text=True, timeout=120)


def pairing_token(harness, **body) -> dict:
    status, _, answer = harness.call("POST", "/api/admin/tokens", harness.admin_token(), body)
    assert status == 201, answer
    return answer


def test_device_record_never_shows_its_key_and_stores_it_sealed(shared):
    device = shared.add_device("sealed")
    assert set(device) == RECORD_FIELDS and device["created_by"] == "admin"
    status, _, listing = shared.call("GET", "/api/devices", shared.admin_token())
    [listed] = [d for d in listing["data"] if d["id"] == device["id"]]
    assert set(listed) == RECORD_FIELDS
    assert shared.node.key not in json.dumps(listing)

    async def stored():
        async with shared.console.engine.connect() as conn:
            return (await conn.execute(select(devices.c.api_key_sealed)
                                       .where(devices.c.id == device["id"]))).scalar_one()
    sealed = shared.run(stored())
    assert shared.node.key.encode() not in sealed
    assert shared.console.devices.vault.open(device["id"], sealed) == shared.node.key


def test_device_status_comes_from_its_health_check(shared):
    device = shared.add_device("checked")
    shared.run(shared.console.check_device(device["id"]))
    status, _, listing = shared.call("GET", "/api/devices", shared.admin_token())
    [listed] = [d for d in listing["data"] if d["id"] == device["id"]]
    assert listed["status"] == "online" and listed["last_seen_at"] is not None


@pytest.mark.parametrize("field,value", [
    ("name", "has space"), ("inference_url", "ftp://x"), ("cluster_url", "http://u:p@host:1"),
    ("inference_url", "http://host:1/path"), ("api_key", ""),
])
def test_device_fields_are_validated(shared, field, value):
    body = {"name": "valid-name", "inference_url": "http://10.0.0.5:8080",
            "cluster_url": "http://10.0.0.5:5381", "api_key": "sk-x", field: value}
    status, _, answer = shared.call("POST", "/api/devices", shared.admin_token(), body)
    assert status == 400 and answer["error"]["param"] == field


def test_duplicate_device_name(shared):
    shared.add_device("twin")
    status, _, answer = shared.call("POST", "/api/devices", shared.admin_token(), {
        "name": "twin", "inference_url": shared.node_url, "cluster_url": shared.node_url,
        "api_key": "k"})
    assert status == 409


def test_pair_enrols_the_node_and_the_token_is_single_use(shared, tmp_path):
    token = pairing_token(shared)
    assert token["token"].startswith("pt_") and token["expires_at"] > time.time() + 14 * 60
    node_dir = str(tmp_path / "node")
    done = pair(shared, token["token"], node_dir)
    assert done.returncode == 0, done.stderr
    stored = json.load(open(os.path.join(node_dir, "console.json")))
    assert stat.S_IMODE(os.stat(os.path.join(node_dir, "console.json")).st_mode) == 0o600
    status, _, listing = shared.call("GET", "/api/devices", shared.admin_token())
    [device] = [d for d in listing["data"] if d["name"] == "paired-node"]
    assert device["id"] == stored["device_id"] and device["created_by"] == "admin"
    # the node made a key for the console with exactly the console's permissions
    [record] = [r for r in KeyStore(node_dir).records() if r.name == "console"]
    assert record.permissions == {"inference", "cluster:read", "models:manage"}
    # a second use of the same token: 401 saying so, and nothing enrolled
    again = pair(shared, token["token"], str(tmp_path / "other"), name="second-node")
    assert again.returncode == 1 and "used already" in again.stderr
    status, _, body = shared.call("POST", "/api/devices/enroll", body={
        "token": token["token"], "name": "third-node", "inference_url": shared.node_url,
        "cluster_url": shared.node_url, "api_key": "k"})
    assert status == 401 and "used already" in body["error"]["message"]
    assert not [r for r in KeyStore(str(tmp_path / "other")).records() if r.name == "console"]


def test_an_expired_pairing_token_is_refused(shared):
    token = pairing_token(shared, ttl_seconds=60)

    async def expire():
        async with shared.console.engine.begin() as conn:
            await conn.execute(update(pairing_tokens).values(expires_at=int(time.time()) - 1)
                               .where(pairing_tokens.c.created_at >= int(time.time()) - 60))
    shared.run(expire())
    status, _, body = shared.call("POST", "/api/devices/enroll", body={
        "token": token["token"], "name": "late-node", "inference_url": shared.node_url,
        "cluster_url": shared.node_url, "api_key": "k"})
    assert status == 401 and "expired" in body["error"]["message"]


@pytest.mark.parametrize("ttl,ok", [(59, False), (60, True), (604800, True), (604801, False)])
def test_pairing_token_lifetime_bounds(shared, ttl, ok):
    status, _, body = shared.call("POST", "/api/admin/tokens", shared.admin_token(),
                                  {"ttl_seconds": ttl})
    assert status == (201 if ok else 400)
    if ok:
        assert body["expires_at"] - time.time() == pytest.approx(ttl, abs=5)


def test_unknown_pairing_token(shared):
    status, _, body = shared.call("POST", "/api/devices/enroll", body={
        "token": "pt_nope", "name": "n", "inference_url": shared.node_url,
        "cluster_url": shared.node_url, "api_key": "k"})
    assert status == 401 and body["error"]["message"] == "unknown pairing token"


def test_terminal_token_verified_on_the_node(shared, tmp_path):
    node_dir = str(tmp_path / "node")
    assert pair(shared, pairing_token(shared)["token"], node_dir, name="terminal-node").returncode == 0
    verifier = TerminalVerifier.from_data_dir(node_dir)
    shared.add_user("term-op", "operator")
    operator = shared.login("term-op", "password-123")["access_token"]
    status, _, minted = shared.call("POST", f"/api/devices/{verifier.device_id}/exec-token", operator)
    assert status == 201
    claims = verifier.verify(minted["token"])
    assert claims["aud"] == "terminal" and claims["device"] == verifier.device_id
    assert claims["exp"] - claims["iat"] == 300 and claims["exp"] == minted["expires_at"]
    with pytest.raises(TokenError, match="used already"):
        verifier.verify(minted["token"])                          # replayed jti
    other = shared.add_device("elsewhere")
    status, _, foreign = shared.call("POST", f"/api/devices/{other['id']}/exec-token", operator)
    with pytest.raises(TokenError, match="another device"):
        verifier.verify(foreign["token"])
    with pytest.raises(TokenError, match="another audience"):
        verifier.verify(operator)                                 # an access token is not one
    keys = shared.console.keys
    now = int(time.time())
    expired = jwt.encode({"iss": "stackd-console", "aud": "terminal", "sub": "u", "iat": now - 400,
                          "nbf": now - 400, "exp": now - 100, "jti": "j1",
                          "device": verifier.device_id}, keys.private[keys.current],
                         algorithm="EdDSA", headers={"kid": keys.current})
    with pytest.raises(TokenError, match="expired"):
        verifier.verify(expired)
    status, _, body = shared.call("POST", "/api/devices/dev_missing/exec-token", operator)
    assert status == 404
