"""Shortest-path routes from the model: complete within a plane, empty across planes, equal-cost fan-out
by tier, loop-free when followed hop by hop, and repaired around failed links."""

from __future__ import annotations

import pytest

from controllers.routing import port_sets, shortest_path_routes
from emulator.model import naming
from emulator.model.topologies import build

FABRICS = {
    "mpft": ("mpft", {}),
    "mpft4s": ("mpft", {"planes": 4, "nodes": 8, "leaves": 2, "spines": 3, "storage": True}),
    "ft2": ("ft2", {"k": 4}),
    "ft3": ("ft3", {"k": 4}),
    "mrft": ("mrft", {}),
}


@pytest.fixture(scope="module", params=list(FABRICS))
def fabric_routes(request):
    topo, params = FABRICS[request.param]
    fabric = build(topo, **params)
    return fabric, shortest_path_routes(fabric)


def _nic_ips(fabric, plane):
    return {rec["ip"] for h in fabric.hosts() for rec in fabric.node(h)["ports"].values()
            if rec["plane"] == plane}


def _hosts_of_leaf(fabric, leaf):
    return [n for n in fabric.graph[leaf] if fabric.node(n)["kind"] == "host"]


def test_every_switch_routes_to_exactly_the_nics_of_its_plane(fabric_routes):
    fabric, routes = fabric_routes
    assert set(routes) == set(fabric.switches())
    for switch in fabric.switches():
        plane = fabric.node(switch)["plane"]
        assert set(routes[switch]) == _nic_ips(fabric, plane), switch
        assert all(ports and list(ports) == sorted(set(ports)) for ports in routes[switch].values())


def test_default_mpft_routes_by_closed_form():
    fabric = build()
    routes = shortest_path_routes(fabric)
    nodes = 16
    for switch in fabric.switches():
        plane = fabric.node(switch)["plane"]
        assert set(routes[switch]) == {naming.fabric_ip(plane, n) for n in range(nodes)}


def test_leaf_has_one_port_to_its_hosts_and_all_uplinks_to_the_rest(fabric_routes):
    fabric, routes = fabric_routes
    for leaf in fabric.switches("leaf"):
        plane = fabric.node(leaf)["plane"]
        local = {}
        for host in _hosts_of_leaf(fabric, leaf):
            for rec in fabric.node(host)["ports"].values():
                if rec["plane"] == plane:
                    local[rec["ip"]] = (fabric.port(leaf, host),)
        uplinks = tuple(sorted(fabric.port(leaf, s) for s in fabric.graph[leaf]
                               if fabric.node(s)["kind"] == "switch"))
        for ip, ports in routes[leaf].items():
            assert ports == local.get(ip, uplinks), (leaf, ip)


@pytest.mark.parametrize("name", ["mpft", "ft2", "mrft"])
def test_two_tier_spine_has_one_port_down_to_the_destination_leaf(name):
    topo, params = FABRICS[name]
    fabric = build(topo, **params)
    routes = shortest_path_routes(fabric)
    for spine in fabric.switches("spine"):
        plane = fabric.node(spine)["plane"]
        for leaf in fabric.switches("leaf", plane=plane):
            for host in _hosts_of_leaf(fabric, leaf):
                ip = [r["ip"] for r in fabric.node(host)["ports"].values() if r["plane"] == plane][0]
                assert routes[spine][ip] == (fabric.port(spine, leaf),)


