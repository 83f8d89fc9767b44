"""The reliable connection without sockets: a sender and a receiver exchange real RoCEv2 datagrams (emulator.model.wire)
through a scripted network on a fake clock. Every message is delivered once, in order, whole, whatever the network
drops, reorders or duplicates; loss detection (RACK, RTO), the reordering window, selective acks, the send window,
the receiver's arrival-order statistics, entropy and PSN wrap-around are checked one by one."""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from itertools import count, pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.model import wire
from traffic.cc import PLUGINS
from traffic.entropy import Entropy
from traffic.granter import Granter
from traffic.options import ORDERINGS
from traffic.transport import (
    MAX_RTO_NS,
    MIN_RTO_NS,
    InPacket,
    RecvConnection,
    SendConnection,
    SentMessage,
)

T0 = 1_000_000_000  # the fake clock starts here (a zero timestamp means "no echo")
US = 1_000
MS = 1_000_000
GAP = 100 * US  # the sender's pacing: one packet per queue pair per gap
DELAY = 1 * MS  # one-way delay of every datagram, before a fate's extra delay
PAYLOAD = 100
LINE = 10e6


def _sender(window: int = 64, cc: str = "none", qp: int = 1) -> SendConnection:
    return SendConnection(qp, PLUGINS[cc](LINE, (PAYLOAD + wire.OVERHEAD + wire.ETH) * 8, window), PAYLOAD)


def _start_at(snd: SendConnection, rcv: RecvConnection, psn: int) -> None:
    """Both ends of a fresh queue pair agree to start at `psn` instead of 0."""
    snd.next_psn, snd.cum_acked = psn, psn - 1
    rcv.expected, rcv.max_seen = psn, psn - 1


# -- a scripted network ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fate:
    """What the network does to one datagram: drop it, or deliver `copies` copies `extra_ns` late."""
    drop: bool = False
    copies: int = 1
    extra_ns: int = 0


@dataclass
class Pair:
    snd: SendConnection
    rcv: RecvConnection = field(default_factory=RecvConnection)
    posted: list[SentMessage] = field(default_factory=list)
    delivered: list = field(default_factory=list)
    completed: list[SentMessage] = field(default_factory=list)

    def post(self, msg_id: int, size: int, op: str = "write") -> None:
        msg = SentMessage(msg_id, size, T0)
        self.posted.append(msg)
        self.snd.post(msg, op)


def simulate(pairs: dict[int, Pair], fates=(), max_events: int = 20_000, max_ns: int = 300 * 10 ** 9,
             sent: Counter | None = None, granter: Granter | None = None) -> int:
    """Run the queue pairs until every message is acknowledged and the network is empty; return the clock (and
    count the datagrams of each kind into `sent`). With a `granter` the senders are pulled (cc pull): they ask, it
    grants, as the agent does.

    Datagrams (data, ACKs, requests and grants alike) take the next fate from `fates`; once those are used up the
    network is perfect.
    """
    fates = iter(fates)
    heap: list = []
    order = count()
    buf = bytearray(2048)
    now = next_send = T0

    def transmit(kind: str, length: int) -> None:
        if sent is not None:
            sent[kind] += 1
        fate = next(fates, Fate())
        if not fate.drop:
            for copy in range(fate.copies):
                heapq.heappush(heap, (now + DELAY + fate.extra_ns + copy, next(order), kind,
                                      bytes(buf[wire.UDP_HDR.size:length])))

    for _ in range(max_events):
        if now - T0 > max_ns:
            break
        if granter is not None:
            for (_, qp), granted in granter.grant(now):
                transmit("grant", wire.pack_pull(buf, wire.ENTROPY_BASE, qp, granted, now, 0, wire.PULL_GRANT))
        if now >= next_send:
            for qp, pair in pairs.items():
                pkt = pair.snd.next_packet(now) if pair.snd.has_work() else None
                if pkt is not None:
                    flags = wire.FLAG_RETX if pkt.sends > 1 else 0
                    transmit("data", wire.pack_data(buf, wire.ENTROPY_BASE, pkt.opcode, qp, pkt.psn,
                                                    pkt.msg_id, now, 0, flags, pkt.payload_len, dma_len=pkt.dma_len))
            next_send = now + GAP
        while heap and heap[0][0] <= now:
            _, _, kind, datagram = heapq.heappop(heap)
            if kind == "flush":  # as the agent: a held ACK goes out after ack_every packet times
                pair = pairs[datagram]
                if pair.rcv.held and now >= pair.rcv.held_since_ns + pair.rcv.ack_every * GAP:  # not a stale one
                    cum, sack = pair.rcv.ack_fields()
                    transmit("ack", wire.pack_ack(buf, wire.ROCE_PORT, datagram, cum, pair.rcv.delivered_count,
                                                  pair.rcv.flush(), now, sack, 0, 0))
                continue
            p = wire.Parsed(datagram)
            pair = pairs[p.dqpn]
            if kind == "request":
                granted = granter.request(("s", p.dqpn), p.count)
                if granted:
                    transmit("grant", wire.pack_pull(buf, wire.ENTROPY_BASE, p.dqpn, granted, now, 0, wire.PULL_GRANT))
            elif kind == "grant":
                pair.snd.grant(p.count)
            elif kind == "data":
                if granter is not None:
                    granter.arrived(("s", p.dqpn), now)
                dup, done = pair.rcv.on_data(now, p.psn, InPacket(p.opcode, p.msg_id, p.payload_len,
                                                                  bool(p.flags & wire.FLAG_RETX)))
                pair.delivered += done
                if pair.rcv.ack_now(now, p.tx_ns, dup or p.opcode in wire.LAST_OPS):
                    cum, sack = pair.rcv.ack_fields()
                    transmit("ack", wire.pack_ack(buf, wire.ROCE_PORT, p.dqpn, cum, pair.rcv.delivered_count,
                                                  p.tx_ns, now, sack, wire.FLAG_DUP if dup else 0, 0))
                elif pair.rcv.held == 1:
                    heapq.heappush(heap, (now + pair.rcv.ack_every * GAP, next(order), "flush", p.dqpn))
            else:
                done = pair.snd.on_ack(now, p.psn, p.sack, p.echo_ns, bool(p.flags & wire.FLAG_DUP))
                delivered = {d.msg_id for d in pair.delivered}
                assert all(m.id in delivered for m in done), "completed at the sender before it was delivered"
                pair.completed += done
        for pair in pairs.values():  # as the agent: timers are checked when one may fire, not polled
            if now >= pair.snd.timeout_ns():
                pair.snd.check_timeout(now)
            assert_timer_is_not_late(pair.snd)
        for qp, pair in pairs.items() if granter is not None else ():  # as the agent, after whatever changed
            wanted = pair.snd.ask(now, again=True)
            if wanted:
                transmit("request", wire.pack_pull(buf, wire.ENTROPY_BASE, qp, wanted, now, 0, wire.PULL_REQUEST))
        if not heap and all(len(p.completed) == len(p.posted) for p in pairs.values()):
            return now
        wake = [heap[0][0]] if heap else []
        wake += [t for t in (p.snd.timeout_ns() for p in pairs.values()) if t != math.inf]
        if granter is not None:
            wake += [t for t in (granter.due_ns(), *(p.snd.ask_again_ns for p in pairs.values())) if t != math.inf]
        if any(p.snd.has_work() for p in pairs.values()):
            wake.append(next_send)
        assert wake, "stalled: nothing in flight, nothing to send, yet messages are incomplete"
        now = max(now + 1, math.ceil(min(wake)))  # times are integer ns, as the agent's clock
    raise AssertionError("did not finish")


