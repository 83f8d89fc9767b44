"""Integration tier: real Mininet hosts, real OVS (userspace datapath here), real os-ken over OpenFlow."""

from __future__ import annotations

import json

import pytest

from emulator.model import topologies
from emulator.net.emulation import Emulation
from emulator.net.switchd import plane_groups
from tests.integration.helpers import delta, leaks, ping_all, probe_cmd, run_json, snapshot

pytestmark = pytest.mark.root

SMALL = {
    "ft2": {"leaves": 2, "spines": 2, "hosts_per_leaf": 2},
    "ft3": {"k": 4},
    "mrft": {"gpus": 2, "nodes": 4, "leaves_per_rail": 2, "spines": 2},
    "mpft": {},  # the default: 2 planes, 16 nodes x 2 GPUs
}


@pytest.mark.parametrize("topo", sorted(SMALL))
def test_all_pairs_reach_each_other_and_nothing_is_left(topo):
    before = snapshot()
    fabric = topologies.build(topo, **SMALL[topo])
    with Emulation(fabric, quiet=True) as emu:
        assert emu.net.verify_shaping() == []
        failures = ping_all(emu, fabric.hosts())
    assert failures == []
    assert leaks(before, snapshot()) == {}


@pytest.mark.parametrize("daemons", ["per-core", "shared"])
def test_four_planes_on_grouped_or_shared_daemons_reach_all_pairs(daemons):
    """The other two ways to run switches: private daemons each serving a group of planes in one namespace, and
    the machine's own OVS for every switch (what auto chooses for more planes than cores)."""
    before = snapshot()
    fabric = topologies.build("mpft", planes=4, nodes=4, leaves=2, spines=2)
    with Emulation(fabric, quiet=True, switch_daemons=daemons) as emu:
        assert emu.switchd.mode == daemons
        groups = plane_groups(fabric.planes, daemons) if daemons == "per-core" else [fabric.planes]
        assert len(emu.switchd.vswitchd_pids()) == len(groups)
        assert emu.net.verify_shaping() == []
        failures = ping_all(emu, fabric.hosts())
    assert failures == []
    assert leaks(before, snapshot()) == {}


def test_a_frozen_plane_forwards_nothing_until_restored_and_the_others_carry_on():
    """fail_plane stops plane 1's daemon: its links stay up (a hung chassis, not a cut cable), nothing crosses
    it, plane 0 is untouched; restore thaws it and it forwards again without a new bring-up."""
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2)
    with Emulation(fabric, quiet=True, switch_daemons="per-plane") as emu:
        def reaches(plane: int) -> bool:
            src, dst = fabric.hosts(plane=plane)[0], fabric.hosts(plane=plane)[-1]  # first and last leaf
            return " 0% packet loss" in emu.host(src).cmd("ping -c2 -W1 -i0.2", fabric.nic_ip(dst, plane))
        assert reaches(0) and reaches(1)
        emu.fail_plane(1)
        host = fabric.hosts(plane=1)[0]
        nic = fabric.intf(host, fabric.nic_on_plane(host, 1))
        assert emu.host(host).cmd("cat", f"/sys/class/net/{nic}/carrier").strip() == "1"
        assert reaches(0) and not reaches(1)
        emu.restore()
        assert reaches(1)


def test_storage_traffic_uses_only_the_storage_plane():
    fabric = topologies.build("mpft", nodes=4, leaves=2, spines=2, storage=True, storage_servers=2,
                              storage_leaves=1, storage_spines=1)
    gpu_ports = [fabric.intf(sw, peer) for p in (0, 1) for sw in fabric.switches(plane=p) for peer in fabric.graph[sw]]
    with Emulation(fabric, quiet=True) as emu:
        before = emu.packet_counters(gpu_ports)
        failures = ping_all(emu, fabric.hosts(role="storage_client") + fabric.hosts(role="storage_server"))
        moved = delta(before, emu.packet_counters(gpu_ports))
    assert failures == []
    assert sum(moved.values()) == 0


def test_a_degraded_link_carries_its_fraction_in_its_direction_until_restored():
    """degrade_link lowers one direction's HTB rate in place: a TCP flow into the slowed leaf-to-host hop gets a
    quarter of the NIC rate, the model and the shaping agree (also for a host's own egress, shaped in its
    namespace), and restore gives the flow the whole link back."""
    from emulator.run.iperf import run_flow

    fabric = topologies.build("ft2", **SMALL["ft2"])
    src, dst = fabric.hosts()[0], fabric.hosts()[-1]
    leaf = fabric.nic_links(dst)[0][0]
    nic = fabric.link(dst, leaf)["bps"]
    with Emulation(fabric, quiet=True) as emu:
        emu.degrade_link(leaf, dst, 0.25, "a_to_b")
        emu.degrade_link(fabric.nic_links(src)[0][0], src, 0.5, "b_to_a")  # the sender's own NIC, at half
        assert (emu.fabric.rate(leaf, dst), emu.fabric.rate(dst, leaf)) == (0.25 * nic, nic)
        assert emu.net.verify_shaping() == []
        slow = run_flow(emu, src, dst, seconds=3, port=5302)
        emu.restore()
        assert not emu.fabric.is_degraded() and emu.net.verify_shaping() == []
        fast = run_flow(emu, src, dst, seconds=3, port=5303)
    assert not fabric.is_degraded()  # the caller's model is not the run's
    assert slow.error == fast.error == ""
    assert 0.15 * nic < slow.goodput_bps <= 0.27 * nic, slow
    assert fast.goodput_bps > 0.8 * nic, fast


