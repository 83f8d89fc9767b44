"""The agent's sending side without sockets or root: an Agent whose datagrams are recorded instead of sent, stepped
on a made-up clock at the wake-up times it asks for. Pacing at the link rate, turns between queue pairs sharing a
link, the window, and lanes for the NIC and the NVLink of one GPU."""

from __future__ import annotations

import math
import signal

import pytest

from emulator.model import schedule, wire
from emulator.model.schedule import Message
from traffic.contract import AgentConfig, Egress, HostInfo
from traffic.options import TransportOptions
from traffic.rdma import Agent

T0 = 10 ** 12
MTU = 9000
LINE_NS = (MTU + wire.ETH) * 8  # one full packet at 1 Gbit/s, in ns


class Recording(Agent):
    """Datagrams go to a list (the socket layer is not what these tests are about)."""

    def transmit(self, tclass: int, buf: bytearray, length: int, ip: str) -> None:
        self.wire.append((self.clock, ip, wire.Parsed(bytes(buf[wire.UDP_HDR.size:length])), length))


def _line_ns(length: int) -> float:
    """A datagram's time on a 1 Gbit/s link, with the IP and Ethernet headers the shaper counts."""
    return (length + 20 + wire.ETH) * 8


def _config(tmp_path, hosts: dict[str, HostInfo], options: TransportOptions, queue_bytes: int = 0,
            ecn: bool = False) -> AgentConfig:
    return AgentConfig(str(tmp_path), str(tmp_path / "schedule.jsonl"), hosts, options, seed=1, deadline_s=10,
                       ready_timeout_s=1, mtu=MTU, queue_bytes=queue_bytes, ecn=ecn)


def _agent(tmp_path, messages: list[Message], window: int = 63, nvlink: bool = False,
           kind: type[Recording] = Recording, queue_bytes: int = 0, cc: str = "none",
           wake_slack: float = 0.1, entropy: str = "fixed", ecn: bool = False, host: str = "a") -> Recording:
    schedule.write(tmp_path / "schedule.jsonl", messages)
    hosts = {h: HostInfo(f"10.0.0.{i + 1}", Egress(1e9, 4e9 if nvlink else None), 0 if nvlink else None, 0)
             for i, h in enumerate(("a", "b", "c"))}
    options = TransportOptions(window=window, cc=cc, wake_slack=wake_slack, entropy=entropy)
    agent = kind(_config(tmp_path, hosts, options, queue_bytes, ecn), host)
    agent.wire, agent.ports, agent.clock = [], [], T0
    agent.start(T0)
    return agent


def _run(agent: Recording, until_ns: float) -> list[int]:
    """Step at every wake-up the agent asks for, until `until_ns`; the wake-up times."""
    wakes = []
    when = T0
    while when <= until_ns:
        agent.clock = int(when)
        wakes.append(agent.clock)
        when = agent.step(agent.clock, readable=False)
    return wakes


def test_a_queue_pair_sends_back_to_back_at_the_link_rate(tmp_path):
    size = 20 * wire.payload_per_packet(MTU)
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", size)])
    _run(agent, T0 + 25 * LINE_NS)
    assert len(agent.wire) == 20  # all of it, no ACK needed within the window
    # each packet leaves when the one before it is on the wire (an idle link lends one packet time: a pair of
    # packets may leave together once)
    late = [round(b[0] - a[0] - _line_ns(a[3])) for a, b in zip(agent.wire, agent.wire[1:], strict=False)]
    early = [i for i, d in enumerate(late) if d < -1]
    assert len(early) <= 1 and all(-1 <= d <= 1 for i, d in enumerate(late) if i not in early), late


def test_a_sender_stepped_within_its_slack_sends_early_without_raising_its_rate(tmp_path):
    size = 20 * wire.payload_per_packet(MTU)
    for slack, early_by in ((0.1, 0.05), (0.0, 0.05)):
        agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", size)], wake_slack=slack)
        when, steps = T0, 0
        while len(agent.wire) < 20 and steps < 200:  # stepped a little before each time it asks for
            agent.clock = int(when)
            asked = agent.step(agent.clock, readable=False)
            when = max(asked - early_by * LINE_NS, agent.clock + 1)
            steps += 1
        times = [t for t, *_ in agent.wire]
        if slack:
            assert len(times) == 20 and steps <= 21  # one step a packet: each sent at its early step
            # the idle link lends one packet time (the first two leave together), then one packet time apart:
            # early once by less than the slack, never again by more, so the rate stays the link's
            assert times[1] == times[0] and 0 < times[1] + _line_ns(agent.wire[1][3]) - times[2] <= slack * LINE_NS
            gaps = [b[0] - a[0] - _line_ns(a[3]) for a, b in zip(agent.wire[2:], agent.wire[3:], strict=False)]
            assert all(-1 <= gap <= 1 for gap in gaps), gaps
        else:
            assert steps >= 2 * len(times) - 2  # without a slack an early step sends nothing: it takes two


