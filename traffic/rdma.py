"""One emulated host's RDMA-like transport: its share of the schedule as RoCEv2 queue pairs over UDP, stepped by
the event loop (traffic.eventloop) of the agent process that serves it (traffic.serve). This module and the ones
it steps (traffic.transport, traffic.cc, traffic.eventloop) are the agents' hot path: `make setup` compiles them
with mypyc (traffic.hotpath), and this source is the reference the compiled build is tested against.

Sending uses a raw IPPROTO_UDP socket, so every packet can carry its own source port (entropy); a BPF filter
keeps that socket from receiving copies of the host's UDP traffic. Receiving uses an ordinary UDP socket on 4791.
Packets are paced per egress link (NIC port or NVLink) at its configured rate and per queue pair at the rate its
congestion control allows. Where both ends have a port on several planes (the multi-port MPFT), a queue pair
with per-packet entropy sends each packet on the next plane port that is free (host-side spraying across
planes, the paper's ideal NIC); with fixed entropy it stays on one plane. Peers are identified by host, not by
address, so a queue pair's packets arriving on different planes are resequenced together. The transport option
`ordering` says when a message is delivered and whether a send waits for earlier messages' acknowledgements
(traffic.transport); the receivers count sends delivered before an earlier message of their queue pair.
"""

from __future__ import annotations

import errno
import heapq
import math
import random
import socket
import struct
import time
from collections import Counter, deque
from pathlib import Path

from mypy_extensions import mypyc_attr

from emulator.model import wire
from emulator.model.schedule import Message, read
from traffic import eventloop, kernel
from traffic.cc import PLUGINS, Pull
from traffic.contract import Acks, AgentConfig, Datagrams, Delivery, EcnCounts, OrderingCounts, PullCounts, Rx, Tx
from traffic.entropy import SPRAYED, Entropy
from traffic.granter import Granter
from traffic.plan import RTT_SAMPLES, Plan, Sampler
from traffic.transport import InPacket, RecvConnection, SendConnection, SentMessage

IP_RECVTOS = 13
SO_TIMESTAMPNS = SCM_TIMESTAMPNS = 35  # receive times from the kernel (asm-generic/socket.h), not the agent's loop
TIMESPEC = struct.Struct("qq")
ECT0 = 0x02
CE = 0x03
GRANT_TTL_BASE_NS = 2_000_000  # cc pull: the round trip in a grant's time to live
REFUSED = (errno.EPERM, errno.EINVAL, errno.ENETUNREACH, errno.EHOSTUNREACH)  # before any queue: not sent


class Route:
    """One way to a peer: its address, the local egress link that carries it (and that link's rate), and that
    path's entropy."""

    __slots__ = ("ip", "egress", "bps", "entropy")

    def __init__(self, ip: str, egress: str, bps: float, entropy: Entropy) -> None:
        self.ip, self.egress, self.bps, self.entropy = ip, egress, bps, entropy


class Lane:
    """The queue pairs that leave by the same egress links, served in turn: the NIC, the NVLink, or the plane
    ports of a multi-port NIC."""

    __slots__ = ("links", "queue", "pacer_ns")

    def __init__(self, links: tuple[str, ...]) -> None:
        self.links = links
        self.queue: deque[tuple[str, int]] = deque()  # active queue pairs: they may have a packet to send
        self.pacer_ns = 0.0  # after a visit in which every one was held by its pacer: the earliest pacer


