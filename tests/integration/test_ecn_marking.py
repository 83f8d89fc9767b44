"""Integration tier: ECN marking without RED (the eBPF marker, emulator.net.marking) on real OVS ports, with DCQCN
agents answering the marks: what the switches marked is what the receivers saw, DCQCN holds an incast's queue near
kmax, the marker outlives a link's repair, and its maps go with the run."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import socket
import struct
import subprocess

import pytest

from emulator.analysis import bounds, feedback
from emulator.analysis.timeseries import read_timeseries
from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.model.stats import percentiles
from emulator.net import features, marking
from emulator.net.emulation import Emulation
from emulator.run.job import run_job
from tests.conftest import NEWER_KERNEL
from tests.integration.helpers import stock
from traffic.netns import entered
from traffic.options import TransportOptions

BPF_PROG_TEST_RUN, BPF_PROG_GET_FD_BY_ID = 10, 13
SKB_CTX_SIZE, SKB_IFINDEX, SKB_PRIORITY = 192, 40, 32  # sizeof(struct __sk_buff); offsets of ifindex, priority

pytestmark = pytest.mark.root
STOCK = pytest.mark.stock_kernel  # the marker on an older kernel; not the control loop's dynamics, which a slow
# (emulated) guest's CPU cannot keep


@functools.cache
def _with_bpf_marker() -> features.Features:
    return features.decide(features.probe(), "bpf")


@pytest.fixture(autouse=True)
def bpf_marker(monkeypatch):
    """The eBPF marker, also where the kernel has RED (auto would take RED there: MPFT_ECN_MARKER=bpf)."""
    chosen = _with_bpf_marker()
    stock("eBPF marker", chosen.ecn_marker == "bpf")
    monkeypatch.setattr(features, "_cached", chosen)


def _fabric():
    return topologies.build("ft2", leaves=3, hosts_per_leaf=4, spines=2, ecn=True)


@STOCK
@pytest.mark.parametrize("marker", ["bpf", "red"])
def test_dcqcn_answers_the_marks_the_switches_made(marker, monkeypatch, tmp_path):
    """An 8 -> 1 incast with one packet in flight per queue pair: the receiver's downlink queues up to eight
    packets, past the marking thresholds and short of a drop, so every packet marked arrives marked; with the eBPF
    marker and with RED where the kernel has it (MPFT_ECN_MARKER; RED's marks read from its own statistics)."""
    if marker == "red":
        chosen = features.decide(features.probe(), "red")
        stock("RED qdisc", chosen.ecn_marker == "red")
        monkeypatch.setattr(features, "_cached", chosen)
    fabric = _fabric()
    hosts = fabric.hosts()
    messages = [Message(i, 0.0, src, hosts[0], 200_000) for i, src in enumerate(hosts[4:])]
    m = run_job(fabric, messages, tmp_path, options=TransportOptions(cc="ecn"), quiet=True)
    # nothing dropped: a resend is only a spurious timeout's (an emulated guest's round trip beyond the RTO, 6 of
    # 184 packets in one make vm-check), whose original arrived
    assert m.lost_messages == 0 and m.queue_drops == 0, m.queue_drops_by_port
    assert m.packets.timeout_lost == 0 and m.packets.retransmits == m.packets.timeout_spurious, m.packets
    assert m.ecn["marked"] > 0 and m.ecn["ce_received"] == m.ecn["marked"], m.ecn
    assert m.ecn["cnps_received"] == m.ecn["cnps_sent"] > 0
    assert m.ecn.get("marker_peak_bytes", 0) <= fabric.queue_bytes  # the eBPF marker's alone
    # eight senders share a 14.5-packet queue: each sees it under twice per drain, and the verdict says so
    assert m.fidelity.feedback_per_drain == pytest.approx(fabric.queue_bytes / (fabric.mtu + 14) / 8)
    assert "SPARSE FEEDBACK: 8 senders share h0's downlink" in m.fidelity.verdict
    assert not list(marking.PIN_DIR.glob("mpft_ecn_*"))  # the maps went with the run


def test_dcqcn_holds_an_overfilling_incast_near_kmax_once_its_marks_are_back(tmp_path):
    """Incast 15 -> 1 of 4 MB each at MTU 1500, 6 packets in flight per queue pair: 90 packets for an 87-packet
    queue, so the window does not bound it (cc none's p99 is 99 %: benchmarks/marking.py). Senders start at line
    rate and overfill it before any mark is back; from then on DCQCN holds its p99 within kmax + 2 MTU, and the
    incast completes within 1.10x its bound."""
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, ecn=True, mtu=1500)
    hosts = fabric.hosts()
    messages = [Message(i, 0.0, src, hosts[0], 4_096_000) for i, src in enumerate(hosts[1:])]
    m = run_job(fabric, messages, tmp_path, options=TransportOptions(cc="ecn", window=6), quiet=True)
    assert m.lost_messages == 0
    kmin, kmax, _ = fabric.ecn_thresholds
    _, queue = (read_timeseries(tmp_path / "timeseries.csv") or {})["queue_bytes"][fabric.intf("p0l0", hosts[0])]
    start = feedback.settled(queue, kmin, kmax)
    assert start and max(queue[:start]) >= kmax, queue  # it overfilled at first, then settled
    assert percentiles(queue[start:])["p99"] <= kmax + 2 * (fabric.mtu + wire.ETH), queue
    assert m.completion_s <= 1.10 * bounds.lower_bound_s(fabric, messages)


