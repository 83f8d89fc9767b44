"""Lossless links: a switch port whose backlog passes XOFF pauses every port feeding it, which then holds its
packets in its own queue (so its backlog grows and it may pause its feeders in turn, hop by hop to the hosts),
until the port's backlog is back at XON. Head-of-line blocking and pause spreading come from this alone.

The eBPF program at every switch port (ecn_marker.bpf.c) keeps the port's backlog and reports it passing XOFF
on a ring buffer; the PauseController thread here pauses the feeders and works out, from the drain rate, when
the backlog will reach XON, and looks again then. A feeder is paused by turning its queue's TBF gate
(emulator.net.shaping) to a trickle over rtnetlink, which lets at most one frame through, and resumed by opening
it again and waking its qdisc with a frame the qdisc drops; its own backlog in the program stops draining while
it is paused. A host's NIC is a feeder too: its queue is deep, and its agent's socket buffer fills before it.
On a fabric queueing per traffic class (`queueing = "class"`) all of this is per class, as PFC pauses per
priority: a class's queue passing XOFF pauses the same class of its feeders (each class has its own gate, host
NICs included), and the other classes go on.
"""

from __future__ import annotations

import heapq
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from emulator.model.fabric import RESUME_RATE
from emulator.net.marking import KICK_PRIORITY, Marker, XoffEvents
from emulator.net.qdiscs import ATTR, HEADER, TCMSG
from traffic.netns import entered

RTM_NEWQDISC, NLM_F_REQUEST, NLMSG_ERROR = 36, 0x1, 2
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_TBF_PARMS, TCA_TBF_RATE64, TCA_TBF_BURST = 1, 4, 6
TC_LINKLAYER_ETHERNET = 1
RATESPEC = struct.Struct("=BBHhHI")  # struct tc_ratespec: cell_log, linklayer, overhead, cell_align, mpu, rate
TRICKLE = 8  # a paused gate's rate, bytes per second: its first frame goes, the next would take hours
LEAF_MINOR, FIFO_MINOR, CLASS_BASE = 0x10, 1, 0x10  # the gate: qdisc 10: under class 1:1 (shaping.LEAF), or
# per class c: qdisc (10 + c): under class 1:(10 + c) (shaping.CLASS_BASE)
KICK_FRAME = bytes(12) + b"\x88\xb5" + bytes(46)  # a local-experiment ethertype; dropped before any wire
HOST_QUEUE_BYTES = 16 << 20  # a lossless host NIC's queue: more than its agent's socket buffers hold
SHORTEST_WAIT_S = 0.001  # epoll waits in milliseconds: shorter waits sleep instead
SWITCH_INTERVAL_S = 0.0002
REALTIME_PRIORITY = 2


def _attr(kind: int, payload: bytes) -> bytes:
    length = ATTR.size + len(payload)
    return ATTR.pack(length, kind) + payload + bytes(-length % 4)


def queue_name(intf: str, tclass: int | None) -> str:
    """How a port's queue is named in pause points, gates and counts: the interface, or per class `intf/tcN`."""
    return intf if tclass is None else f"{intf}/tc{tclass}"


def interface_of(name: str) -> str:
    return name.partition("/")[0]


def tbf_change(ifindex: int, rate_bytes: int, burst: int, limit: int, tclass: int | None = None) -> bytes:
    """An rtnetlink request changing a port's gate (of `tclass` on a port queueing per class) to `rate_bytes` per
    second with `burst` and `limit` bytes (no acknowledgement asked for: errors still come back)."""
    handle, parent = (LEAF_MINOR, FIFO_MINOR) if tclass is None else (CLASS_BASE + tclass,) * 2
    spec = RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, 0, 0, min(rate_bytes, 0xFFFFFFFF))
    options = (_attr(TCA_TBF_PARMS, spec + RATESPEC.pack(0, 0, 0, 0, 0, 0) + struct.pack("=III", limit, 0, 0))
               + _attr(TCA_TBF_BURST, struct.pack("=I", burst)))
    if rate_bytes > 0xFFFFFFFF:
        options += _attr(TCA_TBF_RATE64, struct.pack("=Q", rate_bytes))
    body = (TCMSG.pack(0, ifindex, handle << 16, 1 << 16 | parent, 0) + _attr(TCA_KIND, b"tbf\0")
            + _attr(TCA_OPTIONS, options))
    return HEADER.pack(HEADER.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST, 0, 0) + body


@dataclass
class Gate:
    """An egress (or one class of it) that can be paused: a switch port (`marked`: the program keeps its backlog)
    or a host NIC."""

    intf: str
    netns: str | None  # the path of its namespace
    rate_bps: float
    burst: int  # its gate's bucket, bytes (emulator.net.shaping.gate_burst)
    limit: int  # its queue, bytes
    marked: bool
    tclass: int | None = None  # the class, on a port queueing per class
    ifindex: int = 0
    pauses: int = 0
    paused_ns: int = 0
    paused_since: int = 0  # 0: running


