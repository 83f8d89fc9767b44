"""The reliable-connection logic of one queue pair, without sockets: what to send next, what an ACK means, what
to deliver. The agent (traffic.rdma.Agent) moves bytes; this module decides, so it is tested without a network.

Sender: messages are cut into packets with consecutive PSNs. The receiver acknowledges every packet with the
cumulative PSN (everything up to it arrived) and a 64-bit selective-ack bitmap of the PSNs after it (our
extension, as IRN proposed for RoCE). A packet is declared lost when one sent more than a reordering window
later has been acknowledged (RACK, RFC 8985), or when the retransmission timeout fires; a duplicate seen by the
receiver means a retransmission was spurious and the reordering window doubles.
Receiver: packets are resequenced by PSN for the cumulative ACK, and each message becomes visible to the
application once, as its ordering mode says (VISIBLE_ON_ARRIVAL): psn, when the in-order PSN pointer passes its
last packet; none and fence, as soon as all of its own packets are in (RDMA places them on arrival); release, a
write on arrival and a send once every earlier message of the queue pair is visible (region acquire/release).
Under fence the sender holds a send until every earlier message of its queue pair is acknowledged. A send that
becomes visible while an earlier message of its queue pair is not is an ordering violation (counted). The
receiver measures the arrival order the same way in every mode: out-of-order packets (first transmissions that
arrive after a higher PSN), their reorder distance (how many PSNs behind the highest seen), and the resequence
buffer (packets held for a gap, as a NIC delivering in order would hold them).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field

from emulator.model import wire
from traffic.cc import CongestionControl
from traffic.entropy import Entropy

MIN_RTO_NS = 50_000_000  # a queue pair's default least RTO; the runner gives each the fabric's (TransportOptions)
MAX_RTO_NS = 2_000_000_000  # the most an RTO backs off to, or eight least RTOs if more (at 1 Mbit/s one
# switch queue of 128 KiB drains in a second)
SACK_BITS = 64


def rto_ceiling(floor_ns: float) -> float:
    """The most a timeout with this least value backs off to."""
    return max(MAX_RTO_NS, 8 * floor_ns)


def smoothed(srtt: float, rttvar: float, sample: float) -> tuple[float, float]:
    """RFC 6298's smoothed round trip and its variation after one more sample (the first sets both)."""
    if not srtt:
        return sample, sample / 2
    return 0.875 * srtt + 0.125 * sample, 0.75 * rttvar + 0.25 * abs(srtt - sample)


def rfc6298_timeout(srtt: float, rttvar: float, floor_ns: float) -> float:
    """RFC 6298's timeout from them, within [floor_ns, rto_ceiling(floor_ns)]."""
    return min(max(srtt + 4 * rttvar, floor_ns), rto_ceiling(floor_ns))


ASK_BACKOFF_MAX = 16  # cc pull: a request unanswered is asked again after at most this many RTOs
# per ordering mode, the operations visible as soon as all of their own packets are in; the others become visible
# when the in-order PSN pointer passes their last packet (every earlier message of the queue pair is in)
VISIBLE_ON_ARRIVAL = {"psn": frozenset(), "fence": frozenset({"write", "send"}), "release": frozenset({"write"}),
                      "none": frozenset({"write", "send"})}
SEND_OPS = frozenset({wire.SEND_FIRST, wire.SEND_MIDDLE, wire.SEND_LAST, wire.SEND_ONLY})


@dataclass
class OutPacket:
    psn: int
    msg_id: int
    opcode: int
    payload_len: int
    dma_len: int
    tx_ns: int = 0
    sends: int = 0
    lost: bool = False
    by_timeout: bool = False  # its latest loss was declared by the retransmission timeout
    sport: int = 0  # the entropy of its latest transmission, and whose it is (reps feedback)
    entropy: Entropy | None = None


@dataclass
class SentMessage:
    id: int
    bytes: int
    posted_ns: int
    first_psn: int = -1
    last_psn: int = -1
    first_tx_ns: int = 0
    acked_ns: int = 0
    retransmits: int = 0