@STOCK
def test_the_marker_is_back_on_a_repaired_port():
    fabric = _fabric()
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        assert emu.net.verify_marking() == []
        emu.fail_link("p0l0", "p0s0")
        emu.restore()  # raises if shaping or the marker is not back in place
        assert emu.net.verify_marking(["p0l0", "p0s0"]) == []
        assert set(emu.ecn_marks()) == {fabric.intf(sw, peer) for sw in fabric.switches() for peer in fabric.graph[sw]}


def _packet(ecn: int, tclass: int = 0) -> bytes:
    """An Ethernet frame holding an IPv4 UDP datagram with the given ECN field and traffic class (IP precedence),
    checksum as a host sends it."""
    header = bytearray(struct.pack("!BBHHHBBH4s4s", 0x45, tclass << 5 | ecn, 48, 1, 0, 64, 17, 0, bytes([10, 0, 0, 1]),
                                   bytes([10, 0, 0, 2])))
    total = sum(struct.unpack("!10H", header))
    header[10:12] = struct.pack("!H", ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF)
    return bytes(6) + bytes(6) + b"\x08\x00" + bytes(header) + struct.pack("!HHHH", 1, 4791, 28, 0) + bytes(20)


@pytest.fixture(params=["cookie", "ifindex"])
def loaded(tmp_path, monkeypatch, request):
    """The marker on a veth of a throwaway namespace: its program (by id from tc), port entry and counts; built
    both ways: ports known by namespace cookie and index (Linux 6.15 on), and by index alone (before: tc programs
    have no bpf_get_netns_cookie)."""
    if request.param == "cookie" and not marking.by_cookie():
        pytest.skip(f"{NEWER_KERNEL}: tc programs get bpf_get_netns_cookie from Linux 6.15")
    monkeypatch.setattr(marking, "_by_cookie", request.param == "cookie")
    netns = f"mpft-test-ecn-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", netns], check=True)
    try:
        subprocess.run(["ip", "-n", netns, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True)
        note = tmp_path / "bpffs-mounted"
        marking.mount_bpffs(note)
        marking.remove_pins()
        obj = marking.build(tmp_path)
        enter = ["nsenter", f"--net=/run/netns/{netns}"]
        subprocess.run(enter + ["tc", "-batch", "-"], input="".join(f"{x}\n" for x in marking.tc_lines("va", obj)),
                       text=True, check=True)
        shown = json.loads(subprocess.run(enter + ["tc", "-j", "filter", "show", "dev", "va", "egress"],
                                          capture_output=True, text=True, check=True).stdout)
        prog = next(f["options"]["prog"]["id"] for f in shown if "options" in f)
        with entered(f"/run/netns/{netns}"):
            cookie, ifindex = marking.netns_cookie(), socket.if_nametoindex("va")
        marker = marking.Marker({"va": ((cookie, ifindex), 0.0)}, marking.Thresholds(100_000, 20_000, 60_000, 0.5),
                                burst=0)
        fd = marking._bpf(BPF_PROG_GET_FD_BY_ID, struct.pack("=I", prog))
        yield netns, ifindex, fd, marker
        os.close(fd)
        marker.close()
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False)
        marking.remove_pins()
        marking.unmount_bpffs(note)