def test_queue_pairs_sharing_the_nic_take_turns(tmp_path):
    size = 6 * wire.payload_per_packet(MTU)
    agent = _agent(tmp_path, [Message(q, 0.0, "a", "b" if q % 2 else "c", size, qp=q + 1) for q in range(3)])
    _run(agent, T0 + 30 * LINE_NS)
    qps = [(ip, p.dqpn) for _, ip, p, _ in agent.wire]
    assert len(qps) == 18
    assert all(len(set(qps[i:i + 3])) == 3 for i in range(0, 18, 3)), qps  # one packet each, in turn
    times = [t for t, *_ in agent.wire]
    assert times[-1] - times[0] <= 18 * LINE_NS  # the NIC never idles while one has work


def test_the_window_holds_a_queue_pair_until_acknowledged(tmp_path):
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", 10 * wire.payload_per_packet(MTU))], window=2)
    wakes = _run(agent, T0 + 40 * LINE_NS)
    assert len(agent.wire) == 2
    # both leave at once (the idle link lends a packet time), then it sleeps until an ACK or its retransmission
    # timer: no wake-up that sends nothing
    assert wakes == [T0] and [t for t, *_ in agent.wire] == [T0, T0]


def test_an_acknowledged_queue_pair_leaves_no_timer_to_wake_for(tmp_path):
    """Once everything in flight is acknowledged, the retransmission timer set at the send does not wake the host."""
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", 100)])
    assert _run(agent, T0) == [T0] and len(agent.wire) == 1
    assert agent.next_wake() < T0 + 10 ** 9  # the retransmission timer
    buf = bytearray(128)
    n = wire.pack_ack(buf, wire.ENTROPY_BASE, 1, 0, 1, T0, T0 + 10 ** 6, 0, 0, 0)
    agent.on_ack(T0 + 10 ** 6, T0 + 10 ** 6, "10.0.0.2", wire.Parsed(bytes(buf[wire.UDP_HDR.size:n])))
    assert agent.plan.finished() and agent.next_wake() == math.inf


def test_a_marked_packet_is_echoed_to_reps_on_a_marking_fabric_and_only_cc_ecn_answers_with_a_cnp(tmp_path):
    """REPS's signal is the mark: where the switches mark, a reps agent sends ECN-capable packets and echoes a CE
    mark in the ACK; the rate-cutting notification (CNP) stays cc ecn's."""
    buf = bytearray(MTU)
    for cc, entropy, ecn, ect, cnp in (("none", "reps", True, True, False), ("ecn", "spray", True, True, True),
                                       ("none", "reps", False, False, False), ("none", "spray", True, False, False)):
        agent = _agent(tmp_path, [Message(0, 0.0, "b", "a", 100)], cc=cc, entropy=entropy, ecn=ecn)
        assert agent.ect == ect
        n = wire.pack_data(buf, wire.ENTROPY_BASE + 5, wire.WRITE_ONLY, 1, 0, 0, T0, 0, 0, 100, 100)
        agent.on_data(T0, T0, ("10.0.0.2", wire.ENTROPY_BASE + 5), wire.Parsed(bytes(buf[wire.UDP_HDR.size:n])),
                      ce=ect)
        sent = [p for _, _, p, _ in agent.wire]
        assert [bool(p.flags & wire.FLAG_CE) for p in sent if p.opcode == wire.ACK] == [ect]
        assert any(p.opcode == wire.CNP for p in sent) == cnp


def test_nvlink_and_nic_are_separate_lanes(tmp_path):
    """A GPU's queue pairs to its node's GPU (NVLink, 4x the NIC rate) do not wait for the NIC's."""
    size = 8 * wire.payload_per_packet(MTU)
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", size, qp=1), Message(1, 0.0, "a", "c", size, qp=2)],
                   nvlink=True)
    agent.cfg.hosts["c"].node = 1  # c is on another node: its queue pair leaves by the NIC
    _run(agent, T0 + 9 * LINE_NS)
    by_peer = {ip: [t for t, i, *_ in agent.wire if i == ip] for ip in ("10.0.0.2", "10.0.0.3")}
    assert len(by_peer["10.0.0.3"]) == 8  # the NIC at its own rate
    assert len(by_peer["10.0.0.2"]) == 8 and by_peer["10.0.0.2"][-1] - T0 < 3 * LINE_NS  # NVLink much faster


