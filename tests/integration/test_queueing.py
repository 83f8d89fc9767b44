"""Integration tier: switch egress queues per traffic class and per queue pair (the paper's virtual output
queues). The emulator builds and verifies them at bring-up; two senders into one receiver land in separate
queues of the receiver's leaf port, split by traffic class or by queue pair."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from emulator.model import topologies
from emulator.model.schedule import Message
from emulator.net import shaping
from emulator.net.commands import in_netns, run_tool
from emulator.net.emulation import Emulation
from emulator.net.qdiscs import QdiscReader
from emulator.net.switchd import netns_path
from emulator.run.launch import transfer
from traffic.netns import entered

pytestmark = pytest.mark.root
SIZE = 200_000


def _bytes_per_queue(emu, switch: str, intf: str) -> dict[str, int]:
    """Bytes each leaf queue under our HTB has sent, keyed by its parent class."""
    out = run_tool(in_netns("tc", emu.switch_netns(switch)) + ["-s", "-j", "qdisc", "show", "dev", intf])
    return {q["parent"]: q["bytes"] for q in json.loads(out) if q.get("parent", "").startswith("1:")}


@pytest.mark.parametrize("queueing", ["class", "voq"])
def test_two_senders_into_one_port_use_their_own_queues(tmp_path, queueing):
    fabric = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2, queueing=queueing)
    messages = [Message(0, 0.0, "n0g0", "n2g0", SIZE, tclass=0, qp=1),
                Message(1, 0.0, "n1g0", "n2g0", SIZE, tclass=3, qp=2)]
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        leaf = fabric.nic_on_plane("n2g0", 0)
        port = fabric.intf(leaf, "n2g0")
        before = _bytes_per_queue(emu, leaf, port)
        m = transfer(emu, messages, tmp_path, quiet=True)
        sent = {k: v - before.get(k, 0) for k, v in _bytes_per_queue(emu, leaf, port).items()}
    assert m.lost_messages == 0
    first, second = ((shaping.CLASS_BASE, shaping.CLASS_BASE + 3) if queueing == "class"
                     else (shaping.VOQ_BASE + 1, shaping.VOQ_BASE + 2))
    for minor in (first, second):
        assert sent[f"1:{minor:x}"] > SIZE, sent  # each message through its own queue, headers included
    assert sum(sent.values()) < 2.2 * SIZE, sent  # and nothing else of size through the port


@pytest.mark.parametrize("queueing", ["fifo", "voq"])
def test_netlink_backlogs_are_what_tc_shows(queueing):
    """The queue exporter reads backlogs over netlink in each namespace: on a port shaped to 8 kbit/s with
    packets standing in its queues, it reads what `tc -s qdisc show` reads, queue by queue."""
    ns, shape = "mpfttest-qdisc", shaping.Shape(8000, 1500, 30000, 0, 0, False, queueing)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:  # no IPv6 chatter joins the queues between the two readings
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
                        "net.ipv6.conf.default.disable_ipv6=1"], check=True)
        setup = ["link add name qa type veth peer name qb", "link set qa up", "link set qb up",
                 "addr add 10.99.0.1/24 dev qa", "neigh add 10.99.0.2 lladdr 02:00:00:00:00:02 dev qa"]
        subprocess.run(["ip", "-n", ns, "-batch", "-"], input="\n".join(setup) + "\n", text=True, check=True)
        subprocess.run(["tc", "-n", ns, "-batch", "-"], input="\n".join(shaping.tc_lines("qa", shape)) + "\n",
                       text=True, check=True)
        with entered(netns_path(ns)), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            for port in range(20):  # several flows, so VOQs spread them
                udp.sendto(b"x" * 1000, ("10.99.0.2", 4000 + port))
        reader = QdiscReader([netns_path(ns)])
        try:
            by_netlink = reader.leaf_backlogs()
        finally:
            reader.close()
        shown = subprocess.run(["tc", "-n", ns, "-s", "-j", "qdisc", "show"], capture_output=True, text=True,
                               check=True).stdout
        assert by_netlink == shaping.leaf_backlogs(shown)
        assert sum(by_netlink["qa"].values()) > 10_000  # packets are really standing in the queues
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