@dataclass
class PausePoint:
    """A switch port (or one class of it) that pauses its feeders: its thresholds (bytes), the gates feeding it,
    its rate and frame, its interface and class."""

    xoff: int
    xon: int
    feeders: list[str]
    rate_bps: float = 0.0
    frame: int = 0
    port: str = ""  # its interface ("": the point's name)
    tclass: int | None = None


@dataclass
class PauseBook:
    """Which ports are congested and which gates each holds paused; a gate runs again once no port holds it.
    Pure state, so the hysteresis is testable without a kernel."""

    points: dict[str, PausePoint]
    congested: set[str] = field(default_factory=set)
    held_by: dict[str, set[str]] = field(default_factory=dict)

    def xoff(self, port: str) -> list[str]:
        """The port passed XOFF: the gates that must pause now (none if it was congested already)."""
        if port in self.congested:
            return []
        self.congested.add(port)
        newly = []
        for gate in self.points[port].feeders:
            holders = self.held_by.setdefault(gate, set())
            if not holders:
                newly.append(gate)
            holders.add(port)
        return newly

    def xon(self, port: str) -> list[str]:
        """The port is back at XON: the gates that may run again now."""
        if port not in self.congested:
            return []
        self.congested.discard(port)
        newly = []
        for gate in self.points[port].feeders:
            holders = self.held_by.get(gate, set())
            holders.discard(port)
            if not holders:
                newly.append(gate)
        return newly

    def observe(self, port: str, backlog: int) -> tuple[list[str], list[str]]:
        """(gates to pause, gates to resume) for a port seen at `backlog`: above XOFF it pauses, and only at or
        below XON does it release."""
        point = self.points[port]
        if port not in self.congested and backlog > point.xoff:
            return self.xoff(port), []
        if port in self.congested and backlog <= point.xon:
            return [], self.xon(port)
        return [], []

    def paused(self, gate: str) -> bool:
        return bool(self.held_by.get(gate))


