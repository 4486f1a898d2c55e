"""The power contract's sink policy, table-driven, and its parsing at every edge."""
import pytest

from stackd.cluster import power
from stackd.cluster.power import NodeBudget, PowerSettings
from stackd.http.errors import ApiError

from tests.answers import raises_http

SETTINGS = PowerSettings(idle_mw=2000, max_mw=15000, min_voltage_mv=5000, max_voltage_mv=20000)
ONE = [NodeBudget("n1", 2000, 15000)]
TWO = [NodeBudget("n1", 2000, 15000), NodeBudget("n2", 1000, 5000)]
V5 = {"type": "fixed", "voltage_mv": 5000, "max_current_ma": 3000}          # 15 W


def negotiate(caps, nodes=ONE, settings=SETTINGS):
    module, pdos = power.parse_request({"module_id": "psu", "source_capabilities": caps})
    return power.contract(module, pdos, settings, nodes, now=1000.0)


@pytest.mark.parametrize("caps, position, operating, voltage, mismatch", [
    # only 5 V: 15 W meets a 15 W demand
    ([V5], 1, 15000, 5000, False),
    # 5 V already covers it: more power elsewhere does not beat a lower voltage
    ([V5, {"type": "fixed", "voltage_mv": 20000, "max_current_ma": 5000}], 1, 15000, 5000, False),
    # 5 V is weak; 9 V and 20 V both cover the demand: the lower voltage wins
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 900},
      {"type": "fixed", "voltage_mv": 9000, "max_current_ma": 3000},
      {"type": "fixed", "voltage_mv": 20000, "max_current_ma": 5000}], 2, 15000, 9000, False),
    # a weak 5 V and a 12 V that covers: the most power up to the demand wins
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 900},
      {"type": "fixed", "voltage_mv": 12000, "max_current_ma": 1500}], 2, 15000, 12000, False),
    # 28 V is outside the accepted range, whatever it offers
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 900},
      {"type": "fixed", "voltage_mv": 28000, "max_current_ma": 5000}], 1, 4500, 5000, True),
    # PPS: the lowest voltage of the range that meets the demand (15 W at 3 A -> 5 V)
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 500},
      {"type": "pps", "min_voltage_mv": 3300, "max_voltage_mv": 21000, "max_current_ma": 3000}], 2, 15000, 5000, False),
    # PPS at 1 A: 15 V gives the demand
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 500},
      {"type": "pps", "min_voltage_mv": 3300, "max_voltage_mv": 21000, "max_current_ma": 1000}], 2, 15000, 15000, False),
    # battery: its power at the lowest acceptable voltage
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 500},
      {"type": "battery", "min_voltage_mv": 9000, "max_voltage_mv": 15000, "max_power_mw": 10000}], 2, 10000, 9000, True),
    # equal power, equal voltage: the lower position
    ([V5, dict(V5)], 1, 15000, 5000, False),
    # variable supply capped by the accepted range: 20 V x 0.5 A = 10 W
    ([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 500},
      {"type": "variable", "min_voltage_mv": 12000, "max_voltage_mv": 30000, "max_current_ma": 500}], 2, 10000, 20000, True),
])
def test_the_sink_picks_like_a_pd_sink(caps, position, operating, voltage, mismatch):
    answer = negotiate(caps)
    assert answer["result"] == "accepted"
    assert (answer["object_position"], answer["operating_power_mw"], answer["voltage_mv"],
            answer["capability_mismatch"]) == (position, operating, voltage, mismatch)


def test_nothing_reaching_the_minimum_is_rejected_and_5v_stays():
    answer = negotiate([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 100},
                        {"type": "fixed", "voltage_mv": 28000, "max_current_ma": 3000}])
    assert answer["result"] == "rejected" and answer["object_position"] == 1
    assert answer["operating_power_mw"] == 500 and answer["capability_mismatch"]
    assert answer["allocations"][0]["compute_scale"] == 0.0


