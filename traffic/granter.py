"""A receiver's pull schedule for cc pull (Granter): which of the queue pairs that asked gets the next grant, and
when; the senders' side of pull is traffic.transport.SendConnection's credit."""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from traffic.transport import rfc6298_timeout, smoothed


@dataclass
class _Pulled:
    """One queue pair as its receiver's granter sees it."""
    wanted: int = 0  # sends it asked to have granted in all
    granted: int = 0
    arrived: int = 0  # packets that came on its grants (never more than granted)
    last_ns: float = 0.0  # its last grant or arrival
    sent_ns: deque[float] = field(default_factory=deque)  # when each grant not yet arrived on was sent


class Granter:
    """A receiver's pull schedule (cc pull, in the style of NDP and EQDS): one packet granted at a time, paced at
    the receiver's link rate, in turn among the queue pairs that asked for more, with at most `limit` granted
    packets that have not arrived in all, so that an incast or an all-to-all never oversubscribes the receiver's
    downlink and its queue never holds more than `limit` packets (pacing alone would let a small mismatch between
    the grants' and the link's rate build a queue). Each queue pair may hold its share of the limit among those
    that want more (at least one, at most `per_qp`): a lone sender gets it all, and in an all-to-all each of
    fifteen gets one, so that a grant waiting behind a busy sender's other work does not hold the others back
    (measured: two each, to six at once, left downlinks idle and the all-to-all at 1.16x its bound; one each to
    every sender, 1.05x). A queue pair that sent nothing for the ttl after its last grant has its outstanding
    grants forgiven (the packets or the grants were lost). Grants are cumulative per queue pair.

    The ttl is learnt from the path, as RFC 6298 learns an RTO: from each grant's delay until its packet came
    (smoothed, plus four times its variation), never below `ttl_ns` (the model's figure, also its start). Across
    planes a grant's packet crosses NVLink and waits in a node-mate's NIC queue with its node-mates' packets: on
    the 64-GPU 8-plane all-to-all the fixed ttl (232 ms at 10 Mbit/s) forgave 87 k grants whose packets were
    only late (round trip p50 270 ms)."""

    def __init__(self, packet_ns: float, per_qp: int = 0, ttl_ns: float = 0.0, limit: int = 6) -> None:
        self.packet_ns = packet_ns
        self.per_qp = per_qp or limit
        self.limit = limit
        self.outstanding = 0  # granted and not arrived, over all queue pairs
        self.ttl_floor_ns = ttl_ns or 4 * packet_ns
        self.ttl_ns = self.ttl_floor_ns
        self.delay_ns = self.delay_var_ns = 0.0  # smoothed grant-to-arrival delay and its variation
        self.qps: dict[tuple[str, int], _Pulled] = {}
        self.turns: deque[tuple[str, int]] = deque()  # queue pairs that want more than they were granted
        self.next_ns = 0.0  # when the link is free for the next granted packet
        self.stats: Counter[str] = Counter()

    def request(self, key: tuple[str, int], wanted: int) -> int:
        """A queue pair asks for `wanted` sends in all; what it was granted so far (the reply: a lost grant is
        made good), or 0 (no reply) while it only waits its turn: every packet granted has come and it will be
        granted more, whose total says the rest (on the 64-GPU 8-plane all-to-all a receiver serves 56 in turn,
        and answering every repeated request made 1.6 grants per data packet)."""
        p = self.qps.get(key)
        if p is None:
            p = self.qps[key] = _Pulled()
        if p.granted >= p.wanted and wanted > p.granted:
            self.turns.append(key)  # it had left the turns, satisfied
        p.wanted = max(p.wanted, wanted)
        self.stats["requests"] += 1
        waiting_turn = p.arrived == p.granted < p.wanted
        return 0 if waiting_turn else p.granted

    def arrived(self, key: tuple[str, int], now_ns: int) -> None:
        p = self.qps.get(key)
        if p is not None:
            if p.arrived < p.granted:
                p.arrived += 1
                self.outstanding -= 1
                self._delay_sample(now_ns - p.sent_ns.popleft())
            p.last_ns = float(now_ns)

    def _delay_sample(self, delay: float) -> None:
        """The ttl from grant-to-arrival delays as an RTO from round trips (RFC 6298)."""
        self.delay_ns, self.delay_var_ns = smoothed(self.delay_ns, self.delay_var_ns, delay)
        self.ttl_ns = rfc6298_timeout(self.delay_ns, self.delay_var_ns, self.ttl_floor_ns)

    def _share(self) -> int:
        """Outstanding grants one queue pair may hold: its share of the limit among those that want more."""
        return min(self.per_qp, max(1, self.limit // max(1, len(self.turns))))

    def _capped(self, p: _Pulled, now_ns: int) -> bool:
        if p.granted - p.arrived < self._share():
            return False
        if now_ns - p.last_ns > self.ttl_ns:
            self._give_up(p)
            return False
        return True

    def _give_up(self, p: _Pulled) -> None:
        """Nothing came for the ttl: the grants or their packets were lost."""
        self.outstanding -= p.granted - p.arrived
        p.arrived = p.granted
        p.sent_ns.clear()
        self.stats["forgiven"] += 1

    def grant(self, now_ns: int) -> list[tuple[tuple[str, int], int]]:
        """The grants due by `now_ns`: (queue pair, its granted total), at most one per packet time."""
        out: list[tuple[tuple[str, int], int]] = []
        while self.turns and self.next_ns <= now_ns:
            if self.outstanding >= self.limit:
                self._forgive(now_ns)
                if self.outstanding >= self.limit:
                    break
            granted = False
            for _ in range(len(self.turns)):
                key = self.turns.popleft()
                p = self.qps[key]
                if p.granted >= p.wanted:
                    continue  # satisfied: leaves the turns until it asks for more
                if self._capped(p, now_ns):
                    self.turns.append(key)
                    continue
                p.granted += 1
                self.outstanding += 1
                p.last_ns = float(now_ns)
                p.sent_ns.append(float(now_ns))
                if p.granted < p.wanted:
                    self.turns.append(key)
                out.append((key, p.granted))
                self.next_ns = max(self.next_ns, now_ns - self.packet_ns) + self.packet_ns
                granted = True
                break
            if not granted:
                break
        self.stats["grants"] += len(out)
        return out

    def _forgive(self, now_ns: int) -> None:
        """At the limit: give up the grants of queue pairs that sent nothing for the ttl."""
        for p in self.qps.values():
            if p.granted > p.arrived and now_ns - p.last_ns > self.ttl_ns:
                self._give_up(p)

    def due_ns(self) -> float:
        """When grant() may have something: the link's next free time, or (every one that wants more being
        capped, or the limit reached) the earliest forgiveness; an arrival also frees a grant."""
        if not self.turns:
            return math.inf
        if self.outstanding >= self.limit:
            waiting = [p for p in self.qps.values() if p.granted > p.arrived]
        else:
            share = self._share()
            if any(self.qps[k].granted - self.qps[k].arrived < share for k in self.turns):
                return self.next_ns
            waiting = [self.qps[k] for k in self.turns]  # every one that wants more is capped
        return max(self.next_ns, min(p.last_ns for p in waiting) + self.ttl_ns + 1)