class Ports(Recording):
    """Also records each datagram's UDP source port (its entropy: the path ECMP hashes)."""

    def transmit(self, tclass: int, buf: bytearray, length: int, ip: str) -> None:
        super().transmit(tclass, buf, length, ip)
        self.ports.append(wire.UDP_HDR.unpack_from(buf)[0])


def test_a_retransmission_after_a_timeout_takes_another_path(tmp_path):
    """Fixed entropy keeps one source port, until a retransmission timeout: the resend leaves by another."""
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", 3 * wire.payload_per_packet(MTU))], window=3, kind=Ports)
    _run(agent, T0 + 2 * 10 ** 9)  # no ACK ever comes: the first RTO (500 ms) fires, then the backed-off one
    assert len(set(agent.ports[:3])) == 1  # one path while nothing was lost
    assert agent.ports[3] != agent.ports[0] and agent.result()["tx"].repaths >= 1


def test_a_pulled_queue_pair_sends_its_unscheduled_share_then_asks(tmp_path):
    """cc pull: two queue pairs send to b, so each may send half of b's queue unasked (two packets of four), asks
    for the rest, and sends more only as grants come."""
    packet = MTU + wire.ETH
    size = 6 * wire.payload_per_packet(MTU)
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", size), Message(1, 0.0, "c", "b", size)], window=8,
                   queue_bytes=4 * packet, cc="pull")
    _run(agent, T0 + 20 * LINE_NS)
    data = [p for _, _, p, _ in agent.wire if p.opcode in wire.DATA_OPS]
    requests = [p for _, _, p, _ in agent.wire if p.opcode == wire.PULL_REQUEST]
    assert len(data) == 2 and [r.count for r in requests] == [4]  # 6 packets: 2 unasked, 4 asked for
    buf = bytearray(128)
    n = wire.pack_pull(buf, wire.ENTROPY_BASE, 1, 3, T0, 0, wire.PULL_GRANT)
    agent.on_grant(0, "10.0.0.2", wire.Parsed(bytes(buf[wire.UDP_HDR.size:n])))
    _run(agent, T0 + 40 * LINE_NS)
    assert len([p for _, _, p, _ in agent.wire if p.opcode in wire.DATA_OPS]) == 2 + 3  # three granted


def test_pull_requests_and_grants_step_their_source_port_when_the_data_is_sprayed(tmp_path):
    """Control packets to one address follow the data's entropy: pinned to one path with fixed entropy, a new port
    for each with sprayed entropy (so that no pair's grants all wait behind the same slow link)."""
    size = 8 * wire.payload_per_packet(MTU)
    messages = [Message(qp, 0.0, "a", "b", size, qp=qp) for qp in (1, 2, 3)]
    for entropy, distinct in (("fixed", 1), ("spray", 3), ("reps", 3)):
        agent = _agent(tmp_path, messages, window=8, queue_bytes=4 * (MTU + wire.ETH), cc="pull",
                       entropy=entropy, kind=Ports)
        _run(agent, T0 + 10 * LINE_NS)
        requests = [port for (_, _, p, _), port in zip(agent.wire, agent.ports, strict=True)
                    if p.opcode == wire.PULL_REQUEST]
        assert len(requests) == 3 and len(set(requests)) == distinct, (entropy, requests)