def assert_timer_is_not_late(snd: SendConnection) -> None:
    """The sender's timeout time is no later than the moment its oldest packet in flight exceeds the RTO."""
    in_flight = [p.tx_ns for p in snd.unacked.values() if not p.lost]
    if in_flight:
        assert snd.timeout_ns() <= min(in_flight) + snd.rto + 1
    assert snd.oldest_tx == 0 or not in_flight or snd.oldest_tx <= min(in_flight)


def assert_exactly_once_in_order(pair: Pair) -> None:
    assert [(d.msg_id, d.bytes) for d in pair.delivered] == [(m.id, m.bytes) for m in pair.posted]
    assert [m.id for m in pair.completed] == [m.id for m in pair.posted]
    assert all(m.acked_ns >= m.first_tx_ns > 0 for m in pair.completed)
    assert pair.snd.in_flight() == 0 and not pair.snd.unacked
    assert not pair.rcv.buffer


# -- end to end ---------------------------------------------------------------------------------------------
def test_clean_network_delivers_everything_without_retransmission():
    pair = Pair(_sender(window=8))
    for i, size in enumerate([1, PAYLOAD, PAYLOAD + 1, 10 * PAYLOAD, 2345]):
        pair.post(i, size, "send" if i % 2 else "write")
    simulate({1: pair})
    assert_exactly_once_in_order(pair)
    assert pair.snd.stats["retransmits"] == 0 and pair.snd.stats["timeouts"] == 0
    assert pair.snd.stats["data_packets"] == 1 + 1 + 2 + 10 + 24
    assert pair.rcv.stats["out_of_order"] == 0 and pair.rcv.stats["duplicates"] == 0


def test_lost_last_packet_is_recovered_by_timeout():
    pair = Pair(_sender(window=8))
    pair.post(0, 3 * PAYLOAD)
    simulate({1: pair}, [Fate(), Fate(), Fate(drop=True)])  # the data packets go first: the third is dropped
    assert_exactly_once_in_order(pair)
    assert pair.snd.stats["timeouts"] == 1 and pair.posted[0].retransmits == 1


def test_two_queue_pairs_share_the_network_independently():
    pairs = {1: Pair(_sender(window=4, qp=1)), 0xABCDEF: Pair(_sender(window=2, qp=0xABCDEF))}
    for i in range(4):
        pairs[1].post(i, 250)
        pairs[0xABCDEF].post(100 + i, 150 + i)
    fates = [Fate(extra_ns=(3 * MS if i % 3 == 0 else 0), drop=i % 7 == 3) for i in range(30)]
    simulate(pairs, fates)
    for pair in pairs.values():
        assert_exactly_once_in_order(pair)


@st.composite
def fates(draw) -> list[Fate]:
    """The fates of the first 20..100 datagrams: drops, duplicates and delays (reordering) at drawn rates."""
    rng = random.Random(draw(st.integers(0, 2 ** 32)))
    p_drop, p_dup, p_late = (draw(st.sampled_from([0.0, 0.05, 0.2, 0.4])) for _ in range(3))
    return [Fate(rng.random() < p_drop, 1 + (rng.random() < p_dup),
                 rng.choice([50 * US, 300 * US, 1 * MS, 5 * MS]) if rng.random() < p_late else 0)
            for _ in range(draw(st.integers(20, 100)))]


@settings(max_examples=150, deadline=None)
@given(sizes=st.lists(st.lists(st.integers(1, 8 * PAYLOAD), min_size=2, max_size=4), min_size=1, max_size=2),
       ops=st.lists(st.sampled_from(["write", "send"]), min_size=4, max_size=4),
       window=st.integers(1, 8), cc=st.sampled_from(["none", "rtt"]),
       start=st.sampled_from([0, wire.PSN_MASK - 3]), fates=fates(), ack_every=st.sampled_from([1, 2, 4]))
def test_every_message_delivered_exactly_once_in_order_under_any_network(sizes, ops, window, cc, start, fates,
                                                                         ack_every):
    pairs = {}
    for qp, qp_sizes in enumerate(sizes, start=1):
        pair = pairs[qp] = Pair(_sender(window, cc, qp), RecvConnection(ack_every=ack_every))
        _start_at(pair.snd, pair.rcv, start)
        for i, size in enumerate(qp_sizes):
            pair.post(100 * qp + i, size, ops[i])
    simulate(pairs, fates)
    for pair in pairs.values():
        assert_exactly_once_in_order(pair)


def test_psn_wrap_with_loss_and_reordering():
    pair = Pair(_sender(window=6))
    _start_at(pair.snd, pair.rcv, wire.PSN_MASK - 5)
    for i in range(3):
        pair.post(i, 7 * PAYLOAD)
    fates = [Fate(extra_ns=4 * MS) if i % 4 == 1 else Fate(drop=i % 9 == 5) for i in range(40)]
    simulate({1: pair}, fates)
    assert_exactly_once_in_order(pair)
    assert pair.snd.next_psn > 1 << 24  # it did cross the wrap
    assert pair.rcv.stats["out_of_order"] > 0


# -- the sender, step by step -------------------------------------------------------------------------------
def _send(snd: SendConnection, times: list[int]) -> list:
    """Send one packet at each time (relative to T0)."""
    return [snd.next_packet(T0 + t) for t in times]


def _sack(*psns_after_cum: int) -> int:
    return sum(1 << i for i in psns_after_cum)


def test_message_completes_only_when_fully_acknowledged():
    snd = _sender()
    msg = SentMessage(7, 3 * PAYLOAD, T0)
    snd.post(msg, "write")
    _send(snd, [0, 0, 0])
    assert snd.on_ack(T0 + MS, 1, 0, 0, False) == []  # PSNs 0 and 1
    assert snd.on_ack(T0 + MS, 0, _sack(2), 0, False) == []  # PSN 2 selectively (an older cumulative ack)
    assert snd.in_flight() == 0 and msg.acked_ns == 0
    assert snd.on_ack(T0 + 2 * MS, 2, 0, 0, False) == [msg]
    assert msg.acked_ns == T0 + 2 * MS


def test_partly_sent_message_does_not_complete():
    snd = _sender(window=2)
    first, second = SentMessage(1, PAYLOAD, T0), SentMessage(2, 3 * PAYLOAD, T0)
    snd.post(first, "write")
    snd.post(second, "write")
    _send(snd, [0, 0])
    assert snd.next_packet(T0) is None  # window full: second has 2 packets left
    assert snd.on_ack(T0 + MS, 1, 0, 0, False) == [first]
    assert second.acked_ns == 0


