"""The UDP probe the routing tests count with: a sink told how many to expect stops when they have all come, or
soon after the last when some were lost, so a sender that starts late (a slow VM's interpreter) is not cut short
by the sink's deadline, and a retry loop is not held to it."""

from __future__ import annotations

import threading
import time

from traffic import udpprobe


def test_a_sink_expecting_n_packets_stops_when_they_have_come_not_at_its_deadline():
    out: dict = {}
    listening = threading.Thread(target=lambda: out.update(udpprobe.sink(60.0, expect=300)))
    t0 = time.monotonic()
    listening.start()
    time.sleep(0.3)
    assert udpprobe.send("127.0.0.1", flows=3, packets=100, size=200, entropy=1, rate_pps=0)["sent"] == 300
    listening.join(timeout=30)
    assert not listening.is_alive() and time.monotonic() - t0 < 30
    assert out["received"] == 300 and out["missing"] == {}


def test_a_sink_says_it_listens_and_stops_soon_after_the_last_packet_when_some_were_lost():
    """A sender started once the sink is bound loses nothing to it; of 300 expected only 100 come (the rest lost
    on the way, as while routes are repaired): the sink stops IDLE_S after the last, not at its deadline."""
    out: dict = {}
    bound = threading.Event()
    listening = threading.Thread(target=lambda: out.update(udpprobe.sink(60.0, expect=300, listening=bound.set)))
    listening.start()
    assert bound.wait(10)
    t0 = time.monotonic()
    assert udpprobe.send("127.0.0.1", flows=1, packets=100, size=200, entropy=1, rate_pps=0)["sent"] == 100
    listening.join(timeout=30)
    assert not listening.is_alive() and time.monotonic() - t0 < udpprobe.IDLE_S + 2
    assert out["received"] == 100
