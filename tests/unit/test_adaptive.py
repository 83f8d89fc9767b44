"""Unit tier: the adaptive app's weighting, without a switch."""

from __future__ import annotations

from controllers.adaptive import (
    MIN_WEIGHT,
    REWEIGHT_STEP,
    WEIGHT_SCALE,
    AdaptiveValve,
    moved,
    next_hop_weights,
    room,
    weighted_slots,
)
from emulator.model.topologies import build


def test_weights_follow_path_width_with_a_floor():
    assert next_hop_weights([1.0] * 4) == [WEIGHT_SCALE] * 4
    assert next_hop_weights([2.5, 10.0, 10.0, 5.0]) == [25, WEIGHT_SCALE, WEIGHT_SCALE, 50]
    assert next_hop_weights([0.01, 10.0]) == [MIN_WEIGHT, WEIGHT_SCALE]


def test_a_hops_room_falls_with_its_load():
    assert room(10.0, 0.0) == 10.0 > room(10.0, 0.5) > room(10.0, 1.0) == 2.0 > room(10.0, 2.0)


def _weights_by_leaf(valve, switch):
    return {leaf: weights for (_ports, leaf), weights in valve.group_weights(switch, {}, {}).items()}


def test_a_slow_link_thins_every_path_through_it_even_one_hop_past_the_choice():
    """p0l0-p0s0 at a quarter, both ways: leaf 0 sends a quarter share up it to every leaf, and every other leaf
    sends a quarter share through spine 0 towards leaf 0 only (the spine -> leaf hop it cannot see itself)."""
    fabric = build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    fabric.degrade("p0l0", "p0s0", 0.25)
    valve = AdaptiveValve(fabric)
    quarter = [WEIGHT_SCALE // 4] + [WEIGHT_SCALE] * 3  # the ports face spines 0..3 in order
    assert _weights_by_leaf(valve, "p0l0") == {"p0l1": quarter, "p0l2": quarter, "p0l3": quarter}
    assert _weights_by_leaf(valve, "p0l3") == {"p0l0": quarter, "p0l1": [WEIGHT_SCALE] * 4,
                                               "p0l2": [WEIGHT_SCALE] * 4}



def test_a_backed_up_far_hop_thins_the_paths_through_it():
    """Leaf 3 cannot see spine 0's queue towards leaf 0; the controller can: with that queue full, leaf 3 sends
    less through spine 0 towards leaf 0, and as much as ever towards leaf 1."""
    fabric = build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    valve = AdaptiveValve(fabric)
    down = str(fabric.port("p0s0", "p0l0"))
    use = {sw: valve.utilisation(sw, {down: fabric.queue_bytes} if sw == "p0s0" else {})
           for sw in fabric.switches()}
    weights = {leaf: w for (_ports, leaf), w in valve.group_weights("p0l3", use, {}).items()}
    assert weights["p0l0"][0] < WEIGHT_SCALE == weights["p0l0"][1]
    assert weights["p0l1"] == [WEIGHT_SCALE] * 4


def test_slots_are_dealt_in_proportion_and_spread_out():
    """Smooth weighted round robin: each port's count follows its weight and a port's turns are not bunched, so
    a sender stepping its entropy alternates paths."""
    assert weighted_slots((1, 2, 3, 4), [100] * 4, 16) == [1, 2, 3, 4] * 4
    slots = weighted_slots((1, 2), [100, 25], 20)
    assert slots.count(1) == 16 and slots.count(2) == 4
    assert all(slots[i:i + 2] != [2, 2] for i in range(19))


def test_only_weights_that_moved_a_step_are_re_sent():
    assert moved(None, [100, 100])
    assert not moved([100, 60], [100, 60 + REWEIGHT_STEP - 1])  # jitter: the switch keeps its cache
    assert moved([100, 60], [100, 60 + REWEIGHT_STEP])
