"""Congestion control plug-ins: none holds line rate; rtt (Swift-like) moves its window with the delay; ecn
(DCQCN-like) cuts on CNPs and recovers with time. Limits hold under any sequence of events."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traffic.cc import PLUGINS, CongestionControl, Dcqcn, RttBased

LINE = 10e6
PACKET_BITS = (9000 + 14) * 8
PACKET_NS = PACKET_BITS / LINE * 1e9  # ~7.2 ms
MS = 1_000_000


def test_plugins_by_name():
    assert {name: cls.name for name, cls in PLUGINS.items()} == {"none": "none", "rtt": "rtt", "ecn": "ecn",
                                                                      "pull": "pull"}


def test_none_keeps_line_rate_and_window():
    cc = CongestionControl(LINE, PACKET_BITS, window=16)
    now = 0
    for rtt in (1 * MS, 500 * MS, 2 * MS):
        now += 10 * MS
        cc.on_ack(now, rtt, rtt, 1 * MS, 3)
        cc.on_cnp(now)
        cc.on_loss(now)
        cc.tick(now)
        assert (cc.rate_bps, cc.window) == (LINE, 16)
    assert cc.state() == {"rate_bps": LINE, "window": 16}


# -- rtt ----------------------------------------------------------------------------------------------------
MIN_RTT = 10 * MS
TARGET = MIN_RTT + 2 * PACKET_NS  # the default target: two packets of queueing above the lowest RTT


def test_rtt_decreases_window_and_rate_when_the_rtt_exceeds_the_target():
    cc = RttBased(LINE, PACKET_BITS, window=32)
    srtt = 4 * TARGET
    cc.on_ack(1000 * MS, int(srtt), srtt, MIN_RTT, 1)
    first = (cc.cwnd, cc.rate_bps)
    assert first[0] < 8 and first[1] < LINE  # starts at window / 4 and line rate
    cc.on_ack(1000 * MS + int(srtt) + 1, int(srtt), srtt, MIN_RTT, 1)
    assert cc.cwnd < first[0] and cc.rate_bps < first[1]
    assert cc.window == max(1, -(-cc.cwnd // 1))


def test_rtt_paces_its_window_over_the_latest_round_trip():
    """Swift's pacing: cwnd packets over the sample just taken, not over a smoothed RTT that lags the queue."""
    cc = RttBased(LINE, PACKET_BITS, window=32, initial_window=1)
    cc.on_ack(1000 * MS, int(3 * TARGET), TARGET, MIN_RTT, 1)
    assert cc.rate_bps == pytest.approx(cc.cwnd * PACKET_BITS / (int(3 * TARGET) / 1e9))


def test_rtt_grows_when_below_the_target():
    cc = RttBased(LINE, PACKET_BITS, window=32)
    before = cc.cwnd
    for i in range(20):
        cc.on_ack(i * MS, MIN_RTT, MIN_RTT, MIN_RTT, 1)
    assert cc.cwnd > before
    assert cc.window > 8


def test_rtt_decreases_at_most_once_per_rtt():
    cc = RttBased(LINE, PACKET_BITS, window=32)
    srtt = 3 * TARGET
    start = 1000 * MS
    cc.on_ack(start, int(srtt), srtt, MIN_RTT, 1)
    after_first = cc.cwnd
    for t in range(1, 10):
        cc.on_ack(start + int(t * srtt / 10), int(srtt), srtt, MIN_RTT, 4)
        assert cc.cwnd == after_first
    cc.on_ack(start + int(srtt) + 1, int(srtt), srtt, MIN_RTT, 1)
    assert cc.cwnd < after_first


def test_rtt_never_below_min_cwnd():
    cc = RttBased(LINE, PACKET_BITS, window=32, min_cwnd=0.25)
    srtt = 100 * TARGET
    for i in range(200):
        cc.on_ack(i * int(srtt), int(srtt), srtt, MIN_RTT, 1)
        cc.on_loss(i * int(srtt))
    assert cc.cwnd == 0.25
    assert cc.window == 1
    assert cc.rate_bps == pytest.approx(0.25 * PACKET_BITS / (srtt / 1e9))


@settings(max_examples=150)
@given(events=st.lists(st.tuples(st.sampled_from(["ack", "loss"]), st.integers(0, 50 * MS),
                                 st.integers(MIN_RTT, 20 * MIN_RTT), st.integers(1, 8)), max_size=60))
def test_rtt_limits_hold_for_any_event_sequence(events):
    cc = RttBased(LINE, PACKET_BITS, window=32)
    now, srtt = 0, 0.0
    for kind, dt, rtt, acked in events:
        now += dt
        if kind == "ack":
            srtt = 0.875 * srtt + 0.125 * rtt if srtt else float(rtt)
            cc.on_ack(now, rtt, srtt, MIN_RTT, acked)
        else:
            cc.on_loss(now)
        assert cc.min_cwnd <= cc.cwnd <= 32
        assert 1 <= cc.window <= 32
        assert 0 < cc.rate_bps <= LINE