def test_power_is_shared_idle_first_then_by_headroom():
    answer = negotiate([{"type": "fixed", "voltage_mv": 5000, "max_current_ma": 2000}], TWO)   # 10 W of 20 W
    assert answer["demand_mw"] == 20000 and answer["minimum_mw"] == 3000
    a, b = answer["allocations"]
    # 7 W above the idle 3 W, split 13:4 by headroom
    assert a["granted_mw"] == 2000 + 7000 * 13000 // 17000 and b["granted_mw"] == 1000 + 7000 * 4000 // 17000
    assert a["compute_scale"] == pytest.approx(b["compute_scale"], abs=1e-3)
    assert 0 < a["compute_scale"] < 1


def test_a_pps_contract_is_a_lease():
    answer = negotiate([V5, {"type": "pps", "min_voltage_mv": 5000, "max_voltage_mv": 11000, "max_current_ma": 3000}])
    if answer["object_position"] == 2:
        assert answer["lease_expires_at"] == 1000 + power.PPS_LEASE_SECONDS
    assert negotiate([V5])["lease_expires_at"] is None


@pytest.mark.parametrize("caps, field", [
    ([V5] * 8, "source_capabilities"),
    ([], "source_capabilities"),
    ("5V", "source_capabilities"),
    ([{"type": "fixed", "voltage_mv": 9000, "max_current_ma": 3000}], "source_capabilities[0]"),
    ([{"type": "pps", "min_voltage_mv": 5000, "max_voltage_mv": 5000, "max_current_ma": 3000}], "source_capabilities[0]"),
    ([V5, {"type": "variable", "min_voltage_mv": 12000, "max_voltage_mv": 9000, "max_current_ma": 1}],
     "source_capabilities[1].min_voltage_mv"),
    ([V5, {"type": "fixed", "voltage_mv": -9000, "max_current_ma": 1}], "source_capabilities[1].voltage_mv"),
    ([V5, {"type": "fixed", "voltage_mv": "9V", "max_current_ma": 1}], "source_capabilities[1].voltage_mv"),
    ([V5, {"type": "fixed", "voltage_mv": 9000.5, "max_current_ma": 1}], "source_capabilities[1].voltage_mv"),
    ([V5, {"type": "fixed", "voltage_mv": True, "max_current_ma": 1}], "source_capabilities[1].voltage_mv"),
    ([V5, {"type": "fixed", "voltage_mv": 9000}], "source_capabilities[1].max_current_ma"),
    ([V5, {"type": "augmented", "voltage_mv": 9000}], "source_capabilities[1].type"),
    ([V5, "pps"], "source_capabilities[1]"),
])
def test_bad_capabilities_are_400_naming_the_field(caps, field):
    with raises_http() as refused:
        negotiate(caps)
    assert refused.value.kind.status == 400 and refused.value.param == field


@pytest.mark.parametrize("module", [None, "", 5, "x" * 129])
def test_bad_module_ids(module):
    with raises_http() as refused:
        power.parse_request({"module_id": module, "source_capabilities": [V5]})
    assert refused.value.param == "module_id"


def test_the_contract_persists_and_a_lapsed_pps_lease_falls_back(tmp_path):
    scales = []
    contracts = power.PowerContracts(SETTINGS, str(tmp_path), lambda: ONE, scales.append)
    assert contracts.in_force()["result"] == "none"
    answer = contracts.negotiate({"module_id": "psu", "source_capabilities": [
        {"type": "fixed", "voltage_mv": 5000, "max_current_ma": 1000},
        {"type": "pps", "min_voltage_mv": 5000, "max_voltage_mv": 11000, "max_current_ma": 1500}]})
    assert answer["object_position"] == 2 and answer["lease_expires_at"] is not None
    assert scales[-1] == {"n1": answer["allocations"][0]["compute_scale"]}
    restarted = power.PowerContracts(SETTINGS, str(tmp_path), lambda: ONE, scales.append)
    assert restarted.in_force()["module_id"] == "psu"
    restarted._lease_expired(restarted.current["contract_id"])       # no renewal came
    fallen = restarted.in_force()
    assert fallen["object_position"] == 1 and fallen["lease_expired"] and fallen["operating_power_mw"] == 5000
