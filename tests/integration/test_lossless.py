"""Integration tier: lossless links (emulator.net.pause) on real OVS ports and real agents. An incast that drops on
a lossy fabric loses nothing on a lossless one with the same queues and timeout, and its pauses spread upstream; a
paused egress lets at most one frame by and sends again within a packet time of its resume, judged from the
frames on the wire and the kernel's class counters, not from the pause thread's own word."""

from __future__ import annotations

import csv
import re
import socket
import subprocess
import sys
import time

import pytest

from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.net import features
from emulator.net.emulation import Emulation
from emulator.net.sniff import Sniffer
from emulator.run.job import run_job
from tests.integration.helpers import REPO
from traffic.netns import entered
from traffic.options import TransportOptions

pytestmark = [pytest.mark.root,
              pytest.mark.skipif(not features.detect().lossless, reason="no eBPF marker or TBF: no lossless links")]

ETHERTYPE = 0x88B6  # a local-experiment ethertype: frames the switch has no rule for


def _incast(lossless: bool, tmp_path):
    """15 -> 1 at 4 Mbit/s: the two frames of headroom per feeder (36 ms) outlast the pause thread's slowest
    reaction in an emulated guest (TCG: p99 20-26 ms, max 31; at 10 Mbit/s such a stall overran the headroom and
    dropped 18-24 packets)."""
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, queue_kb=256, lossless=lossless,
                              link_mbps=4)
    hosts = fabric.hosts()
    messages = [Message(i, 0.0, src, hosts[0], 256 * 1024) for i, src in enumerate(hosts[1:])]
    # 8 packets a sender: at 4, a spine's port to the receiver's leaf could hold 12-20 frames (3-5 flows), below
    # its XOFF (22): the second hop's pauses had come from the marker's queue creeping a frame above the real one per
    # pause
    options = TransportOptions(cc="none", window=8, min_rto_ms=5000)  # 277 packet times, as 2 s at 10 Mbit/s
    return fabric, run_job(fabric, messages, tmp_path / ("lossless" if lossless else "lossy"), options=options,
                           quiet=True)


@pytest.mark.stock_kernel
def test_an_incast_that_drops_on_a_lossy_fabric_loses_nothing_on_a_lossless_one(tmp_path):
    _fabric, lossy = _incast(False, tmp_path)
    assert lossy.queue_drops > 0 and lossy.packets.retransmits > 0, (lossy.queue_drops, lossy.packets)
    assert not lossy.pauses

    fabric, m = _incast(True, tmp_path)
    assert m.lost_messages == 0
    assert m.queue_drops == 0, m.queue_drops_by_port  # the qdiscs of every switch port and host NIC
    # every data packet sent arrived: none lost anywhere else, the switch daemons' sends included; a resend is of
    # a packet that had arrived (an emulated guest's CPU stall can make RACK misjudge one: 0-2 in 450 there)
    assert m.packets.received == m.packets.data + m.packets.retransmits, m.packets
    assert m.packets.retransmits == m.packets.spurious == m.packets.duplicates <= 0.01 * m.packets.data, m.packets
    assert m.packets.timeout_lost == 0, m.packets
    assert m.packets.send_errors == 0  # the hosts' sockets: a full NIC queue held the agent back instead
    assert 0 < m.queues["max_bytes"] <= fabric.queue_bytes, m.queues
    assert m.pauses["events"] > 0 and not m.pauses["errors"], m.pauses
    # the receiver's leaf paused the spines, and a spine paused the other leaves' uplinks: the second hop
    leaf = fabric.nic_links(fabric.hosts()[0])[0][0]
    paused = set(m.pauses["ports"])
    spines = {s for s in fabric.graph[leaf] if fabric.node(s)["kind"] == "switch"}
    assert paused & {fabric.intf(s, leaf) for s in spines}, paused
    assert paused & {fabric.intf(other, s) for s in spines for other in fabric.graph[s] if other != leaf}, paused
    rows = (tmp_path / "lossless" / "pauses.csv").read_text().splitlines()
    assert rows[0].startswith("t_s,event,port") and any(",pause," in r for r in rows[1:])


def test_per_class_pauses_hold_the_incasts_class_and_let_another_class_by(tmp_path):
    """PFC's priorities: with a queue per traffic class, an incast in class 1 pauses class 1 of the queues that
    feed its receiver (losing nothing), and a flow in class 0 to the same receiver is never paused: it gets its
    equal share of the receiver's link, where one FIFO would hold it behind the incast's pauses."""
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, queue_kb=256, lossless=True,
                              queueing="class")
    hosts = fabric.hosts()
    size = 512 * 1024
    messages = [Message(i, 0.0, src, hosts[0], size, tclass=1) for i, src in enumerate(hosts[2:])]
    messages.append(Message(len(messages), 0.0, hosts[1], hosts[0], size, tclass=0))
    options = TransportOptions(cc="none", window=4, min_rto_ms=2000)
    m = run_job(fabric, messages, tmp_path, options=options, quiet=True)
    assert m.lost_messages == 0 and m.queue_drops == 0, m.queue_drops_by_port
    assert m.packets.retransmits == m.packets.timeouts == m.packets.send_errors == 0, m.packets
    assert m.pauses["events"] > 0 and not m.pauses["errors"], m.pauses
    paused = set(m.pauses["ports"])
    assert all(name.endswith("/tc1") for name in paused), paused
    leaf = fabric.nic_links(hosts[0])[0][0]
    spines = [s for s in fabric.graph[leaf] if fabric.node(s)["kind"] == "switch"]
    assert paused & {f"{fabric.intf(other, s)}/tc1" for s in spines for other in fabric.graph[s] if other != leaf}
    with (tmp_path / "messages.csv").open() as rows:
        done = {int(r["id"]): float(r["completion_s"]) for r in csv.DictReader(rows)}
    half_link_s = size * 8 / (fabric.rate(leaf, hosts[0]) / 2)
    assert done[len(messages) - 1] <= 1.5 * half_link_s < 0.5 * max(done.values()), done


