"""The link model (server/cluster/link_model.py): what a tensor split is predicted to cost per
token, which the planner's choice between a tensor and a layer split follows."""
from __future__ import annotations

import pytest

from stackd.cluster.link_model import PAYS_AT, exchange_us, pays, seconds_per_token, tensor_cost


def test_an_exchange_is_half_a_round_trip_the_bytes_and_the_ends():
    assert exchange_us(0.0, 576, fixed_us=0.0) == pytest.approx(576 * 4 * 8 / 1e3)     # 18.4 us at 1 Gbit/s
    assert exchange_us(100.0, 576, rate_gbit=1e6, fixed_us=5.0) == pytest.approx(55.0, abs=0.01)


def test_two_equal_nodes_halve_the_compute_and_pay_on_a_fast_link():
    cost = tensor_cost(4000.0, [10.0, 10.0], [10.0], n_layer=30, n_embd=576, rate_gbit=10.0)
    assert cost.compute_us == pytest.approx(2000.0)
    assert cost.exchanges == 61
    assert cost.speedup > PAYS_AT and pays(cost)


def test_a_slow_link_stops_it_paying():
    cost = tensor_cost(4000.0, [10.0, 10.0], [400.0], n_layer=30, n_embd=576)
    assert cost.speedup < 1.0 and not pays(cost)


def test_the_slowest_link_sets_the_pace_and_a_faster_follower_takes_more():
    cost = tensor_cost(4000.0, [10.0, 30.0, 10.0], [20.0, 200.0], n_layer=30, n_embd=576)
    assert cost.compute_us == pytest.approx(4000.0 / 5)
    assert cost.exchange_us == pytest.approx(exchange_us(200.0, 576))


def test_one_node_has_no_exchanges_and_never_pays():
    cost = tensor_cost(4000.0, [10.0], [], n_layer=30, n_embd=576)
    assert cost.exchanges == 0 and not pays(cost)


def test_a_token_is_estimated_from_the_parameters_and_the_compute_figure():
    assert seconds_per_token(134_000_000, 0.0) == 0.0
    assert 1 / seconds_per_token(134_515_008, 31.5) == pytest.approx(281, abs=1)   # SmolLM2 on a Zen 5 core
