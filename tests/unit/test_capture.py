"""What a capture takes (emulator.net.capture): the hosts' NICs by default, a node for all its ports, a bad name or
a snap length too short for our headers refused with its field; tcpdump gets an argument list."""

from __future__ import annotations

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import rdpcap, wrpcap

from emulator.model import capture, topologies
from emulator.model.errors import UserError
from emulator.net.capture import shift_pcap, tcpdump_argv


@pytest.fixture
def fabric():
    return topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2)


def test_by_default_every_hosts_nic_and_no_nvlink_port(fabric):
    chosen = capture.interfaces(fabric, None)
    assert set(chosen) == {fabric.intf(h, leaf) for h in fabric.hosts() for leaf, _ in fabric.nic_links(h)}
    assert set(chosen.values()) == set(fabric.hosts())


def test_a_node_stands_for_all_its_ports_and_an_interface_for_itself(fabric):
    host = fabric.hosts()[0]
    leaf = fabric.nic_links(host)[0][0]
    chosen = capture.interfaces(fabric, (leaf, fabric.intf(host, leaf)))
    assert set(chosen) == {fabric.intf(leaf, peer) for peer in fabric.graph[leaf]} | {fabric.intf(host, leaf)}


def test_bad_names_and_short_snap_lengths_are_refused_with_their_field(fabric):
    with pytest.raises(UserError, match="neither an interface nor a node") as bad:
        capture.interfaces(fabric, ("nosuch-eth9",))
    assert bad.value.field == "capture"
    with pytest.raises(UserError) as short:
        capture.CaptureOptions(snaplen=64).check()
    assert short.value.field == "capture_bytes"


def test_tcpdump_is_an_argument_list_with_the_snap_length(tmp_path):
    argv = tcpdump_argv("h0-eth0; rm -rf /", tmp_path / "x.pcap", 200)
    assert argv[:3] == ["tcpdump", "-i", "h0-eth0; rm -rf /"] and argv[argv.index("-s") + 1] == "200"


@pytest.mark.parametrize("nano", [False, True])
def test_another_servers_capture_moves_to_our_clock(tmp_path, nano):
    """Every frame's time stamp moves by the servers' realtime offset, at the file's resolution; the frames stay."""
    frames = [Ether() / IP() / UDP(dport=4791) / Raw(bytes(n)) for n in (10, 300)]
    for frame, at in zip(frames, (1_700_000_000.999_999, 1_700_000_001.5), strict=True):
        frame.time = at
    path = tmp_path / "in.pcap"
    wrpcap(str(path), frames, nano=nano)
    moved = tmp_path / "out.pcap"
    moved.write_bytes(shift_pcap(path.read_bytes(), -1_500_000))  # that server's clock was 1.5 ms ahead
    back = rdpcap(str(moved))
    assert [bytes(f) for f in back] == [bytes(f) for f in frames]
    assert [round(float(f.time), 6) for f in back] == [1_700_000_000.998_499, 1_700_000_001.4985]
    assert shift_pcap(path.read_bytes(), 0) == path.read_bytes()
    pcapng = b"\x0a\x0d\x0d\x0a" + bytes(24)
    assert shift_pcap(pcapng, 5) == pcapng