class PauseController:
    """The thread pausing and resuming gates for the ports the program reports (see the module docstring)."""

    def __init__(self, marker: Marker, points: dict[str, PausePoint], gates: dict[str, Gate]) -> None:
        self.marker, self.gates = marker, gates
        self.book = PauseBook(points)
        self.events = XoffEvents()
        self.netlink: dict[str | None, socket.socket] = {}
        self.kick: dict[str, socket.socket] = {}
        self.messages: dict[str, tuple[bytes, bytes]] = {}  # gate -> (pause, resume) requests
        for name, gate in gates.items():
            with entered(gate.netns):
                if gate.netns not in self.netlink:
                    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
                    sock.setblocking(False)
                    self.netlink[gate.netns] = sock
                gate.ifindex = socket.if_nametoindex(gate.intf)
                if gate.intf not in self.kick:
                    kick = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
                    kick.bind((gate.intf, 0))
                    kick.setsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY, KICK_PRIORITY)
                    kick.setblocking(False)
                    self.kick[gate.intf] = kick
            opened = round(gate.rate_bps / 8 * RESUME_RATE)
            self.messages[name] = (tbf_change(gate.ifindex, TRICKLE, gate.burst, gate.limit, gate.tclass),
                                   tbf_change(gate.ifindex, opened, gate.burst, gate.limit, gate.tclass))
        for name, point in points.items():
            point.port = point.port or name
        # the program reports a port's slot and class (0 for a FIFO): the point it is
        self.reported = {(point.port, point.tclass or 0): name for name, point in points.items()}
        self.timers: list[tuple[int, str]] = []
        self.errors: list[str] = []
        self.reactions_ns: list[int] = []  # from the program's report to the feeders' gates changed
        self.log: list[tuple[int, str, str, int]] = []  # (monotonic ns, xoff/xon/pause/resume, port or gate, bytes)
        self.cpu_s = 0.0
        self._lock = threading.Lock()  # the thread and hold() change gates
        self._stop = threading.Event()
        self._switch_interval = sys.getswitchinterval()
        self._thread = threading.Thread(target=self._loop, name="pause", daemon=True)

    def start(self) -> PauseController:
        # Python hands the interpreter between threads every 5 ms: the pause thread, woken by a report, would
        # wait that long for the run's other threads (measured: reaction p99 4.4 ms, against 1.8 ms at 0.5)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        sys.setswitchinterval(self._switch_interval)
        now = time.monotonic_ns()
        for gate in self.gates.values():
            if gate.paused_since:
                gate.paused_ns += now - gate.paused_since
                gate.paused_since = 0
        for sock in [*self.netlink.values(), *self.kick.values()]:
            sock.close()
        self.events.close()

    def set_rate(self, intf: str, rate_bps: float) -> None:
        """An egress re-rated (degraded or restored): its gates resume at the new rate, and the program's drain of
        a switch port follows unless the port is paused (a port paused per class drains on for the others)."""
        gates = [g for g in self.gates.values() if g.intf == intf]
        for gate in gates:
            gate.rate_bps = rate_bps
        for point in self.book.points.values():
            if point.port == intf:
                point.rate_bps = rate_bps
        if intf in self.marker.slots and not any(g.paused_since and g.tclass is None for g in gates):
            self.marker.set_rate(intf, rate_bps)

    def hold(self, names: Iterable[str], paused: bool) -> None:
        """Pause or resume gates by hand, with the changes a port's XOFF and XON make (a PFC storm's pause
        frames, or a test of the gates themselves); the ports' own pauses go on as before."""
        names = [n for n in names if self.gates[n].paused_since == 0] if paused else \
            [n for n in names if self.gates[n].paused_since and not self.book.paused(n)]
        self._apply(names, pause=paused)

    # -- the thread -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        # A switch reacts in hardware: this thread runs before the agents (SCHED_FIFO 1: traffic.eventloop),
        # which would otherwise hold a core for milliseconds before it is woken (measured: reaction p99 4.5 ms)
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(REALTIME_PRIORITY))
        except OSError:
            pass  # not root: the reaction times in the summary say what that cost
        poller = select.epoll()
        poller.register(self.events.fileno(), select.EPOLLIN)
        started = time.thread_time()
        try:
            while not self._stop.is_set():
                wait = 0.05
                if self.timers:
                    wait = max(0.0, (self.timers[0][0] - time.monotonic_ns()) / 1e9)
                if wait >= SHORTEST_WAIT_S:
                    poller.poll(min(wait, 0.05))
                elif wait > 0:
                    time.sleep(wait)
                for slot, tclass, backlog, at in self.events.take():
                    port = self.reported.get((self.marker.names.get(slot), tclass))
                    if port in self.book.points:
                        self.log.append((at, "xoff", port, backlog))
                        self._apply(self.book.xoff(port), pause=True, reported_at=at)
                        self._schedule(port)
                now = time.monotonic_ns()
                while self.timers and self.timers[0][0] <= now:
                    _when, port = heapq.heappop(self.timers)
                    self._check(port)
                self._read_errors()
                self.cpu_s = time.thread_time() - started
        finally:
            poller.close()

    def _queued(self, port: str) -> int:
        """The port's backlog less the frame it is sending: the program drains that frame over its packet time,
        the qdisc hands it on at once (so XON comes when the queue itself is down to it, not a packet later)."""
        point = self.book.points[port]
        return max(0, self.marker.backlog(point.port, point.tclass or 0) - point.frame)

    def _check(self, port: str) -> None:
        if port not in self.book.congested:
            return
        backlog = self._queued(port)
        _pause, resume = self.book.observe(port, backlog)
        if resume or port not in self.book.congested:
            self.log.append((time.monotonic_ns(), "xon", port, backlog))
            point = self.book.points[port]
            self.marker.clear_congested(point.port, point.tclass or 0)
            self._apply(resume, pause=False)
        else:
            self._schedule(port)

    def _schedule(self, port: str) -> None:
        """Look at a congested port again when its backlog should have drained to XON; a paused port does not
        drain, and is looked at again when it resumes. A class drains at the port's rate at most (it shares it
        with the others): looked at too early, it is looked at again."""
        gate = self.gates.get(port)
        if gate is not None and gate.paused_since:
            return
        rate = self.book.points[port].rate_bps / 8
        excess = self._queued(port) - self.book.points[port].xon
        delay = int(max(0, excess) / rate * 1e9) if rate else 1_000_000
        heapq.heappush(self.timers, (time.monotonic_ns() + max(delay, 20_000), port))

    def _apply(self, names: Iterable[str], pause: bool, reported_at: int = 0) -> None:
        names = list(names)
        if not names:
            return
        with self._lock:
            self._change(names, pause, reported_at)

    def _change(self, names: list[str], pause: bool, reported_at: int) -> None:
        by_netns: dict[str | None, list[bytes]] = {}
        for name in names:
            by_netns.setdefault(self.gates[name].netns, []).append(self.messages[name][0 if pause else 1])
        for netns, requests in by_netns.items():
            self.netlink[netns].send(b"".join(requests))  # one system call changes them all
        now = time.monotonic_ns()
        if reported_at:
            self.reactions_ns.append(now - reported_at)
        for name in names:
            gate = self.gates[name]
            self.log.append((now, "pause" if pause else "resume", name, 0))
            if pause:
                gate.pauses += 1
                gate.paused_since = now
                if gate.marked:
                    self._hold_drain(gate, True)
                continue
            self._kick(gate.intf)
            gate.paused_ns += now - gate.paused_since
            gate.paused_since = 0
            if gate.marked:
                self._hold_drain(gate, False)
                if name in self.book.congested:
                    self._schedule(name)

    def _kick(self, intf: str) -> None:
        """A frame its qdisc drops: the qdisc runs (serving a resumed gate), and the program at a switch port
        shares out what the port sent so far, before a class's pause or resume changes how it is shared."""
        try:
            self.kick[intf].send(KICK_FRAME)
        except OSError:
            pass  # dropped by its class, as meant: the qdisc ran

    def _hold_drain(self, gate: Gate, paused: bool) -> None:
        """The program's count of a paused switch port stops draining: the port's, or its class's share (what
        the port sent until now shared out first: on resume the kick frame has done that)."""
        if gate.tclass is None:
            self.marker.set_rate(gate.intf, 0 if paused else gate.rate_bps, gate.burst if paused else 0)
            return
        if paused:
            self._kick(gate.intf)
        self.marker.set_paused(gate.intf, gate.tclass, paused)

    def _read_errors(self) -> None:
        for netns, sock in self.netlink.items():
            while True:
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    break
                offset = 0
                while offset + HEADER.size <= len(data):
                    length, kind, *_ = HEADER.unpack_from(data, offset)
                    if kind == NLMSG_ERROR:
                        (code,) = struct.unpack_from("=i", data, offset + HEADER.size)
                        if code and len(self.errors) < 20:
                            self.errors.append(f"{netns or 'root namespace'}: tc change refused (errno {-code})")
                    offset += max(HEADER.size, (length + 3) & ~3)

    # -- results --------------------------------------------------------------------------------------
    def counts(self) -> dict[str, dict[str, float]]:
        """Per gate that ever paused: pause events and time paused (s) so far, as a switch's PFC counters."""
        now = time.monotonic_ns()
        return {name: {"pauses": g.pauses,
                       "paused_s": round((g.paused_ns + (now - g.paused_since if g.paused_since else 0)) / 1e9, 6)}
                for name, g in sorted(self.gates.items()) if g.pauses}

    def record(self) -> dict:
        """What summarise() reads, and what a cluster run merges: the gates' counts, the thread's
        CPU and errors, every reaction (ns) and the log."""
        return {"ports": self.counts(), "cpu_s": self.cpu_s, "errors": list(self.errors),
                "reactions_ns": list(self.reactions_ns), "log": list(self.log)}

    def summary(self) -> dict:
        """What a run's metrics say of its pauses: totals, per gate, the reaction from the program's report to
        the gates changed (µs), the thread's CPU and any change the kernel refused."""
        return summarise([self.record()])