def test_window_limits_packets_in_flight():
    snd = _sender(window=4)
    snd.post(SentMessage(1, 10 * PAYLOAD, T0), "write")
    sent = [snd.next_packet(T0 + i) for i in range(6)]
    assert [p.psn for p in sent[:4]] == [0, 1, 2, 3] and sent[4:] == [None, None]
    assert snd.in_flight() == 4 and not snd.has_work()
    snd.on_ack(T0 + MS, 0, 0, 0, False)
    assert snd.in_flight() == 3 and snd.has_work()
    assert snd.next_packet(T0 + MS).psn == 4 and snd.next_packet(T0 + MS) is None


def test_packets_carry_message_framing():
    snd = _sender()
    snd.post(SentMessage(1, 2 * PAYLOAD + 1, T0), "write")
    snd.post(SentMessage(2, PAYLOAD, T0), "send")
    pkts = [snd.next_packet(T0) for _ in range(4)]
    assert [(p.opcode, p.msg_id, p.payload_len, p.dma_len) for p in pkts] == [
        (wire.WRITE_FIRST, 1, PAYLOAD, 2 * PAYLOAD + 1), (wire.WRITE_MIDDLE, 1, PAYLOAD, 0),
        (wire.WRITE_LAST, 1, 1, 0), (wire.SEND_ONLY, 2, PAYLOAD, PAYLOAD)]


def _rack_setup(times: list[int], rtt: int = 10 * MS, reorder_ns: int = 0) -> tuple[SendConnection, list]:
    """Packets sent at `times`; an ACK of the second packet gives the first RTT sample (reo_wnd = rtt / 4, or
    `reorder_ns` where larger)."""
    snd = _sender()
    snd.reorder_ns = snd.reo_wnd = float(reorder_ns)
    snd.post(SentMessage(1, len(times) * PAYLOAD, T0), "write")
    pkts = _send(snd, times)
    snd.on_ack(T0 + times[1] + rtt, -1 & wire.PSN_MASK, _sack(2), T0 + times[1], False)
    return snd, pkts


def test_rack_marks_a_packet_lost_when_a_later_one_is_acked_beyond_the_reordering_window():
    snd, pkts = _rack_setup([0, 500 * US, 2 * MS, 3 * MS])  # reo_wnd = 2.5 ms
    assert snd.in_flight() == 3 and not snd.retx
    snd.on_ack(T0 + 12 * MS, -1 & wire.PSN_MASK, _sack(2, 3), T0 + 2 * MS, False)  # 2 ms after packet 0: in window
    assert snd.in_flight() == 2 and snd.next_packet(T0 + 12 * MS) is None
    snd.on_ack(T0 + 13 * MS, -1 & wire.PSN_MASK, _sack(2, 3, 4), T0 + 3 * MS, False)  # 3 ms after: beyond
    assert snd.in_flight() == 0
    again = snd.next_packet(T0 + 13 * MS)
    assert (again.psn, again.sends) == (0, 2) and snd.stats["retransmits"] == 1
    assert snd.pending[0].retransmits == 1


def test_a_sprayed_queue_pair_tolerates_the_reordering_of_a_full_queue_from_the_start():
    snd, _ = _rack_setup([0, 500 * US, 2 * MS, 90 * MS], reorder_ns=100 * MS)
    snd.on_ack(T0 + 100 * MS, -1 & wire.PSN_MASK, _sack(2, 3, 4), T0 + 90 * MS, False)  # 90 ms after packet 0
    assert snd.in_flight() == 1 and snd.next_packet(T0 + 100 * MS) is None  # overtaken, not lost
    for _ in range(20):  # small RTT samples keep it, where RACK alone would cap the window at the SRTT
        snd.on_ack(T0 + 101 * MS, -1 & wire.PSN_MASK, _sack(2, 3, 4), T0 + 100 * MS, True)
    assert snd.reo_wnd == 100 * MS and snd.srtt < 10 * MS


def test_rack_ignores_the_retransmission_time_of_an_ambiguous_ack():
    """A retransmitted packet whose ACK echoes the original's timestamp was not delivered by the retransmission:
    packets sent between the two are not thereby lost (RFC 8985: ambiguous ACKs do not advance RACK)."""
    snd, pkts = _rack_setup([0, 1 * MS, 2 * MS, 4 * MS])  # reo_wnd = 2.5 ms
    snd.on_ack(T0 + 14 * MS, -1 & wire.PSN_MASK, _sack(2, 4), T0 + 4 * MS, False)  # packet 3: 0 is lost, 2 is not
    assert snd.next_packet(T0 + 14 * MS).psn == 0
    assert snd.next_packet(T0 + 14 * MS) is None
    snd.on_ack(T0 + 15 * MS, 1, _sack(2), T0, False)  # the late original of packet 0 arrived
    assert snd.in_flight() == 1 and snd.next_packet(T0 + 15 * MS) is None  # packet 2 is still in flight


def test_rto_fires_and_backs_off():
    snd = _sender()
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    rto = snd.rto
    assert not snd.check_timeout(T0 + rto)
    assert snd.check_timeout(T0 + rto + 1)
    assert snd.stats["timeouts"] == 1 and snd.in_flight() == 0
    assert not snd.check_timeout(T0 + 10 * rto)  # nothing left to time out until it is resent
    resent_at = T0 + rto + 1
    assert snd.next_packet(resent_at).sends == 2
    assert not snd.check_timeout(resent_at + rto + 1)  # backed off: twice as long now
    assert snd.check_timeout(resent_at + 2 * rto + 1)
    for _ in range(10):  # and capped
        snd.next_packet(T0)
        snd.check_timeout(T0 + 10 * MAX_RTO_NS)
    assert snd.rto == MAX_RTO_NS


def test_rtt_samples_set_the_rto_floor():
    snd = _sender()
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    snd.on_ack(T0 + 2 * MS, 0, 0, T0, False)
    assert snd.min_rtt == 2 * MS and snd.srtt == 2 * MS
    assert snd.rto == MIN_RTO_NS  # a 2 ms RTT would give 6 ms: below the floor


def test_the_fabric_round_trip_given_by_the_agent_is_the_sample():
    """The agent measures a round trip from kernel receive times, less the receiver's hold: that sample, not
    the time from sending to the loop coming round to the ACK, is what the RTT estimate and the cc hear."""
    snd = _sender(cc="rtt")
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    snd.on_ack(T0 + 30 * MS, 0, 0, T0, False, rtt_ns=2 * MS)
    assert snd.min_rtt == snd.srtt == 2 * MS and snd.cc.rtt_ns == 2 * MS


def test_a_held_ack_remembers_when_its_packet_arrived():
    rcv = RecvConnection("psn", ack_every=4)
    rcv.on_data(T0, 0, InPacket(wire.WRITE_FIRST, 1, PAYLOAD, False))
    assert not rcv.ack_now(T0 + 5 * MS, T0 - MS, urgent=False, rx_ns=T0 + MS)
    assert (rcv.held_echo_ns, rcv.held_rx_ns) == (T0 - MS, T0 + MS)
    assert rcv.ack_now(T0, T0, urgent=True) and rcv.held_rx_ns == T0  # no kernel time: the agent's


