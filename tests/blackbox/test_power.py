"""POST /v1/power/contract against the real daemon: negotiation, the contract in force, what
/v1/nodes shows, persistence across a restart, and refusals in the spec's shape."""
import pytest

from testing.daemon import Daemon, create_key

pytestmark = pytest.mark.slow

V5 = {"type": "fixed", "voltage_mv": 5000, "max_current_ma": 3000}
CAPS = {"module_id": "psu-1", "source_capabilities": [
    {"type": "fixed", "voltage_mv": 5000, "max_current_ma": 1000},
    {"type": "fixed", "voltage_mv": 9000, "max_current_ma": 1000}]}          # 9 W of 15 W


def test_a_contract_is_negotiated_shown_and_kept(start_daemon, tmp_path):
    node = start_daemon()
    status, _, none = node.request("GET", "/v1/power/contract", key=node.admin_key)
    assert status == 200 and none["result"] == "none"
    status, _, answer = node.request("POST", "/v1/power/contract", key=node.admin_key, body=CAPS)
    assert status == 200, answer
    assert answer["result"] == "accepted" and answer["object_position"] == 2
    assert answer["operating_power_mw"] == 9000 and answer["capability_mismatch"] is True
    [allocation] = answer["allocations"]
    assert allocation["granted_mw"] == 9000 and allocation["demand_mw"] == 15000
    assert 0 < allocation["compute_scale"] < 1
    assert node.request("GET", "/v1/power/contract", key=node.admin_key)[2]["contract_id"] == answer["contract_id"]
    [me] = node.request("GET", "/v1/nodes", key=node.admin_key)[2]["data"]
    assert me["power"] == allocation
    node.stop()
    again = start_daemon(data_dir=node.data_dir)
    kept = again.request("GET", "/v1/power/contract", key=again.admin_key)[2]
    assert kept["contract_id"] == answer["contract_id"] and kept["allocations"] == answer["allocations"]


def test_bad_capabilities_are_400_and_reading_is_not_writing(daemon):
    status, _, body = daemon.request("POST", "/v1/power/contract", key=daemon.admin_key,
                                     body={"module_id": "psu", "source_capabilities": [V5] * 8})
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert "source_capabilities" in body["error"]["message"]
    status, _, body = daemon.request("POST", "/v1/power/contract", key=daemon.admin_key, body={
        "module_id": "psu", "source_capabilities": [{"type": "fixed", "voltage_mv": 12000, "max_current_ma": 1}]})
    assert status == 400 and body["error"]["param"] == "source_capabilities[0]"
    reader = create_key(daemon.data_dir, "reader", "cluster:read")
    import time
    deadline = time.monotonic() + 60
    while daemon.request("GET", "/v1/power/contract", key=reader)[0] != 200:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert daemon.request("POST", "/v1/power/contract", key=reader, body=CAPS)[0] == 403