def _class_bytes(netns: str, intf: str, classid: str = "1:1") -> int:
    """What the kernel says a shaped class of `intf` (1:1, the FIFO gate's parent) has sent."""
    shown = subprocess.run(["nsenter", f"--net={netns}", "tc", "-s", "class", "show", "dev", intf],
                           capture_output=True, text=True, check=True).stdout  # this tc has no JSON for classes
    return int(re.search(rf"^class \S+ {classid} .*\n Sent (\d+) bytes", shown, re.M).group(1))


def test_a_paused_class_holds_its_own_frames_only():
    """On a NIC with a queue per class, pausing class 1 lets at most one of its frames by (tc's class counters)
    while class 0's frames go on at the link rate; resumed, class 1's go too."""
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=1, lossless=True, queueing="class")
    host, peer = fabric.hosts()[:2]
    leaf = fabric.nic_links(host)[0][0]
    nic = fabric.intf(host, leaf)
    frame = fabric.mtu + wire.ETH
    packet_s = frame * 8 / fabric.rate(host, leaf)
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        netns = emu.netns(host)
        socks = {}
        with entered(netns):
            for tclass in (0, 1):
                socks[tclass] = socket.socket(socket.AF_INET, socket.SOCK_RAW, 253)  # an experimental protocol
                socks[tclass].setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tclass << 5)
                socks[tclass].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        sent = {c: _class_bytes(netns, nic, c) for c in ("1:10", "1:11")}
        emu.net.pauses.hold([f"{nic}/tc1"], True)
        for _ in range(10):
            for sock in socks.values():
                sock.sendto(bytes(fabric.mtu - 20), (fabric.ip(peer), 0))
        time.sleep(25 * packet_s)
        paused = {c: _class_bytes(netns, nic, c) - sent[c] for c in sent}
        emu.net.pauses.hold([f"{nic}/tc1"], False)
        time.sleep(15 * packet_s)
        resumed = _class_bytes(netns, nic, "1:11") - sent["1:11"]
        for sock in socks.values():
            sock.close()
    assert paused["1:11"] <= frame, paused
    assert paused["1:10"] >= 10 * (fabric.mtu - 20), paused  # class 0's ten frames all left
    assert resumed >= 10 * (fabric.mtu - 20), resumed


def test_a_paused_egress_lets_one_frame_by_and_resumes_within_a_packet_time():
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=1, lossless=True)
    host = fabric.hosts()[0]
    leaf = fabric.nic_links(host)[0][0]
    nic, port = fabric.intf(host, leaf), fabric.intf(leaf, host)
    frame = fabric.mtu + wire.ETH
    packet_ns = frame * 8 / fabric.rate(host, leaf) * 1e9
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        gates = emu.net.pauses
        with entered(emu.netns(host)):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        sock.bind((nic, 0))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        payload = bytes.fromhex("02" + "00" * 5) + bytes(6) + ETHERTYPE.to_bytes(2, "big") + bytes(fabric.mtu)
        with Sniffer({port: emu.netns(leaf)}) as sniff:
            gates.hold([nic], True)
            before = _class_bytes(emu.netns(host), nic)
            for _ in range(20):  # 20 packet times of frames wait in the NIC's queue
                sock.send(payload)
            time.sleep(20 * packet_ns / 1e9)
            held = _class_bytes(emu.netns(host), nic) - before
            resumed = time.time_ns()
            gates.hold([nic], False)
            time.sleep(25 * packet_ns / 1e9)
        sock.close()
    arrived = [f.at_ns for f in sniff.on(port, outgoing=False) if f.ethertype == ETHERTYPE]
    after = [t for t in arrived if t >= resumed]
    assert held <= frame, held
    assert len(arrived) == 20 and len(after) >= 19, (len(arrived), len(after))
    assert after[0] - resumed <= packet_ns, (after[0] - resumed) / packet_ns
    gaps = sorted(b - a for a, b in zip(after, after[1:], strict=False))
    assert 0.8 * packet_ns <= gaps[len(gaps) // 2] <= 1.2 * packet_ns  # and at the link rate, not a burst


def test_lossless_on_the_default_fabric_sizes_its_queues_and_says_so(tmp_path):
    """`mpft traffic incast -p senders=12 --lossless` was refused on the default fabric (a leaf port's headroom for
    its feeders left less than two frames below XOFF in 128 KiB): with no --queue-kb the queues are sized, the run
    says to what and why, and the incast loses nothing."""
    run = subprocess.run([sys.executable, "-m", "emulator.cli", "traffic", "incast", "-p", "senders=12", "--lossless",
                          "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    sized = re.search(r"lossless: queues of (\d+) KiB, sized for (\S+) to (\S+)'s (\d+) feeders", run.stdout)
    assert sized and int(sized[1]) > 128, run.stdout[-2000:]
    assert "lost messages 0" in run.stdout