def test_a_queue_pair_keeps_the_floor_it_was_given():
    snd = SendConnection(0, PLUGINS["none"](LINE, 72_112, 1), PAYLOAD, min_rto_ns=212 * MS)
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    assert not snd.check_timeout(T0 + 211 * MS)  # an RTT of 181 ms in an all-to-all is only queueing
    snd.on_ack(T0 + 181 * MS, 0, 0, T0, False)
    assert snd.rto == 181 * MS + 4 * 90.5 * MS  # srtt + 4 x rttvar: above the floor
    snd.post(SentMessage(2, PAYLOAD, T0), "write")
    _send(snd, [200 * MS])
    for _ in range(30):  # small samples pull the estimate down, never under the floor
        snd.on_ack(T0 + 202 * MS, 1, 0, T0 + 200 * MS, False)
    assert snd.rto == 212 * MS


def test_timeout_reduces_the_congestion_window():
    snd = _sender(cc="rtt")
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    before = snd.cc.state()["cwnd"]
    snd.check_timeout(T0 + snd.rto + 1)
    assert snd.cc.state()["cwnd"] < before


@pytest.mark.parametrize("rtt", [10 * MS, 400 * US])
def test_spurious_retransmission_widens_the_reordering_window(rtt):
    snd, _ = _rack_setup([0, 1 * MS, 2 * MS, 3 * MS, 4 * MS], rtt=rtt)
    rcv = RecvConnection()
    assert rcv.on_data(T0, 0, InPacket(wire.WRITE_FIRST, 1, PAYLOAD))[0] is False
    dup, _ = rcv.on_data(T0, 0, InPacket(wire.WRITE_FIRST, 1, PAYLOAD, retransmission=True))
    assert dup is True
    before = snd.reo_wnd
    snd.on_ack(T0 + 5 * MS + rtt, 0, 0, T0 + 5 * MS, dup)  # the ACK of the retransmission sent at 5 ms
    assert snd.stats["spurious"] == 1
    assert snd.reo_wnd >= before
    if before < snd.srtt:
        assert snd.reo_wnd > before


def test_widened_window_tolerates_more_reordering():
    def lost_after(spurious: bool) -> bool:
        snd, _ = _rack_setup([0, 1 * MS, 2 * MS, 4 * MS])  # reo_wnd = 2.5 ms
        if spurious:
            snd.on_ack(T0 + 12 * MS, -1 & wire.PSN_MASK, _sack(2), T0 + 1 * MS, True)
        snd.on_ack(T0 + 14 * MS, -1 & wire.PSN_MASK, _sack(2, 4), T0 + 4 * MS, False)  # 4 ms after packet 0
        return snd.next_packet(T0 + 14 * MS) is not None
    assert lost_after(spurious=False) and not lost_after(spurious=True)


def test_sack_acknowledges_only_the_packets_it_names():
    snd = _sender(window=128)
    snd.post(SentMessage(1, 71 * PAYLOAD, T0), "write")
    _send(snd, [0] * 71)  # all at once, so RACK sees no reordering
    rcv = RecvConnection()
    for psn in (0, 2, 3, 5, 70):
        rcv.on_data(T0, psn, InPacket(wire.WRITE_MIDDLE, 1, PAYLOAD))
    cum, sack = rcv.ack_fields()
    assert (cum, sack) == (0, (1 << 2) | (1 << 3) | (1 << 5))  # PSN 70 is beyond the 64-bit bitmap
    assert snd.on_ack(T0 + MS, cum, sack, 0, False) == []
    assert snd.in_flight() == 71 - 4
    assert sorted(snd.unacked)[:4] == [1, 4, 6, 7]


def test_ack_fields_before_anything_arrived():
    cum, sack = RecvConnection().ack_fields()
    assert (cum & wire.PSN_MASK, sack) == (wire.PSN_MASK, 0)
    snd = _sender()
    snd.post(SentMessage(1, PAYLOAD, T0), "write")
    _send(snd, [0])
    assert snd.on_ack(T0 + MS, cum & wire.PSN_MASK, sack, 0, False) == [] and snd.in_flight() == 1


# -- the receiver ---------------------------------------------------------------------------------------------
def _arrive(rcv: RecvConnection, psns: list[int], retransmitted: frozenset = frozenset()) -> list[int]:
    """One single-packet message per PSN (message id = PSN); return the ids in delivery order."""
    out = []
    for t, psn in enumerate(psns):
        _, done = rcv.on_data(T0 + t, psn, InPacket(wire.WRITE_ONLY, psn, 10, psn in retransmitted))
        out += [d.msg_id for d in done]
    return out


def test_reorder_statistics_of_a_hand_made_arrival_order():
    rcv = RecvConnection()
    assert _arrive(rcv, [0, 4, 5, 6, 1, 2, 3, 7, 9, 8]) == list(range(10))
    assert rcv.stats["out_of_order"] == 4  # 1, 2, 3 (behind 6) and 8 (behind 9)
    assert rcv.reorder == {5: 1, 4: 1, 3: 1, 1: 1}
    assert rcv.reseq_max == 3  # 4, 5 and 6 waited for 1
    assert rcv.stats["packets"] == 10 and rcv.stats["duplicates"] == 0 and rcv.stats["retransmitted"] == 0


def test_retransmitted_packets_are_not_counted_as_reordered():
    rcv = RecvConnection()
    assert _arrive(rcv, [0, 2, 3, 1], retransmitted=frozenset({1})) == [0, 1, 2, 3]
    assert rcv.stats["out_of_order"] == 0 and not rcv.reorder
    assert rcv.stats["retransmitted"] == 1 and rcv.reseq_max == 2


def test_duplicates_are_reported_and_not_delivered_again():
    rcv = RecvConnection()
    assert _arrive(rcv, [0, 2, 2, 0, 1, 1]) == [0, 1, 2]
    assert rcv.stats["duplicates"] == 3 and rcv.stats["out_of_order"] == 1 and rcv.delivered_count == 3


def test_multi_packet_message_is_delivered_whole_when_its_last_packet_is_in():
    rcv = RecvConnection()
    ops = [wire.SEND_FIRST, wire.SEND_MIDDLE, wire.SEND_LAST, wire.WRITE_ONLY]
    arrivals = [(2, 5), (0, 10), (3, 1), (1, 20)]  # (psn, payload bytes)
    results = [rcv.on_data(T0 + t, psn, InPacket(ops[psn], 1 if psn < 3 else 2, size))
               for t, (psn, size) in enumerate(arrivals)]
    assert [done for _, done in results[:3]] == [[], [], []]
    done = results[3][1]
    assert [(d.msg_id, d.bytes, d.delivered_ns) for d in done] == [(1, 35, T0 + 3), (2, 1, T0 + 3)]


# -- entropy ------------------------------------------------------------------------------------------------
PORTS = range(wire.ENTROPY_BASE, wire.ENTROPY_BASE + wire.ENTROPY_SPAN)


def test_fixed_entropy_is_one_port():
    e = Entropy("fixed", random.Random(1))
    ports = {e.port(t * MS) for t in range(100)}
    assert len(ports) == 1 and ports <= set(PORTS)


def test_spray_steps_by_one_and_wraps_within_the_range():
    e = Entropy("spray", random.Random(2))
    ports = [e.port(0) for _ in range(wire.ENTROPY_SPAN + 2)]
    assert all(p in PORTS for p in ports)
    assert all((b - a) % wire.ENTROPY_SPAN == 1 for a, b in pairwise(ports))
    assert min(ports) == PORTS[0] and max(ports) == PORTS[-1]