# Tests that make their own fabric stand above this fixture: it holds the run lock until the module ends.
@pytest.fixture(scope="module")
def mpft():
    """The default 2-plane MPFT with ECMP, shared by the forwarding tests below."""
    with Emulation(topologies.build(), quiet=True) as emu:
        yield emu


def _switch_ports(fabric, plane=None, role=None):
    return [fabric.intf(sw, peer) for sw in fabric.switches(plane=plane, role=role) for peer in fabric.graph[sw]]


def _send(emu, src, dst, flows, packets, vary=False):
    """UDP from src to dst with a sink at dst; returns (sent, received)."""
    sink = emu.host(dst)
    sink.sendCmd(probe_cmd("sink", "--seconds", "3"))
    emu.host(src).cmd("sleep 0.3")
    args = ["send", "--dst", emu.fabric.ip(dst), "--flows", str(flows), "--packets", str(packets)]
    sent = run_json(emu.host(src), probe_cmd(*args, *(["--entropy", "16"] if vary else [])))
    received = sink.waitOutput().strip().splitlines()[-1]
    return sent["sent"], json.loads(received)["received"]


def test_ecmp_spreads_flows_over_every_spine(mpft):
    fabric = mpft.fabric
    src, dst = "n0g0", "n15g0"  # plane 0, leaf 0 -> leaf 3
    leaf = fabric.nic_links(src)[0][0]
    uplinks = [fabric.intf(leaf, s) for s in fabric.switches(role="spine", plane=0)]
    before = mpft.packet_counters(uplinks)
    sent, received = _send(mpft, src, dst, flows=64, packets=10)
    per_spine = delta(before, mpft.packet_counters(uplinks))
    assert received == sent == 640
    assert all(count >= 10 for count in per_spine.values()), per_spine  # every spine carries >= 1 flow
    assert sum(per_spine.values()) >= sent


def test_one_flow_stays_on_one_path_under_ecmp(mpft):
    fabric = mpft.fabric
    leaf = fabric.nic_links("n1g0")[0][0]
    uplinks = [fabric.intf(leaf, s) for s in fabric.switches(role="spine", plane=0)]
    before = mpft.packet_counters(uplinks)
    sent, received = _send(mpft, "n1g0", "n14g0", flows=1, packets=200)
    per_spine = delta(before, mpft.packet_counters(uplinks))
    assert received == sent
    assert max(per_spine.values()) >= 200 and sorted(per_spine.values())[-2] <= 2, per_spine


def test_same_plane_traffic_never_touches_another_plane(mpft):
    fabric = mpft.fabric
    other = _switch_ports(fabric, plane=1)
    before = mpft.packet_counters(other)
    sent, received = _send(mpft, "n2g0", "n13g0", flows=16, packets=20)
    assert received == sent
    assert sum(delta(before, mpft.packet_counters(other)).values()) == 0


def test_cross_plane_traffic_takes_the_pxn_path(mpft):
    """n0g0 (plane 0) -> n9g1 (plane 1): over node 0's NVLink to n0g1, out of n0g1's NIC on plane 1."""
    fabric = mpft.fabric
    src, relay, dst = "n0g0", "n0g1", "n9g1"
    plane0 = _switch_ports(fabric, plane=0)
    relay_leaf = fabric.nic_links(relay)[0][0]
    relay_port = fabric.intf(relay_leaf, relay)  # leaf side: packets from the relay arrive here (rx)
    before0, before_rx = mpft.packet_counters(plane0), mpft.packet_counters([relay_port], "rx")
    sent, received = _send(mpft, src, dst, flows=8, packets=25)
    assert received == sent == 200
    assert sum(delta(before0, mpft.packet_counters(plane0)).values()) == 0
    assert delta(before_rx, mpft.packet_counters([relay_port], "rx"))[relay_port] >= sent


def test_links_are_shaped_to_the_model_rate(mpft):
    """A single TCP flow across the fabric reaches close to, but not above, the NIC rate."""
    from emulator.run.iperf import run_flow

    fabric = mpft.fabric
    result = run_flow(mpft, "n12g0", "n3g0", seconds=4, port=5301)
    nic = fabric.link("n3g0", fabric.nic_links("n3g0")[0][0])["bps"]
    assert result.error == ""
    assert 0.80 * nic < result.goodput_bps <= 1.02 * nic, result

