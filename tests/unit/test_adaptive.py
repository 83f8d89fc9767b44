"""Unit tier: the adaptive app's weighting, without a switch."""

from __future__ import annotations

from controllers.adaptive import MIN_WEIGHT, WEIGHT_SCALE, next_hop_weights


def test_idle_next_hops_weigh_the_same_and_a_hot_one_less():
    assert next_hop_weights((5, 6, 7, 8), {}) == [WEIGHT_SCALE] * 4
    weights = next_hop_weights((5, 6, 7, 8), {5: 0.0, 6: 1.0, 7: 0.5, 8: 0.0})
    assert weights[0] == weights[3] == WEIGHT_SCALE
    assert weights[1] < weights[2] < WEIGHT_SCALE


def test_a_saturated_and_backlogged_next_hop_keeps_a_small_weight():
    [weight] = next_hop_weights((5,), {5: 1.0 + 10.0})  # full rate and a queue ten times its limit
    assert weight == MIN_WEIGHT