def test_random_entropy_varies():
    e = Entropy("random", random.Random(3))
    ports = [e.port(0) for _ in range(200)]
    assert all(p in PORTS for p in ports) and len(set(ports)) > 150


def test_flowlet_changes_port_only_after_a_gap():
    e = Entropy("flowlet", random.Random(4), flowlet_gap_ns=20 * MS)
    now, seen = 0, []
    for _ in range(50):  # busy: never idle longer than the gap
        seen.append(e.port(now))
        now += 20 * MS
    assert len(set(seen)) == 1 and e.flowlets == 1
    now += 1  # idle for 20 ms + 1 ns
    changed = e.port(now)
    assert changed != seen[0] and changed in PORTS and e.flowlets == 2
    assert e.port(now + 5 * MS) == changed


def test_a_timeout_moves_fixed_and_flowlet_entropy_to_another_path():
    for mode in ("fixed", "flowlet"):
        e = Entropy(mode, random.Random(5))
        before = e.port(0)
        e.repath()
        after = e.port(0)
        assert after != before and after in PORTS and e.repaths == 1
    spray = Entropy("spray", random.Random(6))
    spray.repath()
    assert spray.repaths == 0  # it changes path with every packet anyway


def test_reps_reuses_fast_values_and_steps_on_past_slow_ones():
    e = Entropy("reps", random.Random(7))
    first = [e.port(0) for _ in range(4)]
    assert all((b - a) % wire.ENTROPY_SPAN == 1 for a, b in pairwise(first))  # nothing to reuse: spray's steps
    e.feedback(first[1], fast=True)
    e.feedback(first[2], fast=False)  # slow: dropped
    e.feedback(first[3], fast=True)
    assert [e.port(0), e.port(0)] == [first[1], first[3]] and e.reused == 2
    assert e.port(0) == first[3] + 1  # none left: on from where it explored last, not back over the slow one
    for mode in ("spray", "fixed"):
        other = Entropy(mode, random.Random(8))
        before = other.port(0)
        other.feedback(before + 7, fast=True)
        assert other.port(0) == (before + 1 if mode == "spray" else before)  # only reps takes feedback


def test_only_the_packet_an_ack_echoes_reports_its_path_and_by_its_own_round_trip():
    """The ACK of a packet that was held for a gap covers earlier ones too; their round trips include the wait, so
    only the echoed transmission's entropy gets feedback: fast within one packet time (0.15 ms here) of the least
    RTT seen, slow above it."""
    snd = _sender()
    e = Entropy("reps", random.Random(9))
    snd.post(SentMessage(1, 4 * PAYLOAD, T0), "write")
    sent = _send(snd, [0, 1 * MS, 2 * MS, 3 * MS])
    for pkt in sent:
        pkt.sport, pkt.entropy = e.port(pkt.tx_ns), e
    snd.on_ack(T0 + 10 * MS, 0, 0, T0, False)  # 10 ms: the least RTT so far, so fast
    snd.on_ack(T0 + 40 * MS, 2, 0, T0 + 2 * MS, False)  # covers PSN 1 (unechoed) too; 38 ms is slow
    snd.on_ack(T0 + 13 * MS + 100 * US, 3, 0, T0 + 3 * MS, False)  # 10.1 ms: fast
    assert list(e.recycled) == [sent[0].sport - wire.ENTROPY_BASE, sent[3].sport - wire.ENTROPY_BASE]
    snd.post(SentMessage(2, PAYLOAD, T0), "write")
    (late,) = _send(snd, [4 * MS])
    late.sport, late.entropy = e.port(late.tx_ns), e  # takes a recycled value
    snd.on_ack(T0 + 14 * MS + 300 * US, 4, 0, T0 + 4 * MS, False)  # 10.3 ms: a packet time and more, slow
    assert list(e.recycled) == [sent[3].sport - wire.ENTROPY_BASE]  # not taken back


def test_where_the_switches_mark_reps_recycles_the_unmarked_whatever_their_round_trip():
    """REPS's own signal: a path is good when its packet came back without an ECN mark (a round trip on the paper's
    fabric is mostly NVLink and a forwarder's NIC, which no entropy changes)."""
    snd = _sender()
    e = Entropy("reps", random.Random(9))
    snd.post(SentMessage(1, 3 * PAYLOAD, T0), "write")
    sent = _send(snd, [0, 1 * MS, 2 * MS])
    for pkt in sent:
        pkt.sport, pkt.entropy = e.port(pkt.tx_ns), e
    snd.on_ack(T0 + 10 * MS, 0, 0, T0, False, ce=False)
    snd.on_ack(T0 + 41 * MS, 1, 0, T0 + 1 * MS, False, ce=False)  # 40 ms, four times the least: still unmarked
    snd.on_ack(T0 + 12 * MS, 2, 0, T0 + 2 * MS, False, ce=True)  # the least round trip, but marked
    assert list(e.recycled) == [sent[0].sport - wire.ENTROPY_BASE, sent[1].sport - wire.ENTROPY_BASE]


def test_unknown_entropy_mode():
    with pytest.raises(ValueError, match="fixed"):
        Entropy("ecmp", random.Random(0))


# -- ordering: when a write or a send becomes visible --------------------------------------------------------

def _ordered_pair(ordering: str, window: int = 8, cc: str = "none", qp: int = 1) -> Pair:
    snd = SendConnection(qp, PLUGINS[cc](LINE, (PAYLOAD + wire.OVERHEAD + wire.ETH) * 8, window), PAYLOAD,
                         fence=ordering == "fence")
    return Pair(snd, RecvConnection(ordering))


def _write_then_flag(ordering: str) -> tuple[Pair, dict]:
    """A 3-packet write then a 1-packet send; the write's last packet (PSN 2) arrives 2 ms after the send."""
    pair = _ordered_pair(ordering)
    pair.post(0, 3 * PAYLOAD, "write")
    pair.post(1, PAYLOAD, "send")
    fates = [Fate(), Fate(), Fate(extra_ns=2 * MS)]  # the first datagrams are the data packets, one per GAP
    simulate({1: pair}, fates)
    return pair, {d.msg_id: d for d in pair.delivered}


def test_psn_ordering_shows_the_flag_after_its_data():
    pair, got = _write_then_flag("psn")
    assert [d.msg_id for d in pair.delivered] == [0, 1]
    assert pair.rcv.stats["violations"] == 0 and pair.rcv.stats["sends"] == 1
    assert got[1].delivered_ns == got[0].delivered_ns > got[1].arrived_ns  # the flag waited for the gap
    assert pair.rcv.reseq_max == 1  # the send sat in the resequence buffer behind PSN 2


def test_no_ordering_shows_the_flag_before_its_data_and_counts_the_violation():
    pair, got = _write_then_flag("none")
    assert [d.msg_id for d in pair.delivered] == [1, 0]
    assert pair.rcv.stats["violations"] == 1 and pair.rcv.stats["sends"] == 1
    assert got[1].delivered_ns == got[1].arrived_ns < got[0].delivered_ns
    assert pair.rcv.reseq_max == 1  # measured as in psn: what an in-order NIC would have held


