"""What a capture takes (emulator.net.capture): the hosts' NICs by default, a node for all its ports, a bad name or
a snap length too short for our headers refused with its field; tcpdump gets an argument list."""

from __future__ import annotations

import pytest

from emulator.model import topologies
from emulator.model.errors import UserError
from emulator.net import capture


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
    argv = capture.tcpdump_argv("h0-eth0; rm -rf /", tmp_path / "x.pcap", 200)
    assert argv[:3] == ["tcpdump", "-i", "h0-eth0; rm -rf /"] and argv[argv.index("-s") + 1] == "200"
