"""How often a sender-driven congestion control can see the queue its flows share.

A receiver's downlink queue holds queue_bytes / frame packets and drains in as many packet times. When F senders
share that downlink fairly, each sends one packet every F packet times, so each one hears about the queue (an RTT
sample, an ECN mark) queue_packets / F times per drain. Below a few samples per drain, rtt and ecn react to a
queue that has already filled or emptied, and the queue swings between the two. This is the scale-down's doing,
not the algorithms': on the 16-host leaf-spine at 10 Mbit/s with 128 KB queues, the same 15 -> 1 incast under rtt
reached 1.08x its bound with a p99 queue of 76-82 % at MTU 9000 (a 14-packet queue: 1 sample per drain), and
1.05x with 11-16 % at MTU 1500 (87 packets: 6 per drain); DCQCN went from a 96 % p99 queue to 34 %
(benchmarks/congestion.py prints both). Real fabrics hold hundreds of MTU-sized packets per port.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from emulator.model import wire
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message

ENOUGH = 4.0  # samples per drain below which the verdict warns (1 failed the targets above, 6 met them)


@dataclass(frozen=True)
class Feedback:
    receiver: str
    senders: int  # distinct senders whose messages reach its NIC within one drain time of each other
    queue_packets: float

    @property
    def per_drain(self) -> float:
        return self.queue_packets / self.senders

    def warning(self) -> str:
        """The verdict's clause when each sender sees the queue too rarely to settle it, else ''."""
        if self.per_drain >= ENOUGH:
            return ""
        return (f"; SPARSE FEEDBACK: {self.senders} senders share {self.receiver}'s downlink, whose queue holds "
                f"{self.queue_packets:.1f} packets, so each sees that queue {self.per_drain:.1f} times per drain "
                f"{needs('--mtu', '--queue-kb', '--cc pull')}")


def needs(mtu: str, queue: str, pull: str) -> str:
    """What to change, in the caller's spelling of the options (command line or scenario)."""
    return f"(sender-driven congestion control needs >= {ENOUGH:.0f}: a smaller {mtu}, a larger {queue}, or {pull})"


def sparsest(fabric: Fabric, messages: Iterable[Message]) -> Feedback | None:
    """The receiver whose concurrent senders see its queue least often, or None when no two senders meet.
    Messages that wait on others are left out (when they start is not known before the run), and so are those
    from the receiver's own node (NVLink: they never reach its NIC)."""
    frame = fabric.mtu + wire.ETH
    queue_packets = fabric.queue_bytes / frame
    starts: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for m in messages:
        domain = fabric.nvlink_peer(m.dst)
        if not m.deps and m.src != m.dst and not (domain is not None and domain == fabric.nvlink_peer(m.src)):
            starts[m.dst].append((m.start_s, m.src))
    worst = None
    for dst, posts in starts.items():
        downlink_bps = min(fabric.rate(leaf, dst) for leaf, _port in fabric.nic_links(dst))
        drain_s = fabric.queue_bytes * 8 / downlink_bps
        senders = _most_within(sorted(posts), drain_s)
        if senders > 1 and (worst is None or queue_packets / senders < worst.per_drain):
            worst = Feedback(dst, senders, queue_packets)
    return worst


def _most_within(posts: list[tuple[float, str]], width_s: float) -> int:
    """The most distinct senders among posts (sorted by time) that fall within `width_s` of each other."""
    best, lo, count = 0, 0, defaultdict(int)
    for start, src in posts:
        count[src] += 1
        while posts[lo][0] < start - width_s:
            count[posts[lo][1]] -= 1
            if not count[posts[lo][1]]:
                del count[posts[lo][1]]
            lo += 1
        best = max(best, len(count))
    return best


def settled(queue: Sequence[float], kmin: float, kmax: float) -> int | None:
    """Where a marked queue's start ends, as an index into its samples: senders start at line rate and fill it
    before the first mark can come back, so the start lasts until the queue is back under kmin after its first
    time at kmax (0: it never reached kmax). None when that takes over a tenth of the samples: the queue did not
    settle, it stayed up for want of control. DCQCN is judged after its start, as its authors judge it."""
    top = next((i for i, b in enumerate(queue) if b >= kmax), None)
    if top is None:
        return 0
    end = next((i for i in range(top, len(queue)) if queue[i] < kmin), len(queue))
    return end if end <= len(queue) / 10 else None