def test_release_holds_the_flag_until_its_data_is_visible():
    pair, got = _write_then_flag("release")
    assert [d.msg_id for d in pair.delivered] == [0, 1]
    assert pair.rcv.stats["violations"] == 0
    assert got[1].delivered_ns == got[0].delivered_ns == got[0].arrived_ns  # the write on arrival, the flag waited
    assert got[1].arrived_ns < got[1].delivered_ns


def test_fence_sends_the_flag_only_after_its_data_is_acknowledged():
    pair, got = _write_then_flag("fence")
    write, flag = pair.posted
    assert flag.first_tx_ns >= write.acked_ns > 0
    assert flag.posted_ns == T0  # the wait counts in the flag's completion time
    assert pair.rcv.stats["violations"] == 0
    assert got[1].delivered_ns == got[1].arrived_ns > got[0].delivered_ns


def test_fence_holds_only_sends_and_only_behind_unacknowledged_messages():
    snd = _sender()
    snd.fence = True
    first, second, flag = SentMessage(1, 2 * PAYLOAD, T0), SentMessage(2, PAYLOAD, T0), SentMessage(3, 1, T0)
    snd.post(first, "write")
    snd.post(second, "write")
    snd.post(flag, "send")
    assert [p.msg_id for p in _send(snd, [0, 0, 0])] == [1, 1, 2]  # writes are not fenced
    assert not snd.has_work() and snd.next_packet(T0) is None  # window open, but the send waits
    snd.on_ack(T0 + MS, 1, 0, 0, False)  # the first write only
    assert not snd.has_work()
    assert snd.on_ack(T0 + MS, 2, 0, 0, False) == [second]
    assert snd.has_work() and snd.next_packet(T0 + MS).opcode == wire.SEND_ONLY
    assert flag.first_tx_ns == T0 + MS


def test_sends_in_a_row_under_release_become_visible_in_order():
    rcv = RecvConnection("release")
    ops = [wire.SEND_ONLY, wire.SEND_ONLY, wire.WRITE_ONLY, wire.SEND_ONLY]
    order = []
    for t, psn in enumerate([3, 2, 1, 0]):
        order += [d.msg_id for d in rcv.on_data(T0 + t, psn, InPacket(ops[psn], psn, 10))[1]]
    assert order == [2, 0, 1, 3]  # the write at once; the sends when everything before them is in
    assert rcv.stats["violations"] == 0 and rcv.stats["sends"] == 3


def test_unknown_ordering():
    with pytest.raises(ValueError, match="release"):
        RecvConnection("loose")


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 6 * PAYLOAD), min_size=2, max_size=6),
       ops=st.lists(st.sampled_from(["write", "send"]), min_size=6, max_size=6),
       window=st.integers(1, 8), start=st.sampled_from([0, wire.PSN_MASK - 3]), fates=fates())
def test_orderings_deliver_once_and_only_none_violates(sizes, ops, window, start, fates):
    runs = {}
    for ordering in ORDERINGS:
        pair = runs[ordering] = _ordered_pair(ordering, window)
        _start_at(pair.snd, pair.rcv, start)
        for i, size in enumerate(sizes):
            pair.post(i, size, ops[i])
        simulate({1: pair}, fates)
        assert sorted((d.msg_id, d.bytes) for d in pair.delivered) == [(m.id, m.bytes) for m in pair.posted]
        assert [m.id for m in pair.completed] == list(range(len(sizes)))
        assert not pair.rcv.buffer and not pair.rcv.messages
        assert pair.rcv.stats["sends"] == ops[:len(sizes)].count("send")
        assert all(d.first_rx_ns <= d.arrived_ns <= d.delivered_ns for d in pair.delivered)
        rank = {d.msg_id: n for n, d in enumerate(pair.delivered)}  # visibility order
        late_flags = sum(any(rank[j] > rank[i] for j in range(i)) for i in range(len(sizes)) if ops[i] == "send")
        if ordering != "none":
            assert pair.rcv.stats["violations"] == late_flags == 0
        else:
            assert pair.rcv.stats["violations"] == late_flags
    for ordering in ("none", "release"):  # the same packets on the wire: the same arrival-order statistics
        assert runs[ordering].rcv.stats["out_of_order"] == runs["psn"].rcv.stats["out_of_order"]
        assert runs[ordering].rcv.reorder == runs["psn"].rcv.reorder
        assert runs[ordering].rcv.reseq_max == runs["psn"].rcv.reseq_max


def test_summarise_reports_ordering_cost():
    from emulator.model.schedule import Message
    from emulator.run.launch import summarise
    from traffic.contract import CpuTimes, Delivery, HostResult, OrderingCounts, Rx, Sent, Tx
    from traffic.options import TransportOptions

    messages = [Message(0, 0.0, "a", "b", 300), Message(1, 0.0, "a", "b", 64, op="send")]

    def quiet(host: str, **measured) -> HostResult:
        return HostResult(host, T0, rx=Rx(packets=4, out_of_order=1, reorder_distance={"1": 1}, resequence_max=1),
                          tx=Tx(data_packets=4), cpu_s=0.1, timer_lateness_us={"count": 0},
                          traffic_cpu_s=CpuTimes(0.05, 0.03, 0.08), **measured)
    results = {
        "a": quiet("a", sent={"0": Sent(T0, T0 + 10 * US, T0 + 5 * MS), "1": Sent(T0, T0 + 5 * MS, T0 + 9 * MS)},
                   ordering=OrderingCounts("fence", 0, 0)),
        "b": quiet("b", received={"0": Delivery(T0 + 4 * MS, T0 + 4 * MS, 300, 0, arrived_ns=T0 + 4 * MS),
                                  "1": Delivery(T0 + 8 * MS, T0 + 7 * MS, 64, 0, arrived_ns=T0 + 7 * MS)},
                   ordering=OrderingCounts("fence", 2, 1))}
    summary = summarise(messages, results, T0, TransportOptions(ordering="fence"))
    m = summary.to_dict()  # as traffic.json has it
    o = m["ordering"]
    assert (o["mode"], o["violations"], o["sends"]) == ("fence", 2, 1)
    assert o["flag_wait_us"]["count"] == 1 and o["flag_wait_us"]["max"] == 1000.0
    assert o["fence_wait_us"]["count"] == 1 and o["fence_wait_us"]["max"] == 5000.0
    assert m["lost_messages"] == 0 and m["reordering"]["out_of_order"] == 2 and len(summary.messages) == 2


def test_coalesced_acks_come_every_nth_packet_and_at_once_when_urgent():
    rcv = RecvConnection(ack_every=3)
    acks = [rcv.ack_now(T0 + i, T0 + i, urgent=False) for i in range(7) if not rcv.on_data(T0, i, InPacket(
        wire.WRITE_MIDDLE, 1, PAYLOAD))[0]]
    assert acks == [False, False, True, False, False, True, False]
    assert rcv.held == 1 and rcv.held_since_ns == T0 + 6 and rcv.flush() == T0 + 6 and rcv.held == 0
    rcv.on_data(T0, 7, InPacket(wire.WRITE_LAST, 1, PAYLOAD))
    assert rcv.ack_now(T0, T0, urgent=True)  # a message's last packet
    rcv.on_data(T0, 9, InPacket(wire.WRITE_ONLY, 2, PAYLOAD))  # PSN 8 is missing
    assert rcv.ack_now(T0, T0, urgent=False)  # the sender's loss detection needs the selective acks now


