"""A host's books, kept alike by both agents (traffic.rdma, traffic.tcpagent): its share of the schedule (Plan:
what it sends and expects, which of its messages are due, what became of them) and a uniform sample of what it
measured (Sampler)."""

from __future__ import annotations

import heapq
import random

from emulator.model.schedule import Message
from traffic.contract import Delivery

RTT_SAMPLES = 5000  # per agent: a uniform sample, enough for percentiles

class Sampler:
    """Reservoir sample of a stream of numbers (Vitter's algorithm R)."""

    def __init__(self, size: int, rng: random.Random) -> None:
        self.size, self.rng, self.seen = size, rng, 0
        self.items: list[float] = []

    def add(self, value: float) -> None:
        self.seen += 1
        if len(self.items) < self.size:
            self.items.append(value)
        else:
            j = self.rng.randrange(self.seen)
            if j < self.size:
                self.items[j] = value


class Plan:
    """The host's share of the schedule: what it sends, what it expects, which of its messages are due (the
    start time has come and every dependency is complete: acknowledged if sent, delivered if received), and what
    became of them. Both agents (RDMA-like and TCP) keep their books here."""

    def __init__(self, messages: list[Message], host: str) -> None:
        self.mine = {m.id: m for m in messages if m.src == host}
        self.expected = {m.id: m for m in messages if m.dst == host}
        self.delivered: dict[int, Delivery] = {}  # message id -> what the receiving agent recorded
        self.acked = 0  # messages of mine fully acknowledged
        self.wrong_size = 0
        self.unmet = {m.id: len(m.deps) for m in self.mine.values()}
        self.dependents: dict[int, list[int]] = {}
        for m in self.mine.values():
            for dep in m.deps:
                self.dependents.setdefault(dep, []).append(m.id)
        self.ready = [(m.start_s, m.id) for m in self.mine.values() if not m.deps]
        heapq.heapify(self.ready)

    def completed(self, msg_id: int) -> None:
        for dependent in self.dependents.pop(msg_id, ()):
            self.unmet[dependent] -= 1
            if self.unmet[dependent] == 0:
                heapq.heappush(self.ready, (self.mine[dependent].start_s, dependent))

    def deliver(self, msg_id: int, nbytes: int, record: Delivery) -> bool:
        """A message became visible here; False if it is not one this host expects, or came before."""
        msg = self.expected.get(msg_id)
        if msg is None or msg_id in self.delivered:
            return False
        self.wrong_size += nbytes != msg.bytes
        self.delivered[msg_id] = record
        self.completed(msg_id)
        return True

    def acknowledged(self, msg_id: int) -> None:
        self.acked += 1
        self.completed(msg_id)

    def finished(self) -> bool:
        """Everything expected is delivered and everything of mine acknowledged."""
        return len(self.delivered) >= len(self.expected) and self.acked == len(self.mine)

    def next_ns(self, t0: int) -> float:
        return t0 + self.ready[0][0] * 1e9 if self.ready else float("inf")

    def due(self, t0: int, now: int) -> list[Message]:
        out = []
        while self.ready and self.next_ns(t0) <= now:
            out.append(self.mine[heapq.heappop(self.ready)[1]])
        return out