@mypyc_attr(allow_interpreted_subclasses=True)  # the unit tests record its datagrams instead of sending them
class Agent:
    def __init__(self, config: AgentConfig, host: str, messages: list[Message] | None = None) -> None:
        """`messages`: the run's schedule, when the caller has read it already (one read for all the hosts of a
        process)."""
        self.cfg = config
        self.host = host
        self.dir = Path(config.dir)
        hosts = config.hosts
        self.me = hosts[host]
        self.host_of_ip = {h.ip: name for name, h in hosts.items()}
        self.host_of_ip.update({p.ip: name for name, h in hosts.items() for p in h.ports.values()})
        self.options = opts = config.transport
        self.rng = random.Random(f"{config.seed}:{host}")
        self.cc_name = opts.cc
        self.ecn = self.cc_name == "ecn"
        # ECN-capable (ECT(0) out, CE read and echoed in ACKs) for cc ecn, and for reps where the switches mark:
        # REPS recycles the entropy of packets that came back unmarked
        self.ect = self.ecn or (opts.entropy == "reps" and config.ecn)
        self.payload = wire.payload_per_packet(config.mtu)
        self.window = opts.window
        if self.window < 1 or self.cc_name not in PLUGINS:
            raise ValueError("window 0 and cc auto are left to the fabric: the runner resolves them "
                             "(emulator.run.launch)")
        self.ordering = opts.ordering
        self.plane = self.me.plane or 0
        everything = read(config.schedule) if messages is None else messages
        self.plan = Plan(everything, host)
        # a queue pair answers in its own traffic class (ACKs, CNPs, pull's grants), as RoCE's responder does: in
        # class 0, a victim's ACKs queued behind the very traffic a class of its own was to keep it from
        self.reply_class = {(m.src, m.qp): m.tclass for m in self.plan.expected.values()}
        self.send_conns: dict[tuple[str, int], SendConnection] = {}  # (peer host, qp)
        self.lanes: dict[tuple[str, ...], Lane] = {}  # by egress links: the queue pairs that leave by them
        self.lane_of: dict[tuple[str, int], Lane] = {}
        self.is_active: set[tuple[str, int]] = set()
        self.timers: list[tuple[float, tuple[str, int]]] = []  # heap: (no later than its RTO or CC timer, qp)
        self.timer_at: dict[tuple[str, int], float] = {}  # each queue pair's live heap entry
        self.ack_timer_ns = math.inf  # no later than the first held ACK is due
        self.paths: dict[tuple[str, int], list[Route]] = {}
        self.next_path: dict[tuple[str, int], int] = {}
        self.recv_conns: dict[tuple[str, int], RecvConnection] = {}
        self.holding: dict[tuple[str, int], tuple[RecvConnection, tuple[str, int]]] = {}  # ACKs held
        packet_bits = (config.mtu + wire.ETH) * 8
        # the longest an ACK is held: time for ack_every packets at the NIC's rate
        self.ack_delay_ns = self.options.ack_every * packet_bits / self.me.egress_bps.nic * 1e9
        # work due this soon after a wake-up is done in it (the event loop steps hosts due this soon, too)
        self.slack_ns = self.options.wake_slack * packet_bits / self.me.egress_bps.nic * 1e9
        self.sent: dict[int, SentMessage] = {}
        self.unexpected = 0
        self.rtt = Sampler(RTT_SAMPLES, self.rng)
        self.lateness = Sampler(RTT_SAMPLES, self.rng)
        self.egress_next: dict[str, float] = {}
        self.send_errors = 0
        # every datagram handed to the kernel, and every one read back (the run's ledger: emulator.net.ledger);
        # sends the kernel refused before any queue (a route, a firewall rule), and datagrams still waiting in
        # the receive socket when the agent stopped
        self.datagrams_sent = self.datagrams_received = self.send_refused = self.drained = 0
        # datagrams a full socket buffer refused (a paused NIC holds its queue: emulator/net/pause.py), sent in
        # order once it has room, one packet time at the NIC's rate apart at most; per traffic class, as each
        # class has its socket and a NIC its queue per priority (one class paused holds back no other)
        self.held: dict[int, deque[tuple[bytes, str]]] = {}
        self.held_total = 0
        self.held_retry_ns = math.inf
        self.held_wait_ns = int(packet_bits / self.me.egress_bps.nic * 1e9)
        self.acks_sent = self.acks_received = 0  # packet events beside the data packets, for the CPU per event
        self.cnp_sent: dict[tuple[str, int], int] = {}
        self.ce_received = self.cnps_sent = self.cnps_received = 0  # cc ecn: marks seen, notifications
        self.done_written = False
        self.buf = bytearray(config.mtu)
        self.rx_buf = bytearray(65536)
        self.rx_view = memoryview(self.rx_buf)
        self.ack_buf = bytearray(128)
        # cc pull: this host's grants to its senders, where to send them, and how many queue pairs send to each host
        self.granter: Granter | None = None
        self.unscheduled_max = self.window
        self.fan_in: Counter[str] = Counter()
        if PLUGINS[self.cc_name].receiver_driven:
            nic_bps = self.me.egress_bps.nic
            packet_ns = packet_bits / nic_bps * 1e9
            pull = PLUGINS[self.cc_name](nic_bps, packet_bits, self.window, **opts.cc_params)
            assert isinstance(pull, Pull)
            # a granted packet may wait behind every other granted one in the receiver's queue: the ttl must be
            # longer than that, or grants that are only late are given up and the queue grows
            limit = pull.grant_limit
            self.unscheduled_max = pull.unscheduled
            self.granter = Granter(packet_ns, limit=limit, ttl_ns=(2 * limit + 4) * packet_ns + GRANT_TTL_BASE_NS)
            self.fan_in = Counter([dst for dst, src, _qp in {(m.dst, m.src, m.qp) for m in everything}
                                   if not self.over_nvlink(src, dst)])
        self.grant_to: dict[tuple[str, int], str] = {}
        self.queue_bytes = config.queue_bytes
        # a sprayed packet may overtake one sent before it by up to a full switch queue (the slowest NIC's drain)
        self.reorder_ns = int(self.queue_bytes * 8 / max(1.0, self.me.egress_bps.nic) * 1e9)
        self.requests_sent = self.grants_sent = 0
        # cc pull: queue pairs' first requests leave one per packet time of the NIC, the pace their data would:
        # the 128-GPU 8-plane all-to-all posted 16 k at once, and the switch daemons dropped 4 k at their input
        self.request_slot_ns = packet_bits / self.me.egress_bps.nic * 1e9
        self.request_next_ns = 0.0
        names = list(hosts)
        me = names.index(host)
        self.ask_order = {h: (i - me) % len(names) for i, h in enumerate(names)}  # the next host first
        # pull requests and grants step their source port per address when the data is sprayed (send_control)
        self.control_sprayed = opts.entropy in SPRAYED
        self.control_sent: Counter[str] = Counter()
        self.cpu_at_go = eventloop.cpu_now()  # set again at the common start
        self.t0 = 0

    # -- set-up ---------------------------------------------------------------------------------------
    def open(self) -> None:
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        kernel.socket_buffer(self.rx, socket.SO_RCVBUF, 4 << 20)
        self.rx.bind(("0.0.0.0", wire.ROCE_PORT))
        self.rx.setblocking(False)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        if self.ect:
            self.rx.setsockopt(socket.IPPROTO_IP, IP_RECVTOS, 1)
        classes = {0, *[m.tclass for m in self.plan.mine.values()], *self.reply_class.values()}
        self.tx = {tclass: self.tx_socket(tclass) for tclass in classes}

    def tx_socket(self, tclass: int) -> socket.socket:
        """A raw sending socket for one traffic class (a queue pair's data, or its answers): the class is the DSCP
        (tclass * 8), plus ECT(0) when ECN-capable. Opened with the others in open(), in the host's namespace."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
        kernel.drop_all_filter(sock)
        kernel.socket_buffer(sock, socket.SO_SNDBUF, 1 << 20)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tclass << 5 | (ECT0 if self.ect else 0))
        sock.setblocking(False)
        return sock

    def connection(self, dst: str, qp: int, tclass: int) -> SendConnection:
        key = (dst, qp)
        conn = self.send_conns.get(key)
        if conn is None:
            opts = self.options
            rng = random.Random(f"{self.cfg.seed}:{self.host}:{dst}:{qp}")

            def entropy() -> Entropy:
                return Entropy(opts.entropy, rng, int(opts.flowlet_gap_ms * 1e6))
            paths = self.paths_to(dst, entropy)
            if opts.entropy == "fixed":
                paths = [rng.choice(paths)]
            bps = sum(p.bps for p in paths)
            packet_bits = (self.cfg.mtu + wire.ETH) * 8
            cc = PLUGINS[self.cc_name](bps, packet_bits, self.window, **opts.cc_params)
            conn = self.send_conns[key] = SendConnection(qp, cc, self.payload, tclass,
                                                         fence=self.ordering == "fence",
                                                         min_rto_ns=int(opts.min_rto_ms * 1e6),
                                                         reorder_ns=self.reorder_ns if len(paths) > 1
                                                         or opts.entropy in SPRAYED else 0)
            if cc.receiver_driven and not self.over_nvlink(self.host, dst):  # the receiver's grants pace its NIC
                conn.pulled(self.unscheduled(dst))
            self.paths[key], self.next_path[key] = paths, 0
            for p in paths:
                self.egress_next.setdefault(p.egress, 0.0)
            links = tuple(sorted({p.egress for p in paths}))
            self.lane_of[key] = self.lanes.setdefault(links, Lane(links))
        return conn

    def unscheduled(self, dst: str) -> int:
        """cc pull: the packets a queue pair sends unasked, the receiver's queue divided by its fan-in (the queue
        pairs of the schedule sending to it), at most the plug-in's `unscheduled`: fifteen senders' first packets
        alone overfill a 128 KB queue, so an all-to-all starts by asking."""
        packet_bytes = self.cfg.mtu + wire.ETH
        return min(self.unscheduled_max, self.queue_bytes // max(1, self.fan_in.get(dst, 1)) // packet_bytes)

    def over_nvlink(self, src: str, dst: str) -> bool:
        """Whether src reaches dst inside their node (no NIC on the way: cc pull does not pace it)."""
        a, b = self.cfg.hosts[src], self.cfg.hosts[dst]
        return a.node is not None and a.node == b.node and a.egress_bps.nvlink is not None

    def paths_to(self, dst: str, entropy) -> list[Route]:
        """NVLink inside a node; one path per plane both hosts have a port on; else the host's own address
        (the kernel routes it out of the NIC, or over NVLink to the same-node GPU on the peer's plane: PXN)."""
        peer, egress = self.cfg.hosts[dst], self.me.egress_bps
        if egress.nvlink is not None and self.over_nvlink(self.host, dst):
            return [Route(peer.ip, "nvlink", egress.nvlink, entropy())]
        common = sorted(set(self.me.ports) & set(peer.ports), key=int)
        if len(common) > 1:
            return [Route(peer.ports[p].ip, f"plane{p}", self.me.ports[p].bps, entropy()) for p in common]
        return [Route(peer.ip, "nic", egress.nic, entropy())]

    # -- the schedule -------------------------------------------------------------------------------------
    def post_due(self, now: int) -> None:
        """Post the messages due; their queue pairs ask (pull) starting with the host after this one, so that
        when every host posts to every other at once each receiver hears from a sender in the first slot."""
        asking: dict[tuple[str, int], SendConnection] = {}
        for m in self.plan.due(self.t0, now):
            conn = self.connection(m.dst, m.qp, m.tclass)
            sent = self.sent[m.id] = SentMessage(m.id, m.bytes, now)
            conn.post(sent, m.op)
            self.activate((m.dst, m.qp))
            asking[(m.dst, m.qp)] = conn
        for key in sorted(asking, key=lambda k: (self.ask_order[k[0]], k[1])) if len(asking) > 1 else asking:
            self.ask(key, asking[key], now)

    def activate(self, key: tuple[str, int]) -> None:
        """Something changed that may give the queue pair a packet to send (a post, an ACK, a grant, a timeout):
        if it has one, send_some visits it (again); one whose window or credit is full waits for the next change."""
        if key not in self.is_active and self.send_conns[key].has_work():
            self.is_active.add(key)
            self.lane_of[key].queue.append(key)

    def ask(self, key: tuple[str, int], conn: SendConnection, now: int, again: bool = False) -> None:
        """cc pull: ask the receiver for what the queue pair needs granted, if that grew (or, `again`, once its
        request went unanswered for a while: SendConnection._ask_wait); a first request in this host's next free
        request slot."""
        if not conn.is_pulled:
            return
        if conn.first_request_due():
            if self.request_next_ns > now:  # a first request before this host's next slot: it waits for its own
                conn.ask_again_ns = self.request_next_ns
                self.request_next_ns += self.request_slot_ns
                self.arm(key, conn)
                return
            self.request_next_ns = now + self.request_slot_ns
        wanted = conn.ask(now, again)
        if wanted:
            self.send_control(wire.PULL_REQUEST, self.paths[key][0].ip, conn.qp, wanted, now, conn.tclass)
            self.requests_sent += 1
            self.arm(key, conn)

    def send_control(self, opcode: int, ip: str, dqpn: int, count: int, now: int, tclass: int) -> None:
        """A pull request or grant (wire.pack_pull). With sprayed entropy its source
        port steps by one per control packet to the same address, as the data's does: on one port every grant a
        receiver sends a sender waits in the same queue, and behind a slowed link that sender's turns go to others
        (measured, traffic/README.md: an all-to-all around a link at 25 %, 1.22x its bound against 1.12x)."""
        sport = wire.ENTROPY_BASE
        if self.control_sprayed:
            sport += self.control_sent[ip] % wire.ENTROPY_SPAN
            self.control_sent[ip] += 1
        n = wire.pack_pull(self.ack_buf, sport, dqpn, count, now, self.plane, opcode)
        self.transmit(tclass, self.ack_buf, n, ip)

    def arm(self, key: tuple[str, int], conn: SendConnection) -> None:
        """Keep a timer entry no later than the queue pair's next retransmission timeout, CC timer or request."""
        when = conn.timer_ns()
        if when < self.timer_at.get(key, math.inf):
            self.timer_at[key] = when
            heapq.heappush(self.timers, (when, key))

    # -- packets ------------------------------------------------------------------------------------------
    def receive(self, now: int) -> None:
        """Take up to 256 waiting datagrams, each into the one receive buffer, with the kernel's receive time
        (CLOCK_REALTIME, made monotonic here): a round trip measured from it leaves out how late the agent's loop
        came round to the packet."""
        realtime_ahead = time.time_ns() - time.monotonic_ns()
        for _ in range(256):
            try:
                nbytes, anc, _flags, addr = self.rx.recvmsg_into([self.rx_buf], 64)
            except BlockingIOError:
                return
            self.datagrams_received += 1
            tos = 0
            rx_ns = now
            for level, kind, data in anc:
                if kind == SCM_TIMESTAMPNS and level == socket.SOL_SOCKET:
                    sec, nsec = TIMESPEC.unpack(data)
                    rx_ns = sec * 1_000_000_000 + nsec - realtime_ahead
                elif level == socket.IPPROTO_IP:
                    tos = data[0]
            try:
                pkt = wire.Parsed(self.rx_view[:nbytes])
            except (ValueError, struct.error):
                self.unexpected += 1
                continue
            if pkt.opcode in wire.DATA_OPS:
                self.on_data(now, rx_ns, addr, pkt, tos & 3 == CE)
            elif pkt.opcode == wire.ACK:
                self.on_ack(now, rx_ns, addr[0], pkt)
            elif pkt.opcode == wire.CNP:
                self.cnps_received += 1
                key = (self.host_of_ip.get(addr[0], addr[0]), pkt.dqpn)
                conn = self.send_conns.get(key)
                if conn is not None:
                    conn.cc.on_cnp(now)
                    self.arm(key, conn)
            elif pkt.opcode == wire.PULL_REQUEST:
                self.on_request(now, addr[0], pkt)
            elif pkt.opcode == wire.PULL_GRANT:
                self.on_grant(now, addr[0], pkt)

    def on_request(self, now: int, src_ip: str, pkt: wire.Parsed) -> None:
        """A sender asks for grants; the answer to a repeated request is its grant total so far (a lost grant)."""
        if self.granter is None:
            self.unexpected += 1
            return
        key = (self.host_of_ip.get(src_ip, src_ip), pkt.dqpn)
        self.grant_to[key] = src_ip
        granted = self.granter.request(key, pkt.count)
        if granted:
            self.send_control(wire.PULL_GRANT, src_ip, pkt.dqpn, granted, now, self.reply_class.get(key, 0))
            self.grants_sent += 1

    def on_grant(self, now: int, src_ip: str, pkt: wire.Parsed) -> None:
        key = (self.host_of_ip.get(src_ip, src_ip), pkt.dqpn)
        conn = self.send_conns.get(key)
        if conn is None:
            self.unexpected += 1
            return
        conn.grant(pkt.count, now)
        self.activate(key)

    def send_grants(self, now: int, soon: float) -> None:
        """cc pull: the grants due by `soon`, one packet each, paced at this host's link rate."""
        assert self.granter is not None
        for key, granted in self.granter.grant(int(soon)):
            self.send_control(wire.PULL_GRANT, self.grant_to[key], key[1], granted, now, self.reply_class.get(key, 0))
            self.grants_sent += 1

    def on_data(self, now: int, rx_ns: int, addr: tuple[str, int], pkt: wire.Parsed, ce: bool) -> None:
        key = (self.host_of_ip.get(addr[0], addr[0]), pkt.dqpn)
        self.ce_received += int(ce)
        if self.granter is not None:
            self.granter.arrived(key, now)
        conn = self.recv_conns.get(key)
        if conn is None:
            conn = self.recv_conns[key] = RecvConnection(self.ordering, ack_every=self.options.ack_every)
        dup, delivered = conn.on_data(now, pkt.psn, InPacket(pkt.opcode, pkt.msg_id, pkt.payload_len,
                                                                   bool(pkt.flags & wire.FLAG_RETX)))
        for d in delivered:
            record = Delivery(d.delivered_ns, d.first_rx_ns, d.bytes, rx_ns - pkt.tx_ns, d.arrived_ns)
            self.unexpected += not self.plan.deliver(d.msg_id, d.bytes, record)
        if conn.ack_now(now, pkt.tx_ns, dup or ce or pkt.opcode in wire.LAST_OPS, rx_ns):
            if self.holding.pop(key, None) and not self.holding:
                self.ack_timer_ns = math.inf  # nothing held: no flush to wake up for
            self.send_ack(key, conn, addr, pkt.tx_ns, (wire.FLAG_DUP if dup else 0) | (wire.FLAG_CE if ce else 0))
        else:
            self.holding[key] = (conn, addr)
            self.ack_timer_ns = min(self.ack_timer_ns, conn.held_since_ns + self.ack_delay_ns)
        if ce and self.ecn and now - self.cnp_sent.get(key, 0) > self.options.cnp_interval_ms * 1e6:
            self.cnp_sent[key] = now
            self.cnps_sent += 1
            n = wire.pack_ack(self.ack_buf, addr[1], pkt.dqpn, conn.ack_fields()[0], 0, 0, now, 0, 0, self.plane,
                              wire.CNP)
            self.transmit(self.reply_class.get(key, 0), self.ack_buf, n, addr[0])

    def send_ack(self, key: tuple[str, int], conn: RecvConnection, addr: tuple[str, int], echo_ns: int,
                 flags: int) -> None:
        """The queue pair's cumulative and selective acks, echoing `echo_ns` and how long its packet was held
        here, back on the data's source port."""
        cum, sack = conn.ack_fields()
        now = time.monotonic_ns()
        n = wire.pack_ack(self.ack_buf, addr[1], key[1], cum, conn.delivered_count, echo_ns, now, sack, flags,
                          self.plane, wire.ACK, max(0, now - conn.held_rx_ns))
        self.transmit(self.reply_class.get(key, 0), self.ack_buf, n, addr[0])
        self.acks_sent += 1

    def on_ack(self, now: int, rx_ns: int, src_ip: str, pkt: wire.Parsed) -> None:
        """An ACK: its round trip is the fabric's, from the kernel's receive time less the receiver's hold."""
        self.acks_received += 1
        key = (self.host_of_ip.get(src_ip, src_ip), pkt.dqpn)
        conn = self.send_conns.get(key)
        if conn is None:
            self.unexpected += 1
            return
        rtt = 0
        if pkt.echo_ns:
            rtt = max(1, rx_ns - pkt.echo_ns - pkt.hold_ns)
            self.rtt.add(rtt / 1e3)
        for msg in conn.on_ack(now, pkt.psn, pkt.sack, pkt.echo_ns, bool(pkt.flags & wire.FLAG_DUP), rtt,
                               bool(pkt.flags & wire.FLAG_CE) if self.ect else None):
            self.plan.acknowledged(msg.id)
        self.activate(key)  # the window may have opened, or a loss been found
        self.ask(key, conn, now)  # a loss found: more to be granted (pull)
        self.arm(key, conn)  # the RTO may have shrunk

    def transmit(self, tclass: int, buf: bytearray, length: int, ip: str) -> None:
        """Send one datagram. A full socket buffer holds it (and every later one, in order) until the socket has
        room, as a NIC holds its send queue; a full queue (ENOBUFS: the qdisc dropped it) counts as a send error,
        a loss the transport recovers; a refusal before any queue (EPERM, EINVAL, unreachable) is counted too."""
        held = self.held.get(tclass)
        if held:
            held.append((bytes(buf[:length]), ip))
            return
        try:
            self.tx[tclass].sendto(memoryview(buf)[:length], (ip, 0))
        except OSError as exc:
            if exc.errno == errno.EAGAIN:
                self.held.setdefault(tclass, deque()).append((bytes(buf[:length]), ip))
                self.held_retry_ns = float(time.monotonic_ns() + self.held_wait_ns)
                return
            self.send_failed(exc)
        self.datagrams_sent += 1

    def send_failed(self, exc: OSError) -> None:
        """A datagram the kernel took and dropped (ENOBUFS: its qdisc was full) or refused before any queue;
        anything else is a bug."""
        if exc.errno == errno.ENOBUFS:
            self.send_errors += 1
        elif exc.errno in REFUSED:
            self.send_refused += 1
        else:
            raise exc

    def drain(self) -> int:
        """After the last step: count the datagrams waiting in the receive socket (the fabric delivered them; the
        ledger must not call them lost); how many there were."""
        before = self.drained
        while True:
            try:
                self.rx.recv_into(self.rx_buf)
            except BlockingIOError:
                return self.drained - before
            self.drained += 1

    def send_held(self, now: int) -> None:
        """Send what full socket buffers held back, oldest first in each class, until its socket is full again."""
        for tclass in list(self.held):
            held = self.held[tclass]
            while held:
                data, ip = held[0]
                try:
                    self.tx[tclass].sendto(data, (ip, 0))
                except OSError as exc:
                    if exc.errno == errno.EAGAIN:
                        break
                    self.send_failed(exc)
                self.datagrams_sent += 1
                held.popleft()
                self.held_total += 1
            if not held:
                del self.held[tclass]
        self.held_retry_ns = float(now + self.held_wait_ns) if self.held else math.inf

    def free_path(self, key: tuple[str, int], now: float) -> Route | None:
        """The queue pair's next path (round-robin) whose egress link is free by `now`."""
        paths = self.paths[key]
        start = self.next_path[key]
        for i in range(len(paths)):
            path = paths[(start + i) % len(paths)]
            if self.egress_next[path.egress] <= now:
                self.next_path[key] = (start + i + 1) % len(paths)
                return path
        return None

    def send_some(self, now: int, soon: float) -> None:
        """Send what the links and pacers allow by `soon`, lane by lane (the queue pairs leaving by the same
        links); a packet sent before its time makes the next one's time later by as much (no rate is raised)."""
        for lane in self.lanes.values():
            if lane.queue:
                self.send_lane(lane, now, soon)

    def send_lane(self, lane: Lane, now: int, soon: float) -> None:
        """Visit the lane's active queue pairs in turn (one that sent, or is held by its pacer, goes to the back;
        one without work leaves) until all of the lane's links are busy or every one left is held by its pacer."""
        lane.pacer_ns = 0.0
        if self.links_free_at(lane) > soon:
            return
        paced = math.inf  # the earliest pacer among those held by theirs
        held = 0  # queue pairs held by their pacer since the last send
        queue = lane.queue
        while held < len(queue):
            key = queue.popleft()
            conn = self.send_conns[key]
            if conn.next_tx_ns > soon:
                queue.append(key)
                paced = min(paced, conn.next_tx_ns)
                held += 1
                continue
            pkt = conn.next_packet(now)  # None when it has no work (a full window, nothing queued)
            if pkt is None:
                self.is_active.discard(key)
                continue
            path = self.free_path(key, soon)  # one is free: the lane's links were checked
            assert path is not None
            sport = path.entropy.port(now)
            pkt.sport, pkt.entropy = sport, path.entropy
            flags = wire.FLAG_RETX if pkt.sends > 1 else 0
            n = wire.pack_data(self.buf, sport, pkt.opcode, conn.qp, pkt.psn, pkt.msg_id, now, self.plane, flags,
                               pkt.payload_len, dma_len=pkt.dma_len)
            self.transmit(conn.tclass, self.buf, n, path.ip)
            bits = (n + 20 + wire.ETH) * 8
            line_ns = bits / path.bps * 1e9
            self.egress_next[path.egress] = max(self.egress_next[path.egress], now - line_ns) + line_ns
            conn.next_tx_ns = max(conn.next_tx_ns, now - line_ns) + bits / conn.cc.rate_bps * 1e9
            if conn.has_work():
                queue.append(key)
            else:  # its window is full: an ACK or a timeout makes it active again, no visit needed until then
                self.is_active.discard(key)
            self.arm(key, conn)  # it may have started the RTO
            if self.links_free_at(lane) > soon:
                return
            held = 0
        lane.pacer_ns = paced  # every one left is held by its pacer: the earliest is next

    def links_free_at(self, lane: Lane) -> float:
        """When the first of the lane's links is free."""
        links = lane.links
        if len(links) == 1:
            return self.egress_next[links[0]]
        return min(self.egress_next[link] for link in links)

    def next_wake(self) -> float:
        """When this host has something to do next: a message due, a timer, or a lane's link free (or, if every
        queue pair in it was held by its pacer, the earliest pacer)."""
        self.defer_timers()
        wake = min(self.plan.next_ns(self.t0), self.timers[0][0] if self.timers else math.inf, self.ack_timer_ns,
                   self.granter.due_ns() if self.granter is not None else math.inf, self.held_retry_ns)
        for lane in self.lanes.values():
            if lane.queue:
                wake = min(wake, max(self.links_free_at(lane), lane.pacer_ns))
        return wake

    def defer_timers(self) -> None:
        """Move the earliest timer entries whose deadline went later (ACKs came since they were set) to it, so the
        host does not wake for nothing; an entry stays no later than its queue pair's deadline."""
        timers = self.timers
        while timers:
            when, key = timers[0]
            if self.timer_at.get(key) != when:
                heapq.heappop(timers)  # superseded by an earlier entry
                continue
            conn = self.send_conns[key]
            due = conn.timer_ns()
            if due <= when:
                return
            heapq.heappop(timers)
            if due == math.inf:
                del self.timer_at[key]
            else:
                self.timer_at[key] = due
                heapq.heappush(timers, (due, key))

    def flush_acks(self, now: int) -> None:
        """Send the held ACKs whose time has come; then when the next one is due."""
        soonest = math.inf
        for key, (rconn, addr) in list(self.holding.items()):
            due = rconn.held_since_ns + self.ack_delay_ns
            if now >= due:
                del self.holding[key]
                self.send_ack(key, rconn, addr, rconn.flush(), 0)
            else:
                soonest = min(soonest, due)
        self.ack_timer_ns = soonest

    def on_timer(self, now: int, soon: float) -> None:
        """Retransmission timeouts (those due by `soon`) and CC timers of the queue pairs whose timer entry has
        come, each re-armed; a CC timer or a request not due yet at `now` keeps an entry for its own time, which
        the next step takes."""
        due = []
        while self.timers and self.timers[0][0] <= soon:
            when, key = heapq.heappop(self.timers)
            if self.timer_at.get(key) == when:  # else superseded by an earlier entry
                del self.timer_at[key]
                due.append(key)
        for key in due:
            conn = self.send_conns[key]
            if conn.check_timeout(int(soon)):
                for path in self.paths[key]:
                    path.entropy.repath()
                self.activate(key)
            conn.cc.tick(now)
            self.ask(key, conn, now, again=True)
            self.arm(key, conn)

    # -- the loop -----------------------------------------------------------------------------------------
    def start(self, t0: int) -> None:
        self.t0 = t0

    def step(self, now: int, readable: bool) -> float:
        """Do what is due at `now` (the event loop calls this when the host's socket is readable or its wake
        time has come); return the next wake time (CLOCK_MONOTONIC ns). Timers, grants and sends due within the
        slack are done now; packets and ACKs are stamped with the real time."""
        soon = now + self.slack_ns
        self.post_due(now)
        if readable:
            self.receive(now)
        if soon >= self.ack_timer_ns:
            self.flush_acks(int(soon))
        if self.timers and self.timers[0][0] <= soon:
            self.on_timer(now, soon)
        if self.held and now >= self.held_retry_ns:
            self.send_held(now)
        if self.granter is not None:
            self.send_grants(now, soon)
        self.send_some(now, soon)
        if not self.done_written and self.plan.finished():
            (self.dir / f"{self.host}.done").write_text("")
            self.done_written = True
        return self.next_wake()

    def result(self) -> dict:
        """This host's counters, as HostResult's fields (traffic.contract)."""
        rx = Rx()
        receivers = self.recv_conns.values()
        reorder: Counter[int] = Counter()
        for conn in receivers:
            rx.packets += conn.stats["packets"]
            rx.duplicates += conn.stats["duplicates"]
            rx.out_of_order += conn.stats["out_of_order"]
            rx.retransmitted += conn.stats["retransmitted"]
            reorder.update(conn.reorder)
            rx.resequence_max = max(rx.resequence_max, conn.reseq_max)
        rx.reorder_distance = {str(k): v for k, v in sorted(reorder.items())}
        senders = self.send_conns.values()
        entropies = [p.entropy for paths in self.paths.values() for p in paths]
        tx = Tx(data_packets=sum(c.stats["data_packets"] for c in senders),
                retransmits=sum(c.stats["retransmits"] for c in senders),
                timeouts=sum(c.stats["timeouts"] for c in senders), spurious=sum(c.stats["spurious"] for c in senders),
                timeout_lost=sum(c.stats["timeout_lost"] for c in senders),
                timeout_spurious=sum(c.stats["timeout_spurious"] for c in senders),
                send_errors=self.send_errors, held=self.held_total, flowlets=sum(e.flowlets for e in entropies),
                repaths=sum(e.repaths for e in entropies), reused=sum(e.reused for e in entropies))
        return {
            "rx": rx, "tx": tx, "acks": Acks(self.acks_sent, self.acks_received),
            "datagrams": Datagrams(self.datagrams_sent, self.datagrams_received + self.drained, self.send_refused),
            "ecn": EcnCounts(self.ce_received, self.cnps_sent, self.cnps_received),
            "cc": {f"{peer}/{qp}": c.cc.state() for (peer, qp), c in self.send_conns.items()},
            "pull": PullCounts(self.requests_sent, self.grants_sent,
                               self.granter.stats["forgiven"] if self.granter is not None else 0),
            "ordering": OrderingCounts(self.ordering, sum(c.stats["violations"] for c in receivers),
                                       sum(c.stats["sends"] for c in receivers)),
        }