def test_coalescing_sends_fewer_acks_for_the_same_deliveries():
    sent = {}
    for every in (1, 4):
        pair = Pair(_sender(16), RecvConnection(ack_every=every))
        for i in range(3):
            pair.post(i, 20 * PAYLOAD)
        sent[every] = Counter()
        simulate({1: pair}, sent=sent[every])
        assert_exactly_once_in_order(pair)
    assert sent[1]["data"] == sent[4]["data"] == 60 and sent[1]["ack"] == 60
    assert 15 <= sent[4]["ack"] <= 20  # every 4th, and each message's last


# -- receiver-driven (cc pull) ------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.lists(st.integers(1, 8 * PAYLOAD), min_size=1, max_size=3), min_size=1, max_size=3),
       window=st.integers(1, 8), unscheduled=st.integers(0, 2), per_qp=st.integers(1, 3), fates=fates())
def test_pulled_queue_pairs_deliver_exactly_once_in_order_under_any_network(sizes, window, unscheduled, per_qp,
                                                                            fates):
    """Requests, grants, data and ACKs all dropped, duplicated or delayed: every message still arrives once, and
    no queue pair sends more than it was granted beyond its unscheduled packets."""
    granter = Granter(GAP, per_qp=per_qp, ttl_ns=4 * GAP + 2 * DELAY)
    pairs = {}
    for qp, qp_sizes in enumerate(sizes, start=1):
        pair = pairs[qp] = Pair(SendConnection(qp, PLUGINS["pull"](LINE, (PAYLOAD + wire.OVERHEAD + wire.ETH) * 8,
                                                                   window), PAYLOAD))
        pair.snd.pulled(unscheduled)
        for i, size in enumerate(qp_sizes):
            pair.post(100 * qp + i, size)
    simulate(pairs, fates, granter=granter)
    for qp, pair in pairs.items():
        assert_exactly_once_in_order(pair)
        pulled = granter.qps.get(("s", qp))
        assert pair.snd.sends <= unscheduled + (pulled.granted if pulled else 0)


def test_a_pulled_sender_sends_nothing_unasked_beyond_its_unscheduled_packets():
    snd = SendConnection(1, PLUGINS["pull"](LINE, 8 * 1000, 8), PAYLOAD)
    snd.pulled(1)
    snd.post(SentMessage(0, 5 * PAYLOAD, T0), "write")
    assert snd.next_packet(T0) is not None and snd.next_packet(T0 + 1) is None  # one unscheduled, then it waits
    assert not snd.has_work()
    assert snd.ask(T0) == 4 and snd.ask(T0 + 1) == 0  # asks for the other four once
    assert snd.ask(T0 + snd.rto, again=True) == 4  # unanswered for an RTO: asks again
    snd.grant(2)
    assert [snd.next_packet(T0 + 2) is not None for _ in range(3)] == [True, True, False]
    snd.grant(1)  # an older, smaller grant changes nothing
    assert snd.credit == 3
    snd.grant(4)
    assert snd.ask_again_ns == math.inf and snd.ask(T0 + 3) == 0  # everything it needs is granted


def test_a_lost_grant_after_a_spurious_loss_does_not_stall_the_next_loss():
    """Measured on the asymmetric leaf-spine: a timeout marks a packet lost, the sender asks for one more, that
    grant is lost, the packet's ACK comes after all; a later real loss must be asked for anew, not taken as asked
    (before, the queue pair waited for a grant that would never come and its message was lost)."""
    snd = SendConnection(1, PLUGINS["pull"](LINE, 8 * 1000, 8), PAYLOAD)
    snd.pulled(0)
    snd.post(SentMessage(0, 2 * PAYLOAD, T0), "write")
    assert snd.ask(T0) == 2
    snd.grant(2)
    assert snd.next_packet(T0) is not None and snd.next_packet(T0) is not None
    snd.on_ack(T0 + MS, 0, 0, 0, False)  # PSN 0
    assert snd.check_timeout(T0 + snd.rto + 1)  # PSN 1 taken for lost
    assert snd.ask(T0 + snd.rto + 1) == 3  # its grant never arrives
    snd.on_ack(T0 + snd.rto + 2, 1, 0, 0, False)  # PSN 1 was only late
    assert snd.ask(T0 + snd.rto + 2) == 0
    snd.post(SentMessage(1, PAYLOAD, T0), "write")  # one more packet needs a grant
    assert snd.ask(T0 + snd.rto + 3) == 3


def test_the_granter_paces_grants_at_the_link_rate_in_turn():
    g = Granter(packet_ns=1000, per_qp=2)
    assert g.request(("a", 1), 3) == 0 and g.request(("b", 1), 3) == 0
    times, order = [], []
    now = 0
    while len(order) < 4:
        for key, total in g.grant(now):
            times.append(now)
            order.append((key, total))
        now = int(g.due_ns())
    assert order == [(("a", 1), 1), (("b", 1), 1), (("a", 1), 2), (("b", 1), 2)]  # one each, in turn
    assert times == [0, 1000, 2000, 3000]  # one packet time apart
    # both have two granted that have not arrived: capped until they do, or the ttl (4 packet times) gives up
    assert g.due_ns() > times[-1] + 2000


def test_the_granter_never_has_more_outstanding_than_its_limit_and_forgives_losses():
    g = Granter(packet_ns=1000, per_qp=2, ttl_ns=10_000)
    g.request(("a", 1), 10)
    assert [t for _, t in g.grant(0) + g.grant(1000) + g.grant(2000)] == [1, 2]  # the third waits: 2 outstanding
    g.arrived(("a", 1), 2500)
    assert [t for _, t in g.grant(3000)] == [3]
    assert g.grant(4000) == [] and g.due_ns() == 3000 + 10_000 + 1  # capped: nothing arrives (lost)
    # the ttl gave the grants up; the idle link lends one packet time, as the agents' egress does: two at once
    assert [t for _, t in g.grant(13_001)] == [4, 5] and g.stats["forgiven"] == 1
    assert g.request(("a", 1), 10) == 5  # a repeated request is answered with the total so far


def test_the_granter_grants_at_most_its_limit_in_all():
    g = Granter(packet_ns=1000, per_qp=2, ttl_ns=10_000, limit=3)
    for qp in range(3):
        g.request(("h", qp), 5)
    granted = [total for now in range(0, 6000, 1000) for _, total in g.grant(now)]
    assert len(granted) == 3 and g.outstanding == 3  # one each, then the limit: the queue holds no more
    g.arrived(("h", 0), 6500)
    assert len(g.grant(7000)) == 1


