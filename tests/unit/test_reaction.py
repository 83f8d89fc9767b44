"""The pause reaction read from frames (emulator.analysis.reaction), on invented captures."""

from __future__ import annotations

from emulator.analysis import reaction

PT = 1000  # one packet time, ns


def test_the_backlog_crosses_xoff_then_falls_to_xon_once_per_cycle():
    arrivals = [(t, 10) for t in range(0, 100, 10)] + [(500, 60)]  # 100 bytes by t=90, then 60 more at 500
    departures = [(t, 10) for t in range(200, 400, 20)]  # drained by 380
    cycles, peak = reaction.crossings(arrivals, departures, xoff=55, xon=20)
    assert peak == 100
    assert cycles == [(50, 340), (500, 0)]  # above 55 at the sixth arrival; at 20 after the eighth departure


def test_a_busy_feeder_pauses_when_it_falls_silent_and_resumes_at_its_next_frame():
    feeder = [0, 1000, 2000, 3000, 3400, 9000, 10000]  # sending each packet time, one frame let by, then silent
    idle = [100]  # sent long before the crossing: not counted
    result = reaction.reactions([(3100, 8500)], {"busy": feeder, "idle": idle}, PT)
    assert result.pause_ns == [300] and result.resume_ns == [500]
    assert result.crossings == 1


def test_a_feeder_already_silent_at_the_crossing_paused_at_once():
    result = reaction.reactions([(3100, 0)], {"f": [2000, 3000, 7000]}, PT)
    assert result.pause_ns == [0] and result.resume_ns == []  # no XON crossing seen: no resume counted
