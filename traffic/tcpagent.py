"""The per-host TCP agent: a host's share of a schedule over kernel TCP, one connection per (peer host, queue pair),
measured and reported like traffic.serve, so the runner starts and summarises either the same way.

    python -m traffic.tcpagent --config RUN/agent.json --host n0g1

The protocol is traffic.serve's: listen, write `<host>.ready`, wait for `go` (the common start on CLOCK_MONOTONIC),
post each message at its start time once its dependencies are complete, write `<host>.done` when every message it
sent is acknowledged and every message it expects is delivered, keep serving until SIGTERM or the deadline, then
write `<host>.json`.

A sender opens a connection to the peer's address when it first posts to it, with the run's congestion control
(TCP_CONGESTION; `none` keeps the kernel's default), the traffic class as DSCP and TCP_NODELAY, and writes each
message as one frame: a header (magic, message id, length, send time) and `length` zero bytes. A receiver
listens on its host's own address (so agents can also share one namespace), delivers a message when its last
byte arrives and answers with an ACK frame (a header without payload) on the same connection. What TCP hides
from the application (segments, retransmissions, RTT) is read from the kernel's TCP_INFO.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import selectors
import socket
import struct
import sys
import time
from collections import deque, namedtuple
from dataclasses import dataclass
from pathlib import Path

from emulator.model.schedule import Message, read
from traffic import eventloop, serve
from traffic.contract import AgentConfig, Delivery, HostResult, Rx, Tx
from traffic.eventloop import IDLE_WAIT_S
from traffic.plan import RTT_SAMPLES, Plan, Sampler

log = logging.getLogger(__name__)

PORT = 4792
HEADER = struct.Struct("!IQQQ")  # magic, message id, payload length, sender's CLOCK_MONOTONIC at the first byte
DATA = 0x4D504654  # "MPFT"
ACK = 0x4D50414B  # "MPAK"
ZEROS = memoryview(bytes(1 << 20))  # every payload: written from here, never copied
RECV_BUFFER = bytearray(1 << 20)

# struct tcp_info as of Linux 6.7 (up to tcpi_total_rto_time); native layout, every field naturally aligned.
TcpInfo = namedtuple("TcpInfo", "state ca_state retransmits probes backoff options wscale rate_flags "
                     "rto ato snd_mss rcv_mss unacked sacked lost retrans fackets last_data_sent last_ack_sent "
                     "last_data_recv last_ack_recv pmtu rcv_ssthresh rtt rttvar snd_ssthresh snd_cwnd advmss "
                     "reordering rcv_rtt rcv_space total_retrans pacing_rate max_pacing_rate bytes_acked "
                     "bytes_received segs_out segs_in notsent_bytes min_rtt data_segs_in data_segs_out "
                     "delivery_rate busy_time rwnd_limited sndbuf_limited delivered delivered_ce bytes_sent "
                     "bytes_retrans dsack_dups reord_seen rcv_ooopack snd_wnd rcv_wnd rehash total_rto "
                     "total_rto_recoveries total_rto_time")
_TCP_INFO = struct.Struct("8B24I4Q6I4Q2I2Q6I2HI")


def tcp_info(sock: socket.socket) -> TcpInfo:
    """The kernel's TCP_INFO for a socket; fields an older kernel does not have read as 0."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO.size)
    return TcpInfo._make(_TCP_INFO.unpack(raw.ljust(_TCP_INFO.size, b"\0")))


