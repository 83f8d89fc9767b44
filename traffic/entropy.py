"""Which path each packet of a queue pair takes: its UDP source port, which ECMP hashes and the spray app maps to
next hops (Entropy, one per path of a queue pair)."""

from __future__ import annotations

import random
from collections import deque

from emulator.model import wire

ENTROPY_MODES = ("fixed", "spray", "random", "flowlet", "reps")
SPRAYED = ("spray", "random", "reps")  # a new path per packet: packets overtake each other
RECYCLED_MAX = 64  # entropy values a reps sender keeps for reuse (more than any window here)


class Entropy:
    """The UDP source port of each packet: what ECMP hashes and what spraying maps to next hops.

    fixed: one port per queue pair (ECMP sees one flow); spray: step by one per packet (round-robin over the
    spray app's masked matches); random: a random port per packet; flowlet: a new random port when the queue
    pair was idle for longer than `flowlet_gap_ns` (flowlets decided by the sender); reps: recycled entropy as in
    UEC's REPS, the sender reusing values whose packets came back fast (`feedback`: unmarked, as REPS asks, where
    the switches mark ECN; else an RTT near the least seen) and dropping those that were slow or lost,
    and stepping on as spray does when it has none to reuse: a path that is slowed or backed up anywhere, even a
    hop past the switch that chooses, is left within a round trip, over any switch that maps entropy to paths.
    After a retransmission timeout a fixed or flowlet port is drawn again (`repath`): the queue pair does not
    resend into the path it just saw lose (as PRR and PLB do); spray and random change port with every packet.
    """

    def __init__(self, mode: str, rng: random.Random, flowlet_gap_ns: int = 20_000_000) -> None:
        if mode not in ENTROPY_MODES:
            raise ValueError(f"entropy mode must be one of {', '.join(ENTROPY_MODES)}")
        self.mode = mode
        self.rng = rng
        self.offset = rng.randrange(wire.ENTROPY_SPAN)
        self.gap = flowlet_gap_ns
        self.last_ns: int | None = None
        self.flowlets = 1
        self.repaths = 0
        self.recycled: deque[int] = deque()
        self.explore = self.offset  # reps: the next value to try when none is recycled
        self.reused = 0

    def port(self, now_ns: int) -> int:
        if self.mode == "spray":
            self.offset = (self.offset + 1) % wire.ENTROPY_SPAN
        elif self.mode == "random":
            self.offset = self.rng.randrange(wire.ENTROPY_SPAN)
        elif self.mode == "flowlet":
            if self.last_ns is not None and now_ns - self.last_ns > self.gap:
                self.offset = self.rng.randrange(wire.ENTROPY_SPAN)
                self.flowlets += 1
            self.last_ns = now_ns
        elif self.mode == "reps":
            if self.recycled:
                self.offset = self.recycled.popleft()
                self.reused += 1
            else:
                self.explore = (self.explore + 1) % wire.ENTROPY_SPAN
                self.offset = self.explore
        return wire.ENTROPY_BASE + self.offset

    def feedback(self, port: int, fast: bool) -> None:
        """reps: the packet sent with `port` was acknowledged, fast or not; only a fast one's value is reused."""
        if fast and self.mode == "reps" and len(self.recycled) < RECYCLED_MAX:
            self.recycled.append(port - wire.ENTROPY_BASE)

    def repath(self) -> None:
        """A retransmission timeout: leave the path that lost (a new port for fixed and flowlet entropy)."""
        if self.mode in ("fixed", "flowlet"):
            self.offset = (self.offset + 1 + self.rng.randrange(wire.ENTROPY_SPAN - 1)) % wire.ENTROPY_SPAN
            self.repaths += 1
