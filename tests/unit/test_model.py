"""The fabric model: closed-form counts of every builder, plane isolation, unique addresses, JSON round trip,
and parameter errors that name the field."""

from __future__ import annotations

import json
from collections import Counter

import networkx as nx
import pytest

from emulator.model import naming, topologies
from emulator.model.errors import UserError
from emulator.model.fabric import FORMAT, Fabric, down_neighbours, up_neighbours
from emulator.model.topologies import build


def _counts(fabric):
    c = fabric.counts()
    return c["hosts"], c["switches"], c["fabric_links"]


@pytest.fixture(scope="module")
def big_mpft():
    return build("mpft", planes=8, k=64)


# -- closed forms ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [2, 4, 8, 64])
def test_ft2_counts(k):
    fabric = build("ft2", k=k)
    assert _counts(fabric) == (k * k // 2, 3 * k // 2, k * k // 2)
    c = fabric.counts()
    assert (c["host_links"], c["nvlink_domains"], c["nvlink_links"], c["planes"]) == (k * k // 2, 0, 0, 1)
    assert len(fabric.switches("leaf")) == k and len(fabric.switches("spine")) == k // 2
    # every switch is a k-port switch with every port used
    assert {fabric.graph.degree(s) for s in fabric.switches()} == {k}


def test_ft2_k64_is_table_3():
    assert _counts(build("ft2", k=64)) == (2048, 96, 2048)


@pytest.mark.parametrize("k", [4, 8])
def test_ft3_counts(k):
    fabric = build("ft3", k=k)
    assert _counts(fabric) == (k**3 // 4, 5 * k * k // 4, k**3 // 2)
    assert len(fabric.switches("core")) == (k // 2) ** 2
    assert len(fabric.switches("leaf")) == len(fabric.switches("spine")) == k * k // 2
    assert {fabric.graph.degree(s) for s in fabric.switches()} == {k}


def test_ft3_k4():
    assert _counts(build("ft3", k=4)) == (16, 20, 32)


def test_mpft_8_planes_k64_is_table_3(big_mpft):
    assert _counts(big_mpft) == (16384, 768, 16384)
    c = big_mpft.counts()
    assert (c["nvlink_domains"], c["nvlink_links"], c["planes"]) == (64 * 64 // 2, 16384, 8)


@pytest.mark.parametrize("planes, k", [(1, 4), (3, 4), (8, 8)])
def test_mpft_radix_is_planes_times_ft2(planes, k):
    fabric = build("mpft", planes=planes, k=k)
    assert _counts(fabric) == (planes * k * k // 2, planes * 3 * k // 2, planes * k * k // 2)
    assert fabric.counts()["nvlink_domains"] == k * k // 2
    assert {fabric.graph.degree(s) for s in fabric.switches()} == {k}


def test_mpft_defaults():
    fabric = build()
    assert fabric.topo == "mpft"
    c = fabric.counts()
    # 2 planes, 16 nodes x 2 GPUs, per plane 4 leaves and 4 spines
    assert c == {"hosts": 32, "switches": 16, "fabric_links": 2 * 4 * 4, "host_links": 32,
                 "nvlink_domains": 16, "nvlink_links": 32, "planes": 2}
    assert len(fabric.hosts(role="gpu")) == 32
    assert all(len(fabric.node_gpus(d)) == 2 for d in fabric.nvlink_domains())


def test_mrft_defaults():
    fabric = build("mrft")
    gpus, nodes, leaves_per_rail, spines = 2, 16, 4, 4
    assert fabric.counts() == {
        "hosts": gpus * nodes, "switches": gpus * leaves_per_rail + spines,
        "fabric_links": gpus * leaves_per_rail * spines, "host_links": gpus * nodes,
        "nvlink_domains": nodes, "nvlink_links": gpus * nodes, "planes": 1}
    # GPU g of every node sits on a rail-g leaf
    for host in fabric.hosts():
        [(leaf, _)] = fabric.nic_links(host)
        g = fabric.node(host)["gpu"]
        assert g * leaves_per_rail <= fabric.node(leaf)["index"] < (g + 1) * leaves_per_rail


def test_mrft_explicit():
    fabric = build("mrft", gpus=4, nodes=6, leaves_per_rail=3, spines=2)
    assert fabric.counts() == {"hosts": 24, "switches": 14, "fabric_links": 24, "host_links": 24,
                               "nvlink_domains": 6, "nvlink_links": 24, "planes": 1}


def test_oversubscribed_ft2():
    fabric = build("ft2", leaves=4, spines=2, hosts_per_leaf=8)
    assert _counts(fabric) == (32, 6, 8)
    for leaf in fabric.switches("leaf"):
        assert len(down_neighbours(fabric, leaf)) == 8
        assert len(up_neighbours(fabric, leaf)) == 2
    for spine in fabric.switches("spine"):
        assert len(down_neighbours(fabric, spine)) == 4 and up_neighbours(fabric, spine) == []


def test_leaf_ports_face_hosts_first():
    fabric = build()
    for leaf in fabric.switches("leaf"):
        down = down_neighbours(fabric, leaf)
        assert [fabric.port(leaf, h) for h in down] == list(range(1, len(down) + 1))
        up = up_neighbours(fabric, leaf)
        assert [fabric.port(leaf, s) for s in up] == list(range(len(down) + 1, len(down) + len(up) + 1))


# -- plane isolation --------------------------------------------------------------------------------------
def _plane_of(fabric, node):
    """The plane a node belongs to; None for NVLink domains."""
    data = fabric.node(node)
    return data.get("plane")


@pytest.mark.parametrize("params", [{}, {"planes": 4, "nodes": 8, "leaves": 2, "spines": 2},
                                    {"storage": True}])
def test_mpft_planes_share_no_switch_or_link(params):
    fabric = build("mpft", **params)
    for a, b, data in fabric.graph.edges(data=True):
        if data["kind"] == "nvlink":
            assert data["plane"] is None
            continue
        switches = [n for n in (a, b) if fabric.node(n)["kind"] == "switch"]
        assert switches, (a, b)
        assert {fabric.node(s)["plane"] for s in switches} == {data["plane"]}
        for n in (a, b):
            if fabric.node(n)["kind"] == "host":
                assert fabric.node(n)["ports"][data["ports"][n]]["plane"] == data["plane"]


@pytest.mark.parametrize("params", [{}, {"planes": 4, "nodes": 8, "leaves": 2, "spines": 2},
                                    {"storage": True}])
def test_only_nvlink_domains_join_planes(params):
    fabric = build("mpft", **params)
    planes = params.get("planes", 2) + (1 if params.get("storage") else 0)
    without_nvlink = fabric.graph.subgraph(n for n in fabric.graph if fabric.node(n)["kind"] != "nvlink")
    components = list(nx.connected_components(without_nvlink))
    assert len(components) == planes
    assert sorted(len({_plane_of(fabric, n) for n in comp}) for comp in components) == [1] * planes
    # and with the NVLink domains everything but the storage plane is one fabric
    assert nx.number_connected_components(fabric.graph) == (2 if params.get("storage") else 1)


def test_every_nvlink_domain_holds_one_gpu_per_plane():
    planes = 4
    fabric = build("mpft", planes=planes, nodes=8, leaves=2, spines=2)
    for domain in fabric.nvlink_domains():
        gpus = fabric.node_gpus(domain)
        assert [fabric.node(g)["plane"] for g in gpus] == list(range(planes))
        assert {fabric.node(g)["node"] for g in gpus} == {fabric.node(domain)["node"]}


def test_cross_plane_paths_go_through_an_nvlink_domain():
    fabric = build()
    src, dst = naming.gpu_name(0, 0), naming.gpu_name(5, 1)
    for path in nx.all_shortest_paths(fabric.graph, src, dst):
        assert any(fabric.node(n)["kind"] == "nvlink" for n in path)


# -- addresses ---------------------------------------------------------------------------------------------
def _check_unique_addresses(fabric):
    ips = [rec["ip"] for h in fabric.hosts() for rec in fabric.node(h)["ports"].values()]
    macs = [rec["mac"] for h in fabric.hosts() for rec in fabric.node(h)["ports"].values()]
    assert len(set(ips)) == len(ips)
    assert len(set(macs)) == len(macs)
    dpids = [fabric.node(s)["dpid"] for s in fabric.switches()]
    assert len(set(dpids)) == len(dpids)
    for h in fabric.hosts():
        data = fabric.node(h)
        for rec in data["ports"].values():
            assert rec["mac"] == naming.mac_for_ip(rec["ip"])
            if rec["plane"] is None:
                assert naming.parse_nvlink_ip(rec["ip"]) == (data["node"], data["gpu"])
            else:
                assert naming.parse_fabric_ip(rec["ip"])[0] == rec["plane"]
        own_nic = [rec for rec in data["ports"].values() if rec["plane"] == data["plane"]][0]
        assert data["ip"] == own_nic["ip"] and data["mac"] == own_nic["mac"]
        assert fabric.host_by_ip(data["ip"]) == h
    for s in fabric.switches():
        data = fabric.node(s)
        assert naming.parse_dpid(data["dpid"]) == (data["role"], data["plane"], data["index"])
        assert fabric.switch_by_dpid(data["dpid"]) == s


@pytest.mark.parametrize("topo, params", [("mpft", {}), ("mpft", {"storage": True}), ("mrft", {}),
                                          ("mpft", {"multiport": True, "planes": 4}),
                                          ("ft2", {"k": 8}), ("ft3", {"k": 4})])
def test_addresses_and_dpids_are_unique(topo, params):
    _check_unique_addresses(build(topo, **params))


def test_big_mpft_addresses_are_unique(big_mpft):
    _check_unique_addresses(big_mpft)
    k = 64
    positions = Counter((big_mpft.node(s)["plane"], big_mpft.node(s)["role"], big_mpft.node(s)["index"])
                        for s in big_mpft.switches())
    expected = {(p, "leaf", i) for p in range(8) for i in range(k)} | {
        (p, "spine", j) for p in range(8) for j in range(k // 2)}
    assert set(positions) == expected and set(positions.values()) == {1}


def test_switch_names_follow_position():
    fabric = build("mpft", storage=True)
    for s in fabric.switches():
        data = fabric.node(s)
        assert s == naming.switch_name(data["role"], data["plane"], data["index"],
                                       storage=fabric.is_storage_plane(data["plane"]))


# -- storage plane ----------------------------------------------------------------------------------------
def test_storage_plane_holds_only_storage_endpoints():
    planes, nodes, servers = 2, 16, 3
    fabric = build("mpft", planes=planes, nodes=nodes, storage=True, storage_servers=servers)
    storage = planes
    assert fabric.is_storage_plane(storage) and not any(fabric.is_storage_plane(p) for p in range(planes))
    assert fabric.planes == list(range(planes + 1))
    on_storage = set(fabric.hosts(plane=storage))
    assert on_storage == ({naming.storage_client_name(n) for n in range(nodes)}
                          | {naming.storage_server_name(s) for s in range(servers)})
    for host in fabric.hosts():
        nic_planes = {rec["plane"] for rec in fabric.node(host)["ports"].values() if rec["plane"] is not None}
        if host in on_storage:
            assert nic_planes == {storage}
            assert fabric.nvlink_peer(host) is None
        else:
            assert storage not in nic_planes
    for s in fabric.switches(plane=storage):
        assert s.startswith("st")
        assert all(fabric.node(n)["plane"] == storage for n in fabric.graph[s])
    c = fabric.counts()
    assert c["hosts"] == planes * nodes + nodes + servers
    assert c["switches"] == planes * 8 + 2 + 2  # default storage_leaves=2, storage_spines=2
    assert c["fabric_links"] == planes * 16 + 2 * 2


# -- JSON ----------------------------------------------------------------------------------------------------
def _snapshot(fabric):
    nodes = {n: d for n, d in fabric.graph.nodes(data=True)}
    edges = {frozenset((a, b)): d for a, b, d in fabric.graph.edges(data=True)}
    return dict(fabric.graph.graph), nodes, edges


ROUND_TRIP = [("mpft", {}), ("mpft", {"storage": True, "planes": 3}), ("mrft", {}), ("ft2", {"k": 4}),
              ("ft3", {"k": 4}), ("ft2", {"leaves": 3, "spines": 2, "hosts_per_leaf": 5, "link_mbps": 2.5})]


@pytest.mark.parametrize("topo, params", ROUND_TRIP)
def test_dict_round_trip_through_json_text(topo, params):
    fabric = build(topo, **params)
    again = Fabric.from_dict(json.loads(json.dumps(fabric.to_dict())))
    assert _snapshot(again) == _snapshot(fabric)
    for a, b in fabric.graph.edges:
        assert again.port(a, b) == fabric.port(a, b) and again.port(b, a) == fabric.port(b, a)
        assert again.intf(a, b) == fabric.intf(a, b)
    assert again.counts() == fabric.counts()


@pytest.mark.parametrize("topo, params", ROUND_TRIP)
def test_save_load_round_trip(tmp_path, topo, params):
    fabric = build(topo, **params)
    path = tmp_path / "model.json"
    fabric.save(path)
    again = Fabric.load(path)
    assert _snapshot(again) == _snapshot(fabric)
    assert again.to_dict() == fabric.to_dict()
    for host in fabric.hosts():
        assert again.node(host)["ports"] == fabric.node(host)["ports"]
        assert all(isinstance(p, int) for p in again.node(host)["ports"])


def test_load_refuses_a_foreign_format(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"format": "something-else", "graph": {}, "nodes": [], "links": []}))
    with pytest.raises(UserError) as err:
        Fabric.load(path)
    assert err.value.field == "format" and err.value.file == str(path)


def test_load_reports_invalid_json_with_its_line(tmp_path):
    path = tmp_path / "model.json"
    path.write_text('{\n"format": "mpft-fabric/1",\n"nodes": [,]\n}')
    with pytest.raises(UserError) as err:
        Fabric.load(path)
    assert err.value.line == 3


def test_load_reports_a_missing_file(tmp_path):
    with pytest.raises(UserError):
        Fabric.load(tmp_path / "absent.json")


def test_from_dict_reports_a_link_without_its_port():
    data = build("ft2", k=2).to_dict()
    del data["links"][0]["port_a"]
    with pytest.raises(UserError):
        Fabric.from_dict(data)


@pytest.mark.parametrize("graph", [None, ["topo"]])
def test_from_dict_reports_a_missing_or_malformed_graph_as_user_error(graph):
    data = {"format": FORMAT, "nodes": [], "links": []}
    if graph is not None:
        data["graph"] = graph
    with pytest.raises(UserError):
        Fabric.from_dict(data)


# -- bad parameters -------------------------------------------------------------------------------------
@pytest.mark.parametrize("topo, params, field", [
    ("mpft", {"planes": 0}, "planes"),
    ("mpft", {"planes": naming.MAX_PLANES}, "planes"),
    ("mpft", {"planes": True}, "planes"),
    ("mpft", {"planes": 2.0}, "planes"),
    ("mpft", {"nodes": 15, "leaves": 4}, "leaves"),
    ("mpft", {"nodes": 0}, "nodes"),
    ("mrft", {"nodes": 15, "leaves_per_rail": 4}, "leaves_per_rail"),
    ("mrft", {"gpus": naming.MAX_GPUS_PER_NODE + 1}, "gpus"),
    ("ft2", {"k": 5}, "k"),
    ("ft3", {"k": 3}, "k"),
    ("mpft", {"k": 7}, "k"),
    ("ft2", {"k": 0}, "k"),
    ("ft2", {"spines": 0}, "spines"),
    ("ft2", {"link_mbps": 0}, "link_mbps"),
    ("mpft", {"link_mbps": 100_001}, "link_mbps"),
    ("mpft", {"link_mbps": float("nan")}, "link_mbps"),
    ("mpft", {"nvlink_mbps": 0}, "nvlink_mbps"),
    ("mrft", {"nvlink_mbps": 400_001}, "nvlink_mbps"),
    ("mpft", {"mtu": 575}, "mtu"),
    ("ft3", {"mtu": 9001}, "mtu"),
    ("mpft", {"queue_kb": 1}, "queue_kb"),
    ("mpft", {"storage": True, "storage_servers": 0}, "storage_servers"),
    ("ft2", {"planes": 2}, "planes"),
    ("mpft", {"bogus": 1}, "bogus"),
    ("ft3", {"leaves": 4}, "leaves"),
    ("ft4", {}, "topo"),
])
def test_bad_parameters_name_the_field(topo, params, field):
    with pytest.raises(UserError) as err:
        build(topo, **params)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_unknown_parameter_error_lists_the_allowed_ones():
    with pytest.raises(UserError) as err:
        build("ft3", planes=2)
    for name in topologies.parameters("ft3"):
        assert name in str(err.value)


@pytest.mark.parametrize("planes", [2, 4])
def test_multiport_mpft_gives_every_gpu_a_port_on_every_plane_at_a_share_of_the_rate(planes):
    f = build("mpft", planes=planes, nodes=8, leaves=2, spines=2, link_mbps=8, multiport=True)
    one_port = build("mpft", planes=planes, nodes=8, leaves=2, spines=2, link_mbps=8)
    assert f.counts()["host_links"] == 8 * planes * planes
    assert f.counts()["switches"] == one_port.counts()["switches"]
    for host in f.gpu_hosts():
        assert f.nic_planes(host) == set(range(planes))
        assert all(f.link(host, leaf)["bps"] == 8e6 / planes for leaf, _ in f.nic_links(host))

    def capacity(fabric, leaf, kind):
        return sum(d["bps"] for n, d in fabric.graph[leaf].items() if fabric.node(n)["kind"] == kind)
    for leaf in f.switches(role="leaf"):  # the same capacity down and up as the one-port leaf
        assert capacity(f, leaf, "host") == capacity(one_port, leaf, "host")
        assert capacity(f, leaf, "switch") == capacity(one_port, leaf, "switch")


def test_multiport_must_be_a_bool():
    with pytest.raises(UserError, match="multiport"):
        build("mpft", multiport="yes")


# -- switch egress queueing -----------------------------------------------------------------------------
@pytest.mark.parametrize("queueing", ["fifo", "class", "voq"])
def test_queueing_is_kept_in_the_model_and_its_json(queueing):
    fabric = build("ft2", k=2, queueing=queueing)
    assert fabric.queueing == queueing
    assert Fabric.from_dict(json.loads(json.dumps(fabric.to_dict()))).queueing == queueing


def test_queueing_defaults_to_one_fifo_also_in_older_models():
    assert build("ft2", k=2).queueing == "fifo"
    data = build("ft2", k=2).to_dict()
    del data["graph"]["queueing"]
    assert Fabric.from_dict(data).queueing == "fifo"


@pytest.mark.parametrize("bad", ["wfq", "FIFO", "", 1, None])
def test_bad_queueing_is_a_one_line_error_naming_the_field(bad):
    with pytest.raises(UserError) as err:
        build("mpft", queueing=bad)
    assert err.value.field == "queueing"
    assert str(err.value).startswith("queueing: must be one of fifo, class, voq")
    assert "\n" not in str(err.value)


def test_every_link_option_is_a_topology_option_of_the_cli():
    from emulator.cli.options import TOPO_OPTIONS
    assert set(topologies.LINK_PARAMS) <= {name for name, _, _ in TOPO_OPTIONS}


def test_a_degraded_direction_has_its_own_rate_and_survives_json(tmp_path):
    fabric = build("ft2", k=4)
    leaf, spine = "p0l0", "p0s0"
    full = fabric.link(leaf, spine)["bps"]
    copy = fabric.copy()
    copy.set_rate(leaf, spine, full / 4)
    assert (copy.rate(leaf, spine), copy.rate(spine, leaf)) == (full / 4, full)
    assert copy.egress_rates([leaf])[copy.intf(leaf, spine)] == full / 4
    assert copy.is_degraded() and not fabric.is_degraded()  # the original keeps its rates
    copy.save(tmp_path / "f.json")
    loaded = Fabric.load(tmp_path / "f.json")
    assert loaded.rate(leaf, spine) == full / 4 and loaded.rate(spine, leaf) == full
    loaded.set_rate(leaf, spine, None)
    assert not loaded.is_degraded() and "egress_bps" not in loaded.link(leaf, spine)