def congestion_control(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


class ProtocolError(ValueError):
    """A peer sent bytes that are not a frame."""


@dataclass
class Outgoing:
    """A frame to send (a message or an ACK) and, for a message, what became of it."""

    magic: int
    id: int
    bytes: int
    posted_ns: int = 0
    first_tx_ns: int = 0
    acked_ns: int = 0
    retransmits: int = 0  # segments the connection retransmitted between the first byte and the ACK
    retrans_at_tx: int = 0
    written: int = 0  # bytes of the frame, header included, handed to the kernel


@dataclass(frozen=True)
class Frame:
    """A frame as it arrived."""

    magic: int
    id: int
    bytes: int
    tx_ns: int
    first_rx_ns: int


class FrameReader:
    """Cuts a byte stream into frames; payload bytes are counted, not kept."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.frame: Frame | None = None
        self.left = 0
        self.first_rx_ns = 0

    def feed(self, data: memoryview, now: int) -> list[Frame]:
        done = []
        while data:
            if self.frame is None:
                if not self.head:
                    self.first_rx_ns = now
                take = HEADER.size - len(self.head)
                self.head += data[:take]
                data = data[take:]
                if len(self.head) < HEADER.size:
                    break
                magic, msg_id, length, tx_ns = HEADER.unpack(self.head)
                self.head.clear()
                if magic not in (DATA, ACK):
                    raise ProtocolError(f"not a frame (magic {magic:#x})")
                self.frame, self.left = Frame(magic, msg_id, length, tx_ns, self.first_rx_ns), length
            take = min(self.left, len(data))
            self.left -= take
            data = data[take:]
            if self.left == 0:
                done.append(self.frame)
                self.frame = None
        return done


class Conn:
    """One TCP connection: frames go out in posting order, frames come in as their last byte arrives.
    `key` is (peer host, qp) for a connection this host opened, None for one it accepted."""

    def __init__(self, sock: socket.socket, key: tuple[str, int] | None) -> None:
        self.sock, self.key = sock, key
        self.connected = key is None
        self.out: deque[Outgoing] = deque()
        self.header = bytearray(HEADER.size)
        self.reader = FrameReader()
        self.unacked = 0  # messages sent on it and not yet acknowledged
        self.events = 0

    def idle(self) -> bool:
        """Nothing owed either way: the peer may close it without loss."""
        return not self.unacked and self.reader.frame is None and not self.reader.head

    def wanted(self) -> int:
        """Readable always; writable only while there is something to write (or a connect to finish)."""
        return selectors.EVENT_READ | (selectors.EVENT_WRITE if self.out or not self.connected else 0)

    def write(self, now: int) -> None:
        """Hand queued frames to the kernel until they are all written or the socket buffer is full."""
        while self.out:
            f = self.out[0]
            if f.written == 0:
                HEADER.pack_into(self.header, 0, f.magic, f.id, f.bytes, now)
                if f.magic == DATA:
                    f.first_tx_ns, f.retrans_at_tx = now, tcp_info(self.sock).total_retrans
            payload = f.bytes - max(0, f.written - HEADER.size)
            try:
                f.written += self.sock.sendmsg([memoryview(self.header)[min(f.written, HEADER.size):],
                                                ZEROS[:min(payload, len(ZEROS))]])
            except BlockingIOError:
                return
            if f.written < HEADER.size + f.bytes:
                return
            self.out.popleft()

    def read(self, now: int) -> list[Frame] | None:
        """The frames completed by what the socket holds; None when the peer has closed the connection."""
        try:
            n = self.sock.recv_into(RECV_BUFFER)
        except BlockingIOError:
            return []
        return self.reader.feed(memoryview(RECV_BUFFER)[:n], now) if n else None


class TcpAgent:
    """One host's agent: its connections, its messages and what it measured."""

    def __init__(self, config: AgentConfig, host: str) -> None:
        self.cfg, self.host = config, host
        self.dir = Path(config.dir)
        self.cc = config.transport.cc
        self.plan = Plan(read(config.schedule), host)
        rng = random.Random(f"{config.seed}:{host}")
        self.rtt, self.lateness = Sampler(RTT_SAMPLES, rng), Sampler(RTT_SAMPLES, rng)
        self.sel = selectors.DefaultSelector()
        self.conns: list[Conn] = []
        self.send_conns: dict[tuple[str, int], Conn] = {}
        self.sent: dict[int, Outgoing] = {}
        self.unexpected = self.failed = 0
        self.stop = False

    def set_cc(self, sock: socket.socket) -> None:
        if self.cc != "none":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, self.cc.encode())

    def open(self) -> None:
        """Listen on the host's own address (the listener's algorithm is the accepted connections': their
        ACK frames use it, and DCTCP needs it on both ends to negotiate ECN)."""
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of an earlier run
        self.set_cc(self.listener)
        self.listener.bind((self.cfg.hosts[self.host].ip, PORT))
        self.listener.listen(256)
        self.listener.setblocking(False)
        self.sel.register(self.listener, selectors.EVENT_READ)

    # -- connections ------------------------------------------------------------------------------------
    def add(self, conn: Conn) -> None:
        self.conns.append(conn)
        conn.events = conn.wanted()
        self.sel.register(conn.sock, conn.events, conn)

    def watch(self, conn: Conn) -> None:
        if conn.wanted() != conn.events:
            conn.events = conn.wanted()
            self.sel.modify(conn.sock, conn.events, conn)

    def connect(self, dst: str, qp: int, tclass: int) -> Conn | None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        self.set_cc(sock)
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tclass << 5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = sock.connect_ex((self.cfg.hosts[dst].ip, PORT))
        if err not in (0, errno.EINPROGRESS):
            log.warning("%s: connecting to %s failed: %s", self.host, dst, os.strerror(err))
            self.failed += 1
            sock.close()
            return None
        conn = self.send_conns[dst, qp] = Conn(sock, (dst, qp))
        self.add(conn)
        return conn

    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # an ACK frame must not wait
            self.add(Conn(sock, None))

    def drop(self, conn: Conn, why: str | None) -> None:
        """Stop serving a connection (its TCP_INFO stays readable for the result); what it still owed is lost."""
        if why:
            log.warning("%s: connection %s failed: %s", self.host, conn.key or "from a peer", why)
            self.failed += 1
        self.sel.unregister(conn.sock)
        if conn.key is not None and self.send_conns.get(conn.key) is conn:
            del self.send_conns[conn.key]

    def serve(self, conn: Conn, mask: int, now: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE and not conn.connected:
                err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    raise OSError(err, os.strerror(err))
                conn.connected = True
            if mask & selectors.EVENT_READ:
                frames = conn.read(now)
                if frames is None:
                    self.drop(conn, None if conn.idle() else "closed by the peer")
                    return
                for frame in frames:
                    self.on_frame(conn, frame, now)
            if conn.connected:
                conn.write(now)
        except (OSError, ProtocolError) as exc:
            self.drop(conn, str(exc))
            return
        self.watch(conn)

    # -- messages ----------------------------------------------------------------------------------------
    def post(self, m: Message, now: int) -> None:
        out = self.sent[m.id] = Outgoing(DATA, m.id, m.bytes, posted_ns=now)
        conn = self.send_conns.get((m.dst, m.qp)) or self.connect(m.dst, m.qp, m.tclass)
        if conn is not None:
            conn.out.append(out)
            conn.unacked += 1
            self.serve(conn, 0, now)

    def on_frame(self, conn: Conn, frame: Frame, now: int) -> None:
        if frame.magic == ACK:
            out = self.sent.get(frame.id)
            if out is None or out.acked_ns:
                self.unexpected += 1
                return
            info = tcp_info(conn.sock)
            out.acked_ns, out.retransmits = now, info.total_retrans - out.retrans_at_tx
            self.rtt.add(info.rtt)  # the kernel's smoothed RTT, µs
            conn.unacked -= 1
            self.plan.acknowledged(frame.id)
            return
        conn.out.append(Outgoing(ACK, frame.id, 0))
        record = Delivery(now, frame.first_rx_ns, frame.bytes, now - frame.tx_ns)  # the sender's first byte to our last
        self.unexpected += not self.plan.deliver(frame.id, frame.bytes, record)

    # -- the loop ----------------------------------------------------------------------------------------
    def run(self) -> HostResult:
        self.t0 = eventloop.wait_for_go([self], self.dir, self.cfg.ready_timeout_s, lambda: self.stop)
        deadline = self.t0 + self.cfg.deadline_s * 1e9
        done_written = False
        while not self.stop:
            now = time.monotonic_ns()
            if now >= deadline:
                break
            for m in self.plan.due(self.t0, now):
                self.post(m, now)
            if not done_written and self.plan.finished():
                (self.dir / f"{self.host}.done").write_text("")
                done_written = True
            wake = min(now + IDLE_WAIT_S * 1e9, max(self.t0, self.plan.next_ns(self.t0)), deadline)
            wait = (wake - time.monotonic_ns()) / 1e9
            events = self.sel.select(max(0.0, wait))
            if wait > 0 and not events:
                self.lateness.add((time.monotonic_ns() - wake) / 1e3)  # woken by the timer: how late?
            for key, mask in events:
                if key.data is None:
                    self.accept()
                else:
                    self.serve(key.data, mask, time.monotonic_ns())
        return self.result()

    def result(self) -> HostResult:
        infos = [(conn, tcp_info(conn.sock)) for conn in self.conns]
        sending = [i for conn, i in infos if conn.key is not None]
        receiving = [i for conn, i in infos if conn.key is None]
        return HostResult(
            **serve.common_result(self),
            rx=Rx(packets=sum(i.data_segs_in for i in receiving), out_of_order=sum(i.rcv_ooopack for i in receiving)),
            tx=Tx(data_packets=sum(i.data_segs_out for i in sending), retransmits=sum(i.total_retrans for i in sending),
                  timeouts=sum(i.total_rto for i in sending), spurious=sum(i.dsack_dups for i in sending),
                  send_errors=self.failed),
            cc={f"{conn.key[0]}/{conn.key[1]}": {
                "algorithm": congestion_control(conn.sock), "cwnd": i.snd_cwnd, "ssthresh": i.snd_ssthresh,
                "srtt_us": i.rtt, "min_rtt_us": i.min_rtt, "delivery_rate_bps": i.delivery_rate * 8,
                "delivered_ce": i.delivered_ce, "reord_seen": i.reord_seen}
                for conn, i in infos if conn.key is not None})


def main(argv: list[str] | None = None) -> int:
    """Run one host's TCP agent until done and stopped (SIGTERM) or its deadline; write `<host>.json`."""
    config, hosts = serve.parse_args(argv, "python -m traffic.tcpagent")
    if len(hosts) != 1:
        raise SystemExit("traffic.tcpagent serves one host per process")
    tcp = TcpAgent(config, hosts[0])
    eventloop.on_stop_signals(lambda: setattr(tcp, "stop", True))
    tcp.open()
    tcp.run().write(Path(config.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
