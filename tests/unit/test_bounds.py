"""Best-possible rates from the model: the paths flows take (PXN, equal-cost splits) and max-min fair rates
against closed forms."""

from __future__ import annotations

from collections import defaultdict

import pytest

from controllers.routing import shortest_path_routes
from emulator import naming
from emulator.topologies import build
from traffic.bounds import flow_links, max_min_rates, tcp_goodput_factor

LINK = 10e6  # topologies.LINK_MBPS in bit/s
NVLINK = 4 * LINK


@pytest.fixture(scope="module")
def mpft():
    return build()


def _conservation(links, src, dst):
    """Net outflow of every node: +1 at the source, -1 at the destination, 0 elsewhere."""
    net = defaultdict(float)
    for (a, b), frac in links.items():
        assert 0 < frac <= 1 + 1e-12
        net[a] += frac
        net[b] -= frac
    for node, value in net.items():
        expected = 1.0 if node == src else -1.0 if node == dst else 0.0
        assert value == pytest.approx(expected, abs=1e-12), (node, value)


def test_cross_plane_flow_goes_through_pxn(mpft):
    spines = 4
    src, dst = naming.gpu_name(0, 0), naming.gpu_name(5, 1)  # node 5 sits on leaf 1 (4 nodes per leaf)
    relay, domain = naming.gpu_name(0, 1), naming.nvlink_name(0)
    leaf0, leaf1 = naming.switch_name("leaf", 1, 0), naming.switch_name("leaf", 1, 1)
    expected = {(src, domain): 1.0, (domain, relay): 1.0, (relay, leaf0): 1.0, (leaf1, dst): 1.0}
    for j in range(spines):
        spine = naming.switch_name("spine", 1, j)
        expected[(leaf0, spine)] = expected[(spine, leaf1)] = 1 / spines
    links = flow_links(mpft, src, dst)
    assert links.keys() == expected.keys()
    assert all(links[k] == pytest.approx(v) for k, v in expected.items())
    _conservation(links, src, dst)


def test_same_plane_same_leaf_and_same_node_flows(mpft):
    src, dst = naming.gpu_name(0, 1), naming.gpu_name(3, 1)  # both on plane 1, leaf 0
    leaf = naming.switch_name("leaf", 1, 0)
    assert flow_links(mpft, src, dst) == {(src, leaf): 1.0, (leaf, dst): 1.0}
    src, dst = naming.gpu_name(7, 0), naming.gpu_name(7, 1)
    domain = naming.nvlink_name(7)
    assert flow_links(mpft, src, dst) == {(src, domain): 1.0, (domain, dst): 1.0}


@pytest.mark.parametrize("topo, params", [("mpft", {}), ("ft3", {"k": 4}), ("mrft", {}),
                                          ("mpft", {"planes": 3, "nodes": 6, "leaves": 3, "spines": 2})])
def test_fractions_are_conserved_on_every_hop(topo, params):
    fabric = build(topo, **params)
    routes = shortest_path_routes(fabric)
    hosts = fabric.hosts()
    for src in hosts:
        for dst in hosts:
            if src != dst:
                _conservation(flow_links(fabric, src, dst, routes=routes), src, dst)


def test_ft3_other_pod_flow_spreads_over_all_cores():
    k = 4
    fabric = build("ft3", k=k)
    links = flow_links(fabric, naming.plain_host_name(0), naming.plain_host_name(15))
    cores = {b for (a, b) in links if fabric.node(b).get("role") == "core"}
    assert len(cores) == (k // 2) ** 2
    for core in cores:
        into = sum(f for (a, b), f in links.items() if b == core)
        assert into == pytest.approx(1 / len(cores))


def test_default_mpft_all_to_all(mpft):
    planes, nodes = 2, 16
    gpus = mpft.hosts()
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    rates = max_min_rates(mpft, pairs)
    # the NIC of a destination plane on a node carries every flow from every GPU of every other node
    cross = LINK / (planes * (nodes - 1))
    assert cross == pytest.approx(10e6 / 30)
    # a GPU's NVLink port also carries its (planes-1)(nodes-1) PXN flows; intra-node flows get the rest
    intra = (NVLINK - (planes - 1) * (nodes - 1) * cross) / (planes - 1)
    for (a, b), rate in rates.items():
        if mpft.node(a)["node"] == mpft.node(b)["node"]:
            assert rate == pytest.approx(intra, rel=1e-9)
        else:
            assert rate == pytest.approx(cross, rel=1e-9)
    assert intra > cross


def test_single_flow_on_ft2_gets_the_full_link():
    fabric = build("ft2", k=4)
    for dst in ("h1", "h7"):  # same leaf, other leaf
        assert max_min_rates(fabric, [("h0", dst)]) == {("h0", dst): pytest.approx(LINK)}


def test_flows_sharing_a_nic_split_it():
    fabric = build("ft2", k=4)
    pairs = [("h0", "h2"), ("h0", "h5"), ("h1", "h7")]
    rates = max_min_rates(fabric, pairs)
    assert rates[("h0", "h2")] == pytest.approx(LINK / 2)
    assert rates[("h0", "h5")] == pytest.approx(LINK / 2)
    assert rates[("h1", "h7")] == pytest.approx(LINK)  # max-min: the leftover is not wasted


def test_oversubscribed_uplinks_bound_cross_leaf_traffic():
    # 8 hosts per leaf, 2 uplinks: 8 cross-leaf flows share 2 links
    fabric = build("ft2", leaves=2, spines=2, hosts_per_leaf=8)
    pairs = [(f"h{i}", f"h{i + 8}") for i in range(8)]
    rates = max_min_rates(fabric, pairs)
    assert all(r == pytest.approx(2 * LINK / 8) for r in rates.values())


def test_flow_to_an_unreachable_plane_is_refused():
    fabric = build("mpft", storage=True)
    with pytest.raises(ValueError):
        flow_links(fabric, naming.storage_client_name(0), naming.gpu_name(0, 1))


def test_tcp_goodput_factor():
    # payload / wire bytes per full frame: MTU minus IPv4 (20) and TCP with timestamps (32), over MTU + 14
    assert tcp_goodput_factor(1500) == pytest.approx(1448 / 1514)
    assert tcp_goodput_factor(4200) == pytest.approx(4148 / 4214)
    values = [tcp_goodput_factor(m) for m in (576, 1500, 4200, 9000)]
    assert all(0.85 < v < 1 for v in values)
    assert values == sorted(values)
