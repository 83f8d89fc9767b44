"""The eBPF ECN marker's curve and entries as the user space writes them (the program itself is tested through
BPF_PROG_TEST_RUN in the integration tier)."""

from __future__ import annotations

import pytest

from emulator.model import topologies
from emulator.model.errors import UserError
from emulator.net import marking, shaping


def test_marking_rises_linearly_from_kmin_to_pmax_at_kmax_then_always():
    t = marking.Thresholds(limit=100_000, kmin=20_000, kmax=60_000, pmax=0.2)
    assert [t.probability(b) for b in (0, 19_999, 20_000, 40_000, 59_999)] == [0, 0, 0, 0.1, 0.2 * 39_999 / 40_000]
    assert t.probability(60_000) == t.probability(100_000) == 1.0


def test_equal_thresholds_are_dctcps_step():
    t = marking.Thresholds(limit=100_000, kmin=30_000, kmax=30_000, pmax=0.0)
    assert (t.probability(29_999), t.probability(30_000)) == (0.0, 1.0)


def test_the_fabrics_thresholds_are_reds():
    fabric = topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, ecn=True, queue_kb=128)
    t = marking.thresholds(fabric)
    assert (t.limit, t.kmin, t.kmax, t.pmax) == (131072, 32768, 65536, 1.0)


def test_a_port_entry_starts_empty_with_its_burst():
    t = marking.Thresholds(limit=131072, kmin=32768, kmax=65536, pmax=0.1)
    burst = shaping.burst_bytes(9000)
    _lock, pmax, level, drained, got_burst, limit, kmin, kmax, xoff, classes, _pad, *queued = marking.PORT.unpack(
        t.packed(burst, 70_000))
    assert (level, drained, got_burst, limit, kmin, kmax, xoff) == (-burst, 0, burst, 131072, 32768, 65536, 70_000)
    assert pmax == round(0.1 * marking.ALWAYS)
    assert classes == 0 and queued == [0] * marking.TCLASSES
    assert marking.PORT.unpack(t.packed(burst, classes=True))[9] == 1


def test_a_port_queueing_per_class_shares_its_drain_equally_among_the_classes_holding_packets():
    """HTB's round robin of equal quanta: each class with packets gets an equal part; one holding less than its
    part empties and the rest goes to the others; a paused class gets none; what nobody takes is left over."""
    queued = [0] * marking.TCLASSES
    queued[1], queued[3] = 10_000, 10_000
    after, left = marking.share_out(queued, paused=0, sent=6_000)
    assert (after[1], after[3], left) == (7_000, 7_000, 0)
    queued[3] = 1_000
    after, left = marking.share_out(queued, paused=0, sent=6_000)
    assert (after[1], after[3], left) == (5_000, 0, 0)  # 3000 each, then 2000 of class 3's part to class 1
    after, left = marking.share_out(queued, paused=1 << 1, sent=6_000)
    assert (after[1], after[3], left) == (10_000, 0, 5_000)  # class 1 held: the port ran dry after class 3
    assert marking.share_out(queued, paused=0, sent=100_000) == ([0] * marking.TCLASSES, 89_000)


def test_the_drain_is_exact_across_rate_changes():
    """What a port sent is folded in at each change, so the drain between any two moments is the rates' integral
    (in microseconds), also over hours at 100 Gbit/s, where rate x nanoseconds would overflow 64 bits."""
    entry = marking.gate_entry(10e6, drained=0, since=1_000_000_000)
    assert marking.drain_at(entry, 1_000_000_000 + 8_000_000) == 10_000  # 8 ms at 1.25 MB/s
    assert marking.drain_at(entry, 0) == 0  # a moment before the entry: nothing yet
    paused = marking.gate_entry(0, marking.drain_at(entry, 1_008_000_000), 1_008_000_000)
    assert marking.drain_at(paused, 5_000_000_000) == 10_000
    fast = marking.gate_entry(100e9, 0, 0)
    assert marking.drain_at(fast, 3600 * 10**9) == 12_500_000_000 * 3600


def test_thresholds_come_from_the_topology_options():
    fabric = topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, ecn=True, queue_kb=128, ecn_kmin_kb=18,
                              ecn_kmax_kb=18, ecn_pmax=0.5)
    t = marking.thresholds(fabric)
    assert (t.kmin, t.kmax, t.pmax) == (18 * 1024, 18 * 1024, 0.5)
    assert (t.probability(18 * 1024 - 1), t.probability(18 * 1024)) == (0.0, 1.0)


@pytest.mark.parametrize(("option", "field"), [({"ecn_kmin_kb": 200}, "ecn_kmin_kb"),
                                                ({"ecn_kmin_kb": 40, "ecn_kmax_kb": 20}, "ecn_kmax_kb"),
                                                ({"ecn_pmax": 1.5}, "ecn_pmax")])
def test_thresholds_outside_the_queue_are_refused_with_their_field(option, field):
    with pytest.raises(UserError) as err:
        topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, ecn=True, queue_kb=128, **option)
    assert err.value.field == field