def test_ft3_fan_out_by_tier():
    k = 4
    half = k // 2
    fabric = build("ft3", k=k)
    routes = shortest_path_routes(fabric)

    def pod(switch):  # leaves and aggregation switches of pod p have indices p*half .. p*half+half-1
        return fabric.node(switch)["index"] // half

    def host_pod(index):
        return index // (half * half)

    for h in range(k**3 // 4):
        ip = naming.fabric_ip(0, h)
        host = naming.plain_host_name(h)
        [(host_leaf, _)] = fabric.nic_links(host)
        for leaf in fabric.switches("leaf"):
            ports = routes[leaf][ip]
            if leaf == host_leaf:
                assert ports == (fabric.port(leaf, host),)
            else:  # up to every aggregation switch of its pod
                assert len(ports) == half
                assert {fabric.node(fabric.peer(leaf, p))["role"] for p in ports} == {"spine"}
        for agg in fabric.switches("spine"):
            ports = routes[agg][ip]
            if pod(agg) == host_pod(h):  # down to the host's leaf
                assert ports == (fabric.port(agg, host_leaf),)
            else:  # up to every core it has
                assert len(ports) == half
                assert {fabric.node(fabric.peer(agg, p))["role"] for p in ports} == {"core"}
        for core in fabric.switches("core"):
            ports = routes[core][ip]
            assert len(ports) == 1  # exactly one aggregation switch per pod
            agg = fabric.peer(core, ports[0])
            assert fabric.node(agg)["role"] == "spine" and pod(agg) == host_pod(h)


def _walk(fabric, routes, leaf, ip):
    """Follow every branch from `leaf` towards `ip`; returns the hop counts of all paths; fails on a loop,
    a missing route, a plane change or arriving at the wrong host."""
    dst = fabric.host_by_ip(ip)
    plane = fabric.node(leaf)["plane"]
    lengths = []
    stack = [(leaf, (leaf,))]
    while stack:
        switch, path = stack.pop()
        assert ip in routes[switch], (path, ip)
        for port in routes[switch][ip]:
            peer = fabric.peer(switch, port)
            data = fabric.node(peer)
            if data["kind"] == "host":
                assert peer == dst, (path, peer, ip)
                lengths.append(len(path))
                continue
            assert data["kind"] == "switch" and data["plane"] == plane, (path, peer)
            assert peer not in path, ("loop", path, peer)
            stack.append((peer, (*path, peer)))
    return lengths


def test_following_routes_from_any_leaf_reaches_the_destination(fabric_routes):
    fabric, routes = fabric_routes
    for leaf in fabric.switches("leaf"):
        plane = fabric.node(leaf)["plane"]
        for ip in _nic_ips(fabric, plane):
            lengths = _walk(fabric, routes, leaf, ip)
            assert lengths and len(set(lengths)) == 1  # every branch is a shortest path


def test_ft3_path_lengths():
    fabric = build("ft3", k=4)
    routes = shortest_path_routes(fabric)
    leaf = naming.switch_name("leaf", 0, 0)
    # same leaf: 1 switch; same pod: leaf-agg-leaf; other pod: leaf-agg-core-agg-leaf
    assert _walk(fabric, routes, leaf, naming.fabric_ip(0, 0)) == [1]
    assert set(_walk(fabric, routes, leaf, naming.fabric_ip(0, 2))) == {3}
    assert set(_walk(fabric, routes, leaf, naming.fabric_ip(0, 15))) == {5}
    assert len(_walk(fabric, routes, leaf, naming.fabric_ip(0, 15))) == 4  # 2 aggs x 2 cores


# -- failures ----------------------------------------------------------------------------------------------
def test_failed_uplink_is_routed_around():
    fabric = build()
    leaf, spine = naming.switch_name("leaf", 0, 0), naming.switch_name("spine", 0, 0)
    failed = frozenset({frozenset((leaf, spine))})
    routes = shortest_path_routes(fabric, failed)
    dead = fabric.port(leaf, spine)
    local_ips = {fabric.node(h)["ip"] for h in _hosts_of_leaf(fabric, leaf)}
    for ip in _nic_ips(fabric, 0) - local_ips:
        assert dead not in routes[leaf][ip] and len(routes[leaf][ip]) == 3
    for other in fabric.switches("leaf", plane=0):
        if other != leaf:
            for ip in local_ips:  # the other leaves stop sending leaf 0's traffic to spine 0
                assert fabric.port(other, spine) not in routes[other][ip]
                assert len(routes[other][ip]) == 3
    for other_leaf in fabric.switches("leaf"):
        for ip in _nic_ips(fabric, fabric.node(other_leaf)["plane"]):
            _walk(fabric, routes, other_leaf, ip)
    # plane 1 is untouched
    healthy = shortest_path_routes(fabric)
    for s in fabric.switches(plane=1):
        assert routes[s] == healthy[s]


def test_failed_host_link_removes_its_address_everywhere():
    fabric = build()
    host = naming.gpu_name(3, 1)
    [(leaf, _)] = fabric.nic_links(host)
    routes = shortest_path_routes(fabric, frozenset({frozenset((host, leaf))}))
    ip = fabric.ip(host)
    assert all(ip not in routes.get(s, {}) for s in fabric.switches())
    assert all(len(routes[s]) == 15 for s in fabric.switches(plane=1))


# -- port sets -----------------------------------------------------------------------------------------------
def test_port_sets_number_multi_port_sets_from_one_in_sorted_order():
    table = {"10.0.0.9": (5, 6), "10.0.0.1": (1,), "10.0.0.2": (2, 3, 4), "10.0.0.3": (5, 6),
             "10.0.0.4": (2, 3)}
    assert port_sets(table) == {(2, 3): 1, (2, 3, 4): 2, (5, 6): 3}
    assert port_sets(dict(reversed(table.items()))) == port_sets(table)
    assert port_sets({"10.0.0.1": (1,)}) == {}


def test_port_sets_of_real_switches_are_deterministic():
    first = shortest_path_routes(build("ft3", k=4))
    second = shortest_path_routes(build("ft3", k=4))
    for switch, table in first.items():
        sets = port_sets(table)
        assert sets == port_sets(second[switch])
        assert sorted(sets.values()) == list(range(1, len(sets) + 1))
        assert all(len(ports) > 1 for ports in sets)