def test_pulled_queue_pairs_first_requests_leave_one_per_packet_time(tmp_path):
    """cc pull: a host's first requests share one slot per packet time of its NIC, the pace its data would go (the
    128-GPU all-to-all posted 16 k requests at once, more than the switch daemons took in)."""
    size = 8 * wire.payload_per_packet(MTU)
    messages = [Message(i, 0.0, "a", dst, size, qp=1 + i // 2) for i, dst in enumerate("bcbcbc")]
    agent = _agent(tmp_path, messages, window=8, queue_bytes=0, cc="pull")
    _run(agent, T0 + 10 * LINE_NS)
    times = [t for t, _, p, _ in agent.wire if p.opcode == wire.PULL_REQUEST]
    assert len(times) == 6 and times[0] == T0
    slot = (MTU + wire.ETH) * 8  # ns at 1 Gbit/s
    assert [round((t - T0) / slot) for t in times] == [0, 1, 2, 3, 4, 5]


def test_pull_paces_what_crosses_a_nic_and_leaves_nvlink_alone(tmp_path):
    """cc pull: a receiver's grants share out its NIC, so a queue pair to a GPU of the same node (NVLink only)
    is not pulled and does not count in its receiver's fan-in."""
    size = 4 * wire.payload_per_packet(MTU)
    messages = [Message(0, 0.0, "a", "b", size), Message(1, 0.0, "a", "c", 3 * size),  # c: 8 unasked, 4 asked
                Message(2, 0.0, "b", "a", size), Message(3, 0.0, "c", "a", size)]
    schedule.write(tmp_path / "schedule.jsonl", messages)
    hosts = {h: HostInfo(f"10.0.0.{i + 1}", Egress(1e9, 4e9), node, 0)
             for i, (h, node) in enumerate((("a", 0), ("b", 0), ("c", 1)))}
    agent = Recording(_config(tmp_path, hosts, TransportOptions(window=8, cc="pull"), 16 * (MTU + wire.ETH)), "a")
    agent.wire, agent.ports, agent.clock = [], [], T0
    agent.start(T0)
    _run(agent, T0 + 10 * LINE_NS)
    assert agent.fan_in["a"] == 1 and agent.fan_in["c"] == 1  # b's queue pair to a stays inside the node
    assert not agent.send_conns[("b", 1)].is_pulled and agent.send_conns[("c", 1)].is_pulled
    requests = {ip for _, ip, p, _ in agent.wire if p.opcode == wire.PULL_REQUEST}
    to_b = [p for _, ip, p, _ in agent.wire if ip == "10.0.0.2"]
    assert requests == {"10.0.0.3"} and len(to_b) == 4  # b's four packets went unasked


def test_a_cc_timer_within_the_slack_waits_for_its_time(tmp_path):
    """A timer entry whose CC timer is not due at `now` is set again for its time: stepped inside the slack, the
    agent hands that time back instead of taking the entry again and again (it hung there once)."""
    agent = _agent(tmp_path, [Message(0, 0.0, "a", "b", 50 * wire.payload_per_packet(MTU))], cc="ecn")
    _run(agent, T0 + 3 * LINE_NS)
    key, conn = next(iter(agent.send_conns.items()))
    conn.cc.on_cnp(agent.clock)  # DCQCN's timers start: the next one in ten packet times
    agent.arm(key, conn)
    tick = conn.cc.next_tick_ns()
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("the step did not return"))
    signal.alarm(5)
    try:
        agent.clock = int(tick - 0.05 * LINE_NS)
        when = agent.step(agent.clock, readable=False)
    finally:
        signal.alarm(0)
    assert when <= tick and conn.cc.next_tick_ns() == tick  # not ticked early: asked to be woken for it
    agent.clock = int(tick)
    agent.step(agent.clock, readable=False)
    assert conn.cc.next_tick_ns() > tick


class ByClass(Recording):
    """Datagrams recorded with the traffic class they were sent in."""

    def transmit(self, tclass: int, buf: bytearray, length: int, ip: str) -> None:
        self.wire.append((tclass, ip, wire.Parsed(bytes(buf[wire.UDP_HDR.size:length]))))


@pytest.mark.parametrize("cc", ["none", "pull"])
def test_a_queue_pair_answers_in_its_own_traffic_class(tmp_path, cc):
    """b acknowledges (and grants, under pull) a's class-3 queue pair in class 3 and c's in class 0, as RoCE's
    responder answers in the queue pair's class: in class 0 a victim's ACKs would wait behind the traffic its own
    class was to keep it from (switch ports queueing per class)."""
    size = 100 * MTU
    messages = [Message(0, 0.0, "a", "b", size, tclass=3, qp=1), Message(1, 0.0, "c", "b", size, qp=1)]
    agent = _agent(tmp_path, messages, kind=ByClass, cc=cc, host="b")
    buf = bytearray(MTU)
    peers = (("a", "10.0.0.1"), ("c", "10.0.0.3"))
    if cc == "pull":
        for _, ip in peers:
            n = wire.pack_pull(buf, wire.ENTROPY_BASE, 1, 100, T0, 0, wire.PULL_REQUEST)
            agent.on_request(T0, ip, wire.Parsed(bytes(buf[wire.UDP_HDR.size:n])))
        _run(agent, T0 + 4 * LINE_NS)
    for i, (_, ip) in enumerate(peers):
        n = wire.pack_data(buf, wire.ENTROPY_BASE, wire.WRITE_FIRST, 1, 0, i, T0, 0, 0, 1000, dma_len=size)
        agent.on_data(T0, T0, (ip, wire.ENTROPY_BASE), wire.Parsed(bytes(buf[wire.UDP_HDR.size:n])), False)
    answers = {(ip, pkt.opcode): tclass for tclass, ip, pkt in agent.wire}
    assert answers[("10.0.0.1", wire.ACK)] == 3 and answers[("10.0.0.3", wire.ACK)] == 0
    if cc == "pull":
        assert answers[("10.0.0.1", wire.PULL_GRANT)] == 3 and answers[("10.0.0.3", wire.PULL_GRANT)] == 0
