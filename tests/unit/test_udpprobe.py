"""The UDP probe the routing tests count with: a sink told how many to expect stops when they have all come, so a
sender that starts late (a slow VM's interpreter) is not cut short by the sink's deadline."""

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
