"""The link model (server/cluster/link_model.py): what a tensor split is predicted to cost per
token, which the planner's choice between a tensor and a layer split follows."""
from __future__ import annotations

import pytest

from stackd.cluster.link_model import (LAYER_SERIAL_US, LOOPBACK_RATE_GBIT, ONE_MACHINE_STEP_SHARE, PAYS_AT,
                                       exchange_us, pays, seconds_per_token, tensor_cost)


def test_an_exchange_is_half_a_round_trip_the_bytes_and_the_ends():
    assert exchange_us(0.0, 576, fixed_us=0.0) == pytest.approx(576 * 8 * 8 / 1e3)     # 36.9 us at 1 Gbit/s (doubles)
    assert exchange_us(100.0, 576, rate_gbit=1e6, fixed_us=5.0) == pytest.approx(55.0, abs=0.01)


def test_two_equal_nodes_halve_the_compute_and_pay_on_a_fast_link():
    cost = tensor_cost(8000.0, [10.0, 10.0], [10.0], n_layer=30, n_embd=576, rate_gbit=10.0)
    assert cost.compute_us == pytest.approx(4000.0 + 30 * LAYER_SERIAL_US)
    assert cost.exchanges == 61
    assert cost.speedup > PAYS_AT and pays(cost)


def test_a_slow_link_stops_it_paying():
    cost = tensor_cost(4000.0, [10.0, 10.0], [400.0], n_layer=30, n_embd=576)
    assert cost.speedup < 1.0 and not pays(cost)


def test_the_slowest_link_sets_the_pace_and_a_faster_follower_takes_more():
    cost = tensor_cost(4000.0, [10.0, 30.0, 10.0], [20.0, 200.0], n_layer=30, n_embd=576)
    assert cost.compute_us == pytest.approx(4000.0 / 5 + 30 * LAYER_SERIAL_US)
    assert cost.exchange_us == pytest.approx(exchange_us(200.0, 576))


def test_what_was_measured_is_what_the_rule_says():
    """bench/cluster.py --tensor on two Zen 5 cores (loopback, a core per node, one stream):
    SmolLM2 (one node 3.3 ms a token) 0.89x: no; the 1B-class model (19.4 ms) 1.57x: yes, and
    with 200 us added to each exchange one way 1.05x: no."""
    loopback = 100.0
    assert not pays(tensor_cost(3300.0, [1, 1], [15.0], 30, 576, rate_gbit=loopback))
    assert pays(tensor_cost(19400.0, [1, 1], [15.0], 16, 2048, rate_gbit=loopback))
    assert not pays(tensor_cost(19400.0, [1, 1], [415.0], 16, 2048, rate_gbit=loopback))


def test_one_node_has_no_exchanges_and_never_pays():
    cost = tensor_cost(4000.0, [10.0], [], n_layer=30, n_embd=576)
    assert cost.exchanges == 0 and not pays(cost)


def test_a_token_is_estimated_from_the_parameters_and_the_compute_figure():
    assert seconds_per_token(134_000_000, 0.0) == 0.0
    assert 1 / seconds_per_token(134_515_008, 31.5) == pytest.approx(281, abs=1)   # SmolLM2 on a Zen 5 core


def test_nodes_on_one_machine_share_its_memory():
    # a decode step streams every weight: two nodes of one machine read the same memory, so on
    # loopback a split's compute is at least ONE_MACHINE_STEP_SHARE of one node's step; nodes
    # on machines of their own (a wire's rate) each read their own
    one_machine = tensor_cost(18000.0, [1, 1], [15.0], 16, 2048, rate_gbit=LOOPBACK_RATE_GBIT)
    assert one_machine.compute_us == pytest.approx(18000.0 * ONE_MACHINE_STEP_SHARE)
    own_machines = tensor_cost(18000.0, [1, 1], [15.0], 16, 2048, rate_gbit=10.0)
    assert own_machines.compute_us == pytest.approx(9000.0 + 16 * LAYER_SERIAL_US)
    assert own_machines.speedup > one_machine.speedup