class SendConnection:
    """One queue pair's sending side."""

    def __init__(self, qp: int, cc: CongestionControl, payload: int, tclass: int = 0, fence: bool = False,
                 min_rto_ns: int = MIN_RTO_NS, reorder_ns: int = 0) -> None:
        """`reorder_ns`: how much later than a packet sent after it one may arrive without being lost (a sprayed
        queue pair's paths differ by up to a full queue); RACK's window starts there instead of learning it from
        spurious retransmissions (measured: 7 % of a sprayed permutation's packets were resent for nothing)."""
        self.qp = qp
        self.tclass = tclass  # a queue pair has one traffic class, as on a NIC
        self.fence = fence  # a send waits until every earlier message of the queue pair is acknowledged
        self.cc = cc
        self.payload = payload
        self.queue: deque[tuple[SentMessage, str]] = deque()  # posted, not yet fully packetised
        self.next_offset = 0  # bytes of the head message already packetised
        self.next_psn = 0
        self.unacked: dict[int, OutPacket] = {}
        self.retx: deque[int] = deque()
        self.lost_count = 0  # packets in `unacked` marked lost (so in_flight needs no scan)
        self.cum_acked = -1
        self.pending: deque[SentMessage] = deque()  # packetised (fully or partly), not yet acknowledged
        self.srtt = 0.0
        self.rttvar = 0.0
        self.min_rtt = float("inf")
        self.min_rto_ns = min_rto_ns or MIN_RTO_NS  # 0: not given
        self.max_rto_ns = int(rto_ceiling(self.min_rto_ns))
        self.rto = self.min_rto_ns  # the model's figure until a round trip is measured (RFC 6298's 1 s)
        self.reorder_ns = float(reorder_ns)
        self.reo_wnd = self.reorder_ns
        # reps: a round trip more than one packet time above the least seen means a packet was queued ahead of this
        # one on the way (a slack of a quarter of a full queue's drain recycled values whose packets had queued
        # behind others, and a symmetric permutation fell behind spray's; the asymmetry study compares them)
        self.fast_slack_ns = cc.packet_ns
        self.next_tx_ns = 0.0
        self.oldest_tx = 0  # no later than the transmission of every packet in flight (0: none in flight)
        self.stats: Counter[str] = Counter()
        # packets resent after a timeout, by PSN: the transmit time of the resend, until an ACK tells whether the
        # original had arrived (the resend's ACK says duplicate: a spurious timeout) or not (a loss)
        self.timeout_resends: dict[int, int] = {}
        self.sends = 0  # every transmission, first or re-
        self.new_packets = 0  # packets of posted messages not yet sent once
        # receiver-driven (cc pull): the sends the receiver allows in all, what it was last asked for, when to ask
        # again if no grant comes; without pull the credit is unlimited
        self.credit = math.inf
        self.is_pulled = False
        self.unscheduled = 0
        self.asked = 0
        self.ask_again_ns = math.inf
        self.ask_backoff = 1  # the time to ask again doubles with each request no grant answered
        self.turn_ns = 0.0  # the smoothed time between grants that added credit: how long a turn takes
        self.last_credit_ns = 0

    # -- sending --------------------------------------------------------------------------------------
    def post(self, msg: SentMessage, op: str) -> None:
        self.queue.append((msg, op))
        self.new_packets += max(1, -(-msg.bytes // self.payload))

    def in_flight(self) -> int:
        return len(self.unacked) - self.lost_count

    def has_work(self) -> bool:
        return self.sends < self.credit and (bool(self.retx) or self._may_start_packet())

    # -- receiver-driven credit (cc pull) -------------------------------------------------------------------
    def pulled(self, unscheduled: int) -> None:
        """From now on send only what the receiver grants, beyond `unscheduled` packets sent unasked."""
        self.is_pulled = True
        self.unscheduled = unscheduled
        self.credit = float(unscheduled)

    def wanted(self) -> int:
        """Sends this queue pair needs granted in all: what it sent, what it has not sent once, what it lost,
        less what it may send unasked."""
        return self.sends + self.new_packets + self.lost_count - self.unscheduled

    def first_request_due(self) -> bool:
        """It has never asked, no first request waits for its time (ask_again_ns), and it needs credit."""
        return self.asked == 0 and self.ask_again_ns == math.inf and self.unscheduled + self.wanted() > self.credit

    def ask(self, now_ns: int, again: bool = False) -> int:
        """How many sends to ask the receiver for (a request), or 0: nothing new to ask (or, `again`, the time to
        ask again has not come). A request unanswered for an RTO is asked again; while credit is short a time to
        ask again is always set, so a lost grant never leaves a queue pair waiting for nothing."""
        want = self.wanted()
        if self.unscheduled + want <= self.credit:
            self.ask_again_ns = math.inf
            self.asked = min(self.asked, want)  # a loss its ACK undid asked for more: a later loss is asked anew
            return 0
        if want <= self.asked and not (again and now_ns >= self.ask_again_ns):
            if self.ask_again_ns == math.inf:  # short of credit and no request pending: ask again in a while
                self.ask_again_ns = float(now_ns + self._ask_wait())
            return 0
        repeat = want <= self.asked
        self.asked = max(self.asked, want)
        self.ask_again_ns = float(now_ns + self._ask_wait() * self.ask_backoff)
        if repeat:  # no grant came for that long: the receiver has many to serve, or its grants were lost
            self.ask_backoff = min(self.ask_backoff * 2, ASK_BACKOFF_MAX)
            self.stats["repeated_requests"] += 1
        return want

    def grant(self, granted: int, now_ns: int = 0) -> None:
        """The receiver allows `granted` sends in all (cumulative, so a lost grant is made good by the next). A
        grant that adds credit shows the receiver has the request: the time to ask again starts anew, with no
        back-off (in an all-to-all a receiver serves 56 queue pairs in turn, and asking again every RTO while
        waiting for one's turn made 4 requests and 4 grants per data packet)."""
        credit = max(self.credit, float(self.unscheduled + granted))
        if credit > self.credit:
            self.ask_backoff = 1
            if self.last_credit_ns:
                gap = now_ns - self.last_credit_ns
                self.turn_ns = gap if not self.turn_ns else 0.75 * self.turn_ns + 0.25 * gap
            self.last_credit_ns = now_ns
            if self.ask_again_ns != math.inf:
                self.ask_again_ns = float(now_ns + self._ask_wait())
        self.credit = credit
        if self.credit >= self.unscheduled + self.wanted():
            self.ask_again_ns = math.inf

    def _ask_wait(self) -> float:
        """How long a request may go unanswered before it is asked again: an RTO, or two turns where the receiver
        serves so many that a turn is longer (on the 128-GPU 8-plane all-to-all a receiver serves 127 in turn at
        a quarter of its rate, 18 s a turn at 2 Mbit/s: asking every RTO made 2.8 requests per data packet)."""
        return max(float(self.rto), 2 * self.turn_ns)

    def _may_start_packet(self) -> bool:
        """A new packet may go: one is queued, the window has room, and no fence holds the next message back."""
        if not self.queue or self.in_flight() >= self.cc.window:
            return False
        return not (self.fence and self.next_offset == 0 and self.pending and self.queue[0][1] == "send")

    def next_packet(self, now_ns: int) -> OutPacket | None:
        """The packet to send now (a retransmission first), already marked as sent at `now_ns`."""
        if self.sends >= self.credit:
            return None
        while self.retx:
            pkt = self.unacked.get(self.retx.popleft())
            if pkt is not None and pkt.lost:
                pkt.lost = False
                self.lost_count -= 1
                self.stats["retransmits"] += 1
                self._sent(pkt, now_ns)
                if pkt.by_timeout:
                    self.timeout_resends[pkt.psn] = now_ns
                return pkt
        if not self._may_start_packet():
            return None
        msg, op = self.queue[0]
        first = self.next_offset == 0
        length = min(self.payload, msg.bytes - self.next_offset)
        last = self.next_offset + length >= msg.bytes
        pkt = OutPacket(self.next_psn, msg.id, wire.data_opcode(op, first, last), length,
                        msg.bytes if first else 0)
        if first:
            msg.first_psn = self.next_psn
            msg.first_tx_ns = now_ns
            self.pending.append(msg)
        self.next_psn += 1
        self.next_offset += length
        if last:
            msg.last_psn = pkt.psn
            self.queue.popleft()
            self.next_offset = 0
        self.unacked[pkt.psn] = pkt
        self.stats["data_packets"] += 1
        self.new_packets -= 1
        self._sent(pkt, now_ns)
        return pkt

    def _sent(self, pkt: OutPacket, now_ns: int) -> None:
        pkt.tx_ns = now_ns
        pkt.sends += 1
        self.sends += 1
        if not self.oldest_tx:
            self.oldest_tx = now_ns

    def timeout_ns(self) -> float:
        """When check_timeout may next find something (never later): the oldest transmission in flight plus the
        RTO. The agent sleeps until then instead of polling."""
        return self.oldest_tx + self.rto + 1 if self.oldest_tx else math.inf

    def timer_ns(self) -> float:
        """When any of the queue pair's timers may next have work: its RTO, its CC's timer, or asking again (pull)."""
        return min(self.timeout_ns(), self.cc.next_tick_ns(), self.ask_again_ns)

    def _oldest_moved(self) -> None:
        """After ACKs: the lowest PSN in flight, if sent once, is the oldest transmission in flight (first sends
        go in PSN order, and a resend of a higher PSN came after its first send); otherwise the old bound stays."""
        first = next(iter(self.unacked.values()), None)
        if first is None or self.in_flight() == 0:
            self.oldest_tx = 0
        elif first.sends == 1 and not first.lost:
            self.oldest_tx = first.tx_ns

    # -- acknowledgements ---------------------------------------------------------------------------------
    def on_ack(self, now_ns: int, cum_wire: int, sack: int, echo_ns: int, duplicate: bool,
               rtt_ns: int = 0, ce: bool | None = None) -> list[SentMessage]:
        """Apply one ACK; return the messages it completed (fully acknowledged). `rtt_ns`: the echoed
        transmission's round trip through the fabric, if the caller knows it better than `now_ns - echo_ns`
        (from kernel receive times, less the receiver's hold time); `ce`: whether the echoed packet arrived
        ECN-marked (None: the switches do not mark)."""
        cum = wire.unwrap_psn(cum_wire, self.cum_acked)
        acked = []
        for psn in self.unacked:  # in PSN order: next_packet adds ascending PSNs and a resend does not re-add
            if psn > cum:
                break
            acked.append(psn)
        sack &= (1 << SACK_BITS) - 2  # bits 1..63: PSNs cum+1 .. cum+63
        while sack:
            bit = sack & -sack
            sack ^= bit
            psn = cum + bit.bit_length() - 1
            if psn in self.unacked:
                acked.append(psn)
        rack_tx = echo_ns  # the transmission that triggered this ACK was delivered
        trigger = None
        for psn in acked:
            pkt = self.unacked.pop(psn)
            self.lost_count -= pkt.lost
            if pkt.sends == 1:  # a resent packet may be acked for an earlier copy: ambiguous (RFC 8985, 6.2 step 2)
                rack_tx = max(rack_tx, pkt.tx_ns)
                if pkt.tx_ns == echo_ns:
                    trigger = pkt
        self.cum_acked = max(self.cum_acked, cum)
        rtt = (rtt_ns or now_ns - echo_ns) if echo_ns else 0
        if echo_ns:
            self._rtt_sample(rtt)
            if trigger is not None and trigger.entropy is not None:  # only its own trip says how its path is
                trigger.entropy.feedback(trigger.sport, not ce if ce is not None
                                         else rtt <= self.min_rtt + self.fast_slack_ns)
        if self.timeout_resends and echo_ns:
            self._judge_timeout(echo_ns, duplicate)
        if duplicate:
            self.stats["spurious"] += 1
            self.reo_wnd = max(self.reo_wnd, min(max(self.reo_wnd * 2, 1_000_000),
                                                 max(self.srtt or self.max_rto_ns, self.reorder_ns)))
        if acked:
            self._oldest_moved()
            self.cc.on_ack(now_ns, rtt if echo_ns else int(self.srtt), self.srtt, self.min_rtt, len(acked))
            self._detect_losses(rack_tx)
        done = []
        while self.pending and self.pending[0].last_psn >= 0 and self.pending[0].last_psn <= self.cum_acked:
            msg = self.pending.popleft()
            msg.acked_ns = now_ns
            done.append(msg)
        return done

    def _rtt_sample(self, rtt: int) -> None:
        self.min_rtt = min(self.min_rtt, rtt)
        if not self.srtt:
            self.reo_wnd = max(self.min_rtt / 4, 1_000_000, self.reorder_ns)
        self.srtt, self.rttvar = smoothed(self.srtt, self.rttvar, float(rtt))
        self.rto = int(rfc6298_timeout(self.srtt, self.rttvar, self.min_rto_ns))

    def _judge_timeout(self, echo_ns: int, duplicate: bool) -> None:
        """An ACK echoing a resend after a timeout: a duplicate means the original had arrived (the timeout was
        spurious), otherwise the resend was the first copy in (the original was lost)."""
        for psn, tx_ns in self.timeout_resends.items():
            if tx_ns == echo_ns:
                del self.timeout_resends[psn]
                self.stats["timeout_spurious" if duplicate else "timeout_lost"] += 1
                return

    def _detect_losses(self, rack_tx: int) -> None:
        """RACK: a packet sent a reordering window before one that was acknowledged is lost."""
        for pkt in self.unacked.values():  # PSN order
            if pkt.tx_ns + self.reo_wnd >= rack_tx:
                if pkt.sends == 1:
                    break  # every later PSN was first sent after this one, so is not older than the window either
            elif not pkt.lost:
                self._lose(pkt)

    def _lose(self, pkt: OutPacket, by_timeout: bool = False) -> None:
        pkt.lost = True
        pkt.by_timeout = by_timeout
        self.lost_count += 1
        self.retx.append(pkt.psn)
        for msg in self.pending:
            if msg.first_psn <= pkt.psn and (msg.last_psn < 0 or pkt.psn <= msg.last_psn):
                msg.retransmits += 1
                break

    def check_timeout(self, now_ns: int) -> bool:
        """Retransmission timeout: everything outstanding for longer than the RTO is lost; the RTO backs off."""
        expired, oldest = [], 0  # one pass: what timed out, and the oldest transmission still in flight
        for p in self.unacked.values():
            if p.lost:
                continue
            if now_ns - p.tx_ns > self.rto:
                expired.append(p)
            elif not oldest or p.tx_ns < oldest:
                oldest = p.tx_ns
        for pkt in expired:
            self._lose(pkt, by_timeout=True)
        self.oldest_tx = oldest
        if not expired:
            return False
        self.stats["timeouts"] += 1
        self.rto = min(self.rto * 2, self.max_rto_ns)
        self.cc.on_loss(now_ns)
        return True



@dataclass
class InPacket:
    opcode: int
    msg_id: int
    payload_len: int
    retransmission: bool = False


@dataclass
class Delivered:
    msg_id: int
    bytes: int
    first_rx_ns: int  # its first packet arrived
    delivered_ns: int  # it became visible to the application
    arrived_ns: int  # its last missing packet arrived


@dataclass
class _Arriving:
    """A message on its way in, or in and not yet visible: its PSN range (-1 until its first or last packet came)
    and what has arrived."""
    op: str
    first_rx_ns: int
    first_psn: int = -1
    last_psn: int = -1
    packets: int = 0
    bytes: int = 0
    arrived_ns: int = 0  # 0 until every packet is in

    def complete(self) -> bool:
        return 0 <= self.first_psn <= self.last_psn and self.packets == self.last_psn - self.first_psn + 1


@dataclass
class RecvConnection:
    """One queue pair's receiving side: resequencing, delivery as the ordering mode says, arrival-order and
    ordering statistics."""
    ordering: str = "psn"
    expected: int = 0  # next PSN to resequence
    max_seen: int = -1
    buffer: dict[int, InPacket] = field(default_factory=dict)
    messages: dict[int, _Arriving] = field(default_factory=dict)  # by id: not yet visible
    delivered_count: int = 0
    stats: Counter = field(default_factory=Counter)
    reorder: Counter = field(default_factory=Counter)  # reorder distance -> packets
    reseq_max: int = 0
    ack_every: int = 1  # acknowledge every n-th packet (ACK coalescing, as RoCE NICs do); 1: every packet
    held: int = 0  # packets whose ACK is held (coalesced into the next one)
    held_since_ns: int = 0  # when the first of them arrived
    held_echo_ns: int = 0  # the newest one's transmit time: the next ACK echoes it
    held_rx_ns: int = 0  # and when it arrived (the kernel's receive time): the ACK echoes its hold time too

    def __post_init__(self) -> None:
        if self.ordering not in VISIBLE_ON_ARRIVAL:
            raise ValueError(f"ordering must be one of {', '.join(VISIBLE_ON_ARRIVAL)}")

    def ack_now(self, now_ns: int, tx_ns: int, urgent: bool, rx_ns: int = 0) -> bool:
        """After on_data: acknowledge now, or hold this packet's ACK for the next one. `urgent` packets (a
        duplicate, a CE mark, a message's last packet) are acknowledged at once, as is any packet while a PSN
        is missing (the sender's loss detection needs the selective acks) and every `ack_every`-th one; the
        agent flushes a held ACK after `ack_every` packet times (flush), so a small window never waits for a
        retransmission timeout. `rx_ns`: when the packet arrived, if not `now_ns`."""
        self.held += 1
        self.held_echo_ns = tx_ns
        self.held_rx_ns = rx_ns or now_ns
        if urgent or self.held >= self.ack_every or self.max_seen >= self.expected:
            self.held = 0
            return True
        if self.held == 1:
            self.held_since_ns = now_ns
        return False

    def flush(self) -> int:
        """Release the held ACK (the caller sends it now); the transmit time it echoes."""
        self.held = 0
        return self.held_echo_ns

    def on_data(self, now_ns: int, psn_wire: int, pkt: InPacket) -> tuple[bool, list[Delivered]]:
        """Take one data packet; return whether it was a duplicate and the messages it made visible, in order."""
        psn = wire.unwrap_psn(psn_wire, self.expected)
        self.stats["packets"] += 1
        if psn < self.expected or psn in self.buffer:
            self.stats["duplicates"] += 1
            return True, []
        if pkt.retransmission:
            self.stats["retransmitted"] += 1  # late because it was resent, not because the network reordered it
        elif psn < self.max_seen:
            self.stats["out_of_order"] += 1
            self.reorder[self.max_seen - psn] += 1
        self.max_seen = max(self.max_seen, psn)
        self.buffer[psn] = pkt
        self.reseq_max = max(self.reseq_max, len(self.buffer) - 1)
        msg = self.messages.get(pkt.msg_id)
        if msg is None:
            msg = self.messages[pkt.msg_id] = _Arriving("send" if pkt.opcode in SEND_OPS else "write", now_ns)
        if pkt.opcode in wire.FIRST_OPS:
            msg.first_psn = psn
        if pkt.opcode in wire.LAST_OPS:
            msg.last_psn = psn
        msg.packets += 1
        msg.bytes += pkt.payload_len
        delivered = []
        if msg.complete():
            msg.arrived_ns = now_ns
            if msg.op in VISIBLE_ON_ARRIVAL[self.ordering]:
                delivered.append(self._visible(pkt.msg_id, now_ns))
        while self.expected in self.buffer:
            p = self.buffer.pop(self.expected)
            self.expected += 1
            if p.opcode in wire.LAST_OPS and p.msg_id in self.messages:
                delivered.append(self._visible(p.msg_id, now_ns))
        return False, delivered

    def _visible(self, msg_id: int, now_ns: int) -> Delivered:
        """Make a message visible; check a send: an earlier message still invisible (some PSN before it missing,
        or in but held) is an ordering violation."""
        msg = self.messages.pop(msg_id)
        if msg.op == "send":
            self.stats["sends"] += 1
            if self.expected < msg.first_psn or any(m.arrived_ns and m.first_psn < msg.first_psn
                                                    for m in self.messages.values()):
                self.stats["violations"] += 1
        self.delivered_count += 1
        return Delivered(msg_id, msg.bytes, msg.first_rx_ns, now_ns, msg.arrived_ns)

    def ack_fields(self) -> tuple[int, int]:
        """Cumulative PSN and the selective-ack bitmap (bit i: PSN cumulative + i arrived)."""
        cum = self.expected - 1
        sack = 0
        for psn in self.buffer:
            if 0 < psn - cum < SACK_BITS:
                sack |= 1 << (psn - cum)
        return cum, sack