class Pauses:
    """A run's pauses read the same on any fabric: a lossless one's controller, or none (a lossy fabric: empty)."""

    def __init__(self, controller: PauseController | None) -> None:
        self.controller = controller

    def summary(self) -> dict:
        """PauseController.summary, or {}."""
        return self.controller.summary() if self.controller else {}

    def record(self) -> dict:
        """What a cluster run merges (summarise): PauseController.record, or {}."""
        return self.controller.record() if self.controller else {}

    def paused_seconds(self) -> dict[str, float]:
        """Each egress ever paused: its time paused so far, s."""
        return {name: c["paused_s"] for name, c in self.controller.counts().items()} if self.controller else {}

    def log(self) -> list[tuple[int, str, str, int]]:
        """Every XOFF, XON, pause and resume so far: (monotonic ns, event, port or gate, backlog bytes)."""
        return list(self.controller.log) if self.controller else []


def summarise(parts: list[dict]) -> dict:
    """PauseController.summary's form from records (PauseController.record): one controller's, or every
    server's of a cluster run (gates are named apart)."""
    ports = dict(sorted((name, counts) for part in parts for name, counts in part["ports"].items()))
    reactions = sorted(ns for part in parts for ns in part["reactions_ns"])

    def pct(q: float) -> float:
        return round(reactions[min(len(reactions) - 1, int(q * len(reactions)))] / 1e3, 1) if reactions else 0.0
    return {"events": sum(p["pauses"] for p in ports.values()),
            "paused_s": round(sum(p["paused_s"] for p in ports.values()), 6),
            "reaction_us": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
            "cpu_s": round(sum(p["cpu_s"] for p in parts), 3),
            "errors": [e for part in parts for e in part["errors"]], "ports": ports}