def _run_at(fd: int, marker: marking.Marker, ifindex: int, backlog: int, ecn: int) -> bytes:
    """One run of the program on a packet arriving at `backlog` (the port's rate is 0: nothing drains)."""
    key = marking.SLOT.pack(0)
    fields = list(marking.PORT.unpack(marker.port_map.lookup(key, marking.PORT.size)))
    fields[2] = backlog
    marker.port_map.update(key, marking.PORT.pack(*fields))
    return _run(fd, ifindex, _packet(ecn))


def _run(fd: int, ifindex: int, data: bytes, priority: int = 0) -> bytes:
    out, ctx = ctypes.create_string_buffer(256), ctypes.create_string_buffer(SKB_CTX_SIZE)
    struct.pack_into("=I", ctx, SKB_IFINDEX, ifindex)
    struct.pack_into("=I", ctx, SKB_PRIORITY, priority)
    data_in = ctypes.create_string_buffer(data, len(data))
    attr = struct.pack("=IIIIQQIIIIQQ", fd, 0, len(data), len(out), ctypes.addressof(data_in), ctypes.addressof(out),
                       1, 0, SKB_CTX_SIZE, 0, ctypes.addressof(ctx), 0)
    marking._bpf(BPF_PROG_TEST_RUN, attr)
    return out.raw[:len(data)]


@STOCK
def test_the_marking_probability_follows_the_configured_curve(loaded):
    """The program itself, through BPF_PROG_TEST_RUN: none below kmin, pmax x the way from kmin to kmax, all from
    kmax; a packet that is not ECN-capable is never marked, and a marked one has a valid header checksum."""
    netns, ifindex, fd, marker = loaded
    runs = 1500
    with entered(f"/run/netns/{netns}"):
        for backlog in (19_999, 30_000, 40_000, 50_000, 60_000, 90_000):
            marked = sum(_run_at(fd, marker, ifindex, backlog, ecn=2)[15] & 3 == 3 for _ in range(runs))
            expected = marker.thresholds.probability(backlog)
            assert abs(marked / runs - expected) <= 4 * (expected * (1 - expected) / runs) ** 0.5 + 1e-9, backlog
        frame = _run_at(fd, marker, ifindex, 90_000, ecn=2)
        assert sum(struct.unpack("!10H", frame[14:34])) % 0xFFFF == 0  # the checksum still adds up
        assert all(_run_at(fd, marker, ifindex, 90_000, ecn=0)[15] & 3 == 0 for _ in range(50))
    assert marker.counts()["va"]["marked"] > 0


@STOCK
def test_a_port_queueing_per_class_keeps_shares_marks_and_reports_each_class_apart(loaded):
    """The program on a port with a queue per class: the drain since its last packet (put in by hand, the rate
    being 0) is shared among the classes as share_out says, the paused class keeps its backlog, the packet joins
    its own class's queue, is marked by that queue's depth alone, and passing xoff reports its class."""
    netns, ifindex, fd, marker = loaded
    key = marking.SLOT.pack(0)
    t = marker.thresholds  # kmin 20 kB, kmax 60 kB
    fields = list(marking.PORT.unpack(t.packed(0, xoff=66_000, classes=True)))
    queued = [0, 30_000, 0, 72_000, 5_000, 0, 0, 0]
    fields[11:] = queued
    marker.port_map.update(key, marking.PORT.pack(*fields))
    marker.classes = frozenset({"va"})
    marker.gate_map.update(key, marking.gate_entry(0, drained=12_000, paused=1 << 4))  # 12 kB sent since
    events = marking.XoffEvents()
    try:
        frame = _packet(ecn=2, tclass=3)
        with entered(f"/run/netns/{netns}"):
            out = _run(fd, ifindex, frame)
        after = list(marking.PORT.unpack(marker.port_map.lookup(key, marking.PORT.size)))[11:]
        expected, left = marking.share_out(queued, 1 << 4, 12_000)
        assert left == 0 and expected[1] == 24_000 and expected[4] == 5_000  # class 4 paused: none of it
        expected[3] += len(frame)
        assert after == expected
        assert out[15] & 3 == 3  # class 3's own queue (66 kB) is beyond kmax; with the frame, beyond xoff
        assert [(slot, tclass) for slot, tclass, _backlog, _at in events.take()] == [(0, 3)]
        with entered(f"/run/netns/{netns}"):
            assert all(_run(fd, ifindex, _packet(ecn=2, tclass=4))[15] & 3 == 2 for _ in range(50))  # 5 kB: ECT(0) kept
        assert events.take() == []  # class 4 is far below xoff, and class 3 was reported once
        assert marker.backlog("va", 4) == 5_000 + 50 * len(frame)
    finally:
        events.close()


