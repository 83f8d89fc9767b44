"""How fast lossless pauses took effect, judged from the frames on the wire around a congested port (captured by
emulator.net.sniff), not from the pause thread's own word: the port's backlog is what arrived for it less what
it sent, its XOFF crossings are where that backlog passes XOFF (after having been at XON), and each feeder that
was sending at a crossing is paused once it falls silent. Times are kernel time stamps in ns."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

SILENT_PACKETS = 2  # a feeder quiet this many packet times after a crossing has been paused


@dataclass
class Reaction:
    """Per XOFF crossing and feeder sending at it: the crossing to the last frame before the feeder fell silent
    (an upper bound on the pause's reaction plus the one frame a paused gate lets through); per XON crossing
    and feeder paused at it: the crossing to its next frame (negative: it started before the captured backlog
    was down to XON)."""

    pause_ns: list[int] = field(default_factory=list)
    resume_ns: list[int] = field(default_factory=list)
    crossings: int = 0
    peak_bytes: int = 0


def crossings(arrivals: list[tuple[int, int]], departures: list[tuple[int, int]], xoff: int,
              xon: int) -> tuple[list[tuple[int, int]], int]:
    """(XOFF time, following XON time or 0) of a port whose (time, bytes) arrivals and departures are given, and
    its peak backlog."""
    events = sorted([(t, n) for t, n in arrivals] + [(t, -n) for t, n in departures])
    backlog = peak = 0
    out: list[tuple[int, int]] = []
    above = False
    for t, n in events:
        backlog += n
        peak = max(peak, backlog)
        if not above and backlog > xoff:
            out.append((t, 0))
            above = True
        elif above and backlog <= xon:
            out[-1] = (out[-1][0], t)
            above = False
    return out, peak


def reactions(cycles: list[tuple[int, int]], feeders: dict[str, list[int]], packet_ns: float) -> Reaction:
    """Pause and resume times of `feeders` (name -> sorted frame times) over a port's (XOFF, XON) cycles."""
    result = Reaction(crossings=len(cycles))
    silent = SILENT_PACKETS * packet_ns
    for xoff_at, xon_at in cycles:
        for times in feeders.values():
            i = bisect.bisect_right(times, xoff_at)
            if i == 0 or xoff_at - times[i - 1] > 1.5 * packet_ns:
                continue  # it was not sending at the crossing
            last = times[i - 1]
            while i < len(times) and times[i] - last <= silent:
                last = times[i]
                i += 1
            result.pause_ns.append(max(0, last - xoff_at))
            if xon_at and last < xon_at and i < len(times):
                result.resume_ns.append(times[i] - xon_at)
    return result
