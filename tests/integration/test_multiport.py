"""Integration tier: the paper's ideal multi-plane host (its Fig. 4), a NIC with a port on every plane. One queue
pair with per-packet entropy sprays its packets over both plane ports and they are resequenced into one
in-order message; with fixed entropy the queue pair keeps to one plane."""

from __future__ import annotations

import pytest

from emulator.model import schedule, topologies
from emulator.net.emulation import Emulation
from emulator.run.launch import transfer
from traffic.options import TransportOptions

pytestmark = pytest.mark.root

SIZE = 400_000


@pytest.fixture(scope="module")
def emu():
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2, multiport=True)
    with Emulation(fabric, app="spray", quiet=True) as running:
        yield running


def _port_bytes(emu, entropy: str, tmp_path) -> tuple[dict, list[int]]:
    """Run one message n0g0 -> n2g0 (different leaves on both planes); bytes the sender put on each plane port,
    counted on the leaf side of its links."""
    f = emu.fabric
    leaf_side = [f.intf(leaf, "n0g0") for leaf, _ in sorted(f.nic_links("n0g0"), key=lambda lp: lp[1])]
    before = emu.link_counters("rx")
    m = transfer(emu, [schedule.Message(0, 0.0, "n0g0", "n2g0", SIZE)], tmp_path / entropy,
                     TransportOptions(entropy=entropy), quiet=True)
    after = emu.link_counters("rx")
    return m, [after[i] - before[i] for i in leaf_side]


def test_every_gpu_has_a_port_on_every_plane(emu):
    f = emu.fabric
    for host in f.gpu_hosts():
        assert f.nic_planes(host) == set(f.planes)
        assert sum(f.link(host, leaf)["bps"] for leaf, _ in f.nic_links(host)) == pytest.approx(10e6)


def test_one_queue_pair_sprays_over_both_planes_in_order(emu, tmp_path):
    m, per_port = _port_bytes(emu, "spray", tmp_path)
    assert m.lost_messages == 0 and m.wrong_size == 0 and m.duplicate_or_unexpected == 0
    assert min(per_port) > 0.4 * SIZE, per_port  # each plane carried close to half of the message


def test_fixed_entropy_keeps_a_queue_pair_on_one_plane(emu, tmp_path):
    m, per_port = _port_bytes(emu, "fixed", tmp_path)
    assert m.lost_messages == 0
    assert max(per_port) > SIZE and min(per_port) < 0.05 * SIZE, per_port
    assert m.reordering.out_of_order == 0