# -- ecn (DCQCN) --------------------------------------------------------------------------------------------
PERIOD = 10 * PACKET_NS


def _ticks(cc: Dcqcn, start: float, periods: int) -> float:
    """Tick once per timer period for `periods` periods; return the time after."""
    now = start
    for _ in range(periods):
        now += PERIOD
        cc.tick(int(now) + 1)
    return now


def test_ecn_cuts_the_rate_by_half_alpha_on_a_cnp():
    cc = Dcqcn(LINE, PACKET_BITS)
    cc.on_cnp(MS)
    assert cc.rate_bps == pytest.approx(LINE / 2)  # alpha starts at 1
    now = _ticks(cc, MS, 30)
    rate, alpha = cc.rate_bps, cc.alpha
    assert alpha < 1
    cc.on_cnp(int(now) + 2)
    assert cc.rate_bps == pytest.approx(rate * (1 - alpha / 2))


def test_ecn_alpha_rises_on_cnps_and_decays_without():
    cc = Dcqcn(LINE, PACKET_BITS)
    cc.on_cnp(MS)
    now = _ticks(cc, MS, 20)
    decayed = cc.alpha
    assert decayed < 1
    cc.on_cnp(int(now) + 2)
    assert cc.alpha == pytest.approx((1 - cc.g) * decayed + cc.g)
    risen = cc.alpha
    now = _ticks(cc, now + 2, 1)  # the period in which the CNP came: no decay
    assert cc.alpha == risen
    _ticks(cc, now, 5)
    assert cc.alpha < risen


def test_ecn_alpha_does_not_decay_while_cnps_keep_coming():
    cc = Dcqcn(LINE, PACKET_BITS)
    now = 0.0
    for _ in range(20):
        now += PERIOD / 2
        cc.on_cnp(int(now))
        cc.tick(int(now) + 1)
    assert cc.alpha == 1.0
    assert cc.rate_bps == cc.min_rate


def test_ecn_recovers_towards_line_rate_without_exceeding_it():
    cc = Dcqcn(LINE, PACKET_BITS)
    for i in range(3):
        cc.on_cnp(MS + i)
    low = cc.rate_bps
    assert low < LINE / 4
    now, rates = float(MS), [low]
    for _ in range(5 + math.ceil(LINE / cc.rai)):  # fast recovery, then at most all of line rate in steps
        now += PERIOD
        cc.tick(int(now) + 1)
        rates.append(cc.rate_bps)
    assert all(a <= b <= LINE for a, b in pairwise(rates))
    assert rates[-1] >= 0.99 * LINE
    assert rates[6] < 0.99 * LINE  # gradual, not a jump


def test_ecn_ticks_before_any_cnp_change_nothing():
    cc = Dcqcn(LINE, PACKET_BITS)
    _ticks(cc, 0, 10)
    assert (cc.rate_bps, cc.alpha) == (LINE, 1.0)


@settings(max_examples=150)
@given(events=st.lists(st.tuples(st.sampled_from(["cnp", "tick", "loss"]), st.integers(0, int(3 * PERIOD))),
                       max_size=80))
def test_ecn_limits_hold_for_any_event_sequence(events):
    cc = Dcqcn(LINE, PACKET_BITS)
    now = 1
    for kind, dt in events:
        now += dt
        {"cnp": cc.on_cnp, "tick": cc.tick, "loss": cc.on_loss}[kind](now)
        assert cc.min_rate <= cc.rate_bps <= LINE
        assert 0 < cc.alpha <= 1
        assert cc.window == 32


def test_rtt_target_grows_as_the_window_shrinks():
    """Swift's flow scaling: no extra delay at the ceiling, fs_packets more packet times at min_cwnd, between
    them in 1 / sqrt(cwnd)."""
    cc = RttBased(LINE, PACKET_BITS, window=16, initial_window=16, fs_packets=4.0, min_cwnd=0.1)
    base = 1e6 + 2 * cc.packet_ns  # lowest RTT plus queue_packets (2) packet times
    assert cc.target_ns(1e6) == pytest.approx(base)
    cc.cwnd = 0.1
    assert cc.target_ns(1e6) == pytest.approx(base + 4 * cc.packet_ns)
    cc.cwnd = 1.0
    assert base < cc.target_ns(1e6) < base + 4 * cc.packet_ns


def test_rtt_starts_at_its_initial_window():
    assert RttBased(LINE, PACKET_BITS, window=14, initial_window=1).cwnd == 1.0
    assert RttBased(LINE, PACKET_BITS, window=14, initial_window=40).cwnd == 14.0  # never above the ceiling
    assert RttBased(LINE, PACKET_BITS, window=32).cwnd == 8.0  # a quarter of the ceiling when not given