def test_a_lone_sender_gets_the_whole_limit_and_many_get_one_each():
    lone = Granter(packet_ns=1000, limit=6, ttl_ns=1e9)
    lone.request(("a", 1), 100)
    assert len([g for now in range(0, 10_000, 1000) for g in lone.grant(now)]) == 6
    many = Granter(packet_ns=1000, limit=6, ttl_ns=1e9)
    for qp in range(15):
        many.request(("h", qp), 100)
    granted = [key for now in range(0, 10_000, 1000) for key, _ in many.grant(now)]
    assert len(granted) == 6 and len(set(granted)) == 6  # six senders, one outstanding grant each


def test_a_repeated_request_is_answered_only_while_a_grant_may_be_lost():
    g = Granter(packet_ns=1000, per_qp=1, ttl_ns=1e9)
    assert g.request(("a", 1), 3) == 0  # nothing granted yet
    g.grant(0)
    assert g.request(("a", 1), 3) == 1  # granted, its packet not come: the grant may be lost, say it again
    g.arrived(("a", 1), 500)
    assert g.request(("a", 1), 3) == 0  # everything granted came and more will be: it only waits its turn
    for now in (1000, 2000):
        g.grant(now)
        g.arrived(("a", 1), now + 500)
    assert g.request(("a", 1), 3) == 3  # granted all it wanted, yet it asks: a grant was lost after all


def test_the_grant_ttl_is_learnt_from_the_delay_until_a_granted_packet_comes():
    """Across planes a granted packet waits at a node-mate's NIC: the ttl follows the delays measured (RFC 6298's
    estimator) instead of forgiving grants whose packets are only late; it never falls below the model's."""
    g = Granter(packet_ns=1000, per_qp=1, ttl_ns=10_000)
    g.request(("a", 1), 100)
    now = 0
    for _ in range(20):  # each packet comes 30 packet times after its grant: three times the model's ttl
        assert [t for _, t in g.grant(now)]
        now += 30_000
        g.arrived(("a", 1), now)
    assert 30_000 < g.ttl_ns < 40_000 and g.stats["forgiven"] == 0
    fast = Granter(packet_ns=1000, per_qp=1, ttl_ns=10_000)
    fast.request(("a", 1), 100)
    for now in range(0, 40_000, 2000):  # packets come 1 packet time after their grants
        fast.grant(now)
        fast.arrived(("a", 1), now + 1000)
    assert fast.ttl_ns == 10_000  # the model's figure is the floor


def test_a_forgiven_grant_gives_no_delay_sample():
    g = Granter(packet_ns=1000, per_qp=1, ttl_ns=5000)
    g.request(("a", 1), 10)
    g.grant(0)
    g.grant(6000)  # capped for the ttl: forgiven, then granted again
    assert g.stats["forgiven"] == 1
    g.arrived(("a", 1), 7000)  # the second grant's packet (or the first's, late): one sample of 1000 ns
    assert g.delay_ns == 1000 and g.ttl_ns == 5000


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.sampled_from(["request", "arrive", "grant"]), st.integers(0, 2),
                                 st.integers(0, 20)), max_size=60))
def test_the_granter_outstanding_limit_holds_under_any_sequence(events):
    g = Granter(packet_ns=1000, per_qp=2, ttl_ns=5000, limit=4)
    now = 0
    for kind, qp, n in events:
        now += 700
        key = ("h", qp)
        if kind == "request":
            g.request(key, n)
        elif kind == "arrive":
            g.arrived(key, now)
        else:
            g.grant(now)
        for p in g.qps.values():
            assert 0 <= p.arrived <= p.granted <= max(p.wanted, 0) and p.granted - p.arrived <= g.per_qp
        assert g.outstanding == sum(p.granted - p.arrived for p in g.qps.values()) <= g.limit


def test_a_request_no_grant_answers_is_asked_again_ever_later_until_a_grant_comes():
    """cc pull in a 64-GPU all-to-all: a receiver serves 56 queue pairs in turn, so a queue pair may wait several
    RTOs for its turn; asking again every RTO made 4 requests (and 4 replies) per data packet."""
    snd = SendConnection(1, PLUGINS["pull"](LINE, 8 * 1000, 8), PAYLOAD)
    snd.pulled(0)
    snd.post(SentMessage(0, 5 * PAYLOAD, T0), "write")
    assert snd.ask(T0) == 5
    now, gaps = T0, []
    for _ in range(4):  # unanswered: each repeat waits twice as long as the one before
        due = snd.ask_again_ns
        assert snd.ask(int(due) - 1, again=True) == 0
        assert snd.ask(int(due), again=True) == 5
        gaps.append(int(due) - now)
        now = int(due)
    assert gaps == [snd.rto, snd.rto, 2 * snd.rto, 4 * snd.rto]
    snd.grant(1, now + 1)  # the receiver had the request: the next repeat is one RTO after this grant
    assert snd.ask_again_ns == now + 1 + snd.rto and snd.ask_backoff == 1
    assert snd.stats["repeated_requests"] == 4


def test_a_queue_pair_whose_turns_are_long_asks_again_after_two_turns_not_every_rto():
    """A receiver serving 127 queue pairs at a quarter of its rate (the 128-GPU 8-plane all-to-all) grants each
    one packet every 18 s at 2 Mbit/s: asking again every RTO meanwhile made 2.8 requests per data packet."""
    snd = SendConnection(1, PLUGINS["pull"](LINE, 8 * 1000, 8), PAYLOAD)
    snd.pulled(0)
    snd.post(SentMessage(0, 20 * PAYLOAD, T0), "write")
    assert snd.ask(T0) == 20
    turn = 10 * snd.rto
    for k in range(1, 6):  # one grant a turn, each sent on at once
        snd.grant(k, T0 + k * turn)
        assert snd.next_packet(T0 + k * turn) is not None
    assert snd.turn_ns == turn
    now = T0 + 5 * turn
    assert snd.ask(now + 1, again=True) == 0
    assert snd.ask_again_ns == now + 2 * turn  # a lost request is still asked again, two turns on
    assert snd.ask(int(snd.ask_again_ns), again=True) == 20 and snd.stats["repeated_requests"] == 1


def test_a_resend_after_a_timeout_is_judged_lost_or_spurious_by_its_ack():
    """The resend's ACK says duplicate when the original had arrived (the RTO fired for a packet that was only
    late), and not when the resend was the first copy in (the original was lost)."""
    snd = SendConnection(1, PLUGINS["none"](LINE, 8 * 1000, 8), PAYLOAD)
    snd.post(SentMessage(0, 2 * PAYLOAD, T0), "write")
    first, second = snd.next_packet(T0), snd.next_packet(T0)
    assert first is not None and second is not None
    late = T0 + snd.rto + 1
    assert snd.check_timeout(late)
    resends = [snd.next_packet(late + 1), snd.next_packet(late + 2)]
    assert [p.psn for p in resends if p] == [0, 1]
    snd.on_ack(late + 3, 0, 0, T0, False)  # PSN 0's original arrived (its ACK echoes the first send) ...
    snd.on_ack(late + 4, 0, 0, late + 1, True)  # ... so its resend was a duplicate: spurious
    snd.on_ack(late + 5, 1, 0, late + 2, False)  # PSN 1's resend was the first copy in: lost
    assert snd.stats["timeout_spurious"] == 1 and snd.stats["timeout_lost"] == 1
    assert not snd.timeout_resends