@STOCK
def test_a_kick_frame_shares_out_the_drain_so_far_before_a_class_is_paused(loaded):
    """Pausing a class of a port that then sees no packet for long (its feeders are paused too) must not count
    the time before the pause as paused: the frame the pause thread sends first shares out what the port sent
    until then, and is itself neither queued nor counted."""
    netns, ifindex, fd, marker = loaded
    key = marking.SLOT.pack(0)
    fields = list(marking.PORT.unpack(marker.thresholds.packed(0, classes=True)))
    fields[11] = 50_000  # class 0
    marker.port_map.update(key, marking.PORT.pack(*fields))
    marker.classes = frozenset({"va"})
    marker.gate_map.update(key, marking.gate_entry(0, drained=12_000))  # sent while class 0 ran
    with entered(f"/run/netns/{netns}"):
        _run(fd, ifindex, _packet(ecn=0), priority=marking.KICK_PRIORITY)
        marker.set_paused("va", 0, True)
        marker.gate_map.update(key, marking.gate_entry(0, drained=30_000, paused=1))  # sent while it was held
        _run(fd, ifindex, _packet(ecn=0, tclass=1))
    queued = marking.PORT.unpack(marker.port_map.lookup(key, marking.PORT.size))[11:]
    assert queued[0] == 38_000, queued  # without the kick: 50,000, the whole 30,000 counted as paused
    assert queued[1] == len(_packet(ecn=0)), queued  # a burst of 0 keeps no tokens from the unspent drain
    assert marker.counts()["va"]["queued"] == 1  # the class-1 frame; not the kick


@STOCK
def test_a_resync_brings_the_programs_queue_to_the_real_one_and_the_program_marks_by_it(loaded):
    """The program's queue lags the real one (its port sent below its rate): a resync sets it to the real backlog
    and brings its drain up to date (nothing is drained twice), the program's next packet joins and is marked by
    it; off by a frame or less it is left as it is, a queue the program holds that the real one no longer does is
    emptied, and a port queueing per class is left alone."""
    netns, ifindex, fd, marker = loaded
    key = marking.SLOT.pack(0)
    fields = list(marking.PORT.unpack(marker.thresholds.packed(0)))
    fields[2] = 50_000
    marker.port_map.update(key, marking.PORT.pack(*fields))
    marker.gate_map.update(key, marking.gate_entry(0, drained=12_000))  # drained since; the rate is 0
    assert marker.backlog("va") == 38_000
    assert marker.resync({"va": 65_000}, tolerance=1_514) == {"va": -27_000}
    assert marker.backlog("va") == 65_000
    frame = _packet(ecn=2)
    with entered(f"/run/netns/{netns}"):
        assert _run(fd, ifindex, frame)[15] & 3 == 3  # 65 kB is beyond kmax (60 kB); 38 kB would mark half the time
    assert marker.backlog("va") == 65_000 + len(frame)
    assert marker.resync({"va": 66_000}, tolerance=1_514) == {"va": len(frame) - 1_000}
    assert marker.backlog("va") == 65_000 + len(frame)  # within the tolerance: not written
    assert marker.resync({"va": 0}, tolerance=1_514) == {"va": 65_000 + len(frame)}
    assert marker.backlog("va") == 0
    assert marker.resync({"va": 0}, tolerance=1_514) == {}
    marker.classes = frozenset({"va"})
    assert marker.resync({"va": 30_000}, tolerance=1_514) == {}
