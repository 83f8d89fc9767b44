"""Names, addresses and datapath ids: every function against its inverse, over the whole valid range."""

from __future__ import annotations

import ipaddress
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.model import naming
from emulator.model.topologies import build

planes = st.integers(0, naming.MAX_PLANES - 1)
host_indices = st.integers(0, naming.MAX_HOSTS_PER_PLANE - 1)
nodes = st.integers(0, naming.MAX_NODES - 1)
gpus = st.integers(0, naming.MAX_GPUS_PER_NODE - 1)
ipv4 = st.integers(0, 2**32 - 1).map(lambda n: str(ipaddress.IPv4Address(n)))


# -- fabric addresses -------------------------------------------------------------------------------------
@given(planes, host_indices)
def test_fabric_ip_round_trip(plane, index):
    ip = naming.fabric_ip(plane, index)
    assert naming.parse_fabric_ip(ip) == (plane, index)
    # the documented plan: 10.0.0.0 + (plane << 20) + index + 1, inside the plane's /12
    assert int(ipaddress.IPv4Address(ip)) == (10 << 24) + (plane << 20) + index + 1
    subnet = ipaddress.ip_network(naming.plane_subnet(plane))
    assert subnet.prefixlen == 12
    assert ipaddress.IPv4Address(ip) in subnet
    assert ipaddress.IPv4Address(ip) not in (subnet.network_address, subnet.broadcast_address)


def test_plane_subnets_follow_the_documented_plan():
    assert naming.fabric_ip(0, 0) == "10.0.0.1"
    assert naming.fabric_ip(1, 0) == "10.16.0.1"
    assert naming.fabric_ip(2, 255) == "10.32.1.0"
    subnets = [ipaddress.ip_network(naming.plane_subnet(p)) for p in range(naming.MAX_PLANES)]
    assert not any(a.overlaps(b) for a in subnets for b in subnets if a != b)
    assert all(s.subnet_of(ipaddress.ip_network("10.0.0.0/8")) for s in subnets)


@pytest.mark.parametrize("plane, index", [(-1, 0), (naming.MAX_PLANES, 0), (0, -1),
                                          (0, naming.MAX_HOSTS_PER_PLANE)])
def test_fabric_ip_rejects_out_of_range(plane, index):
    with pytest.raises(ValueError):
        naming.fabric_ip(plane, index)


@pytest.mark.parametrize("ip", ["9.255.255.255", "11.0.0.1", "10.0.0.0", "10.16.0.0", "172.16.0.1",
                                "192.168.0.1"])
def test_parse_fabric_ip_rejects_non_fabric_addresses(ip):
    with pytest.raises(ValueError):
        naming.parse_fabric_ip(ip)


@given(ipv4)
def test_parse_fabric_ip_only_accepts_addresses_fabric_ip_makes_except_broadcasts(ip):
    # Broadcasts of the /12s are covered by the test below.
    try:
        plane, index = naming.parse_fabric_ip(ip)
    except ValueError:
        return
    if index == naming.MAX_HOSTS_PER_PLANE:
        return
    assert naming.fabric_ip(plane, index) == ip


@pytest.mark.parametrize("plane", [0, 1, naming.MAX_PLANES - 1])
def test_parse_fabric_ip_rejects_plane_broadcast(plane):
    broadcast = str(ipaddress.ip_network(naming.plane_subnet(plane)).broadcast_address)
    with pytest.raises(ValueError):
        naming.parse_fabric_ip(broadcast)


# -- NVLink addresses -------------------------------------------------------------------------------------
@given(nodes, gpus)
def test_nvlink_ip_round_trip(node, gpu):
    ip = naming.nvlink_ip(node, gpu)
    assert naming.parse_nvlink_ip(ip) == (node, gpu)
    assert int(ipaddress.IPv4Address(ip)) == int(ipaddress.IPv4Address("172.16.0.0")) + 32 * node + gpu + 1
    assert ipaddress.IPv4Address(ip) in ipaddress.ip_network("172.16.0.0/12")


@given(nodes, gpus)
def test_nvlink_ip_is_a_host_address_of_its_nodes_27(node, gpu):
    ip = ipaddress.IPv4Address(naming.nvlink_ip(node, gpu))
    net = ipaddress.ip_network(f"{ip}/27", strict=False)
    assert net.network_address == ipaddress.IPv4Address("172.16.0.0") + 32 * node
    assert ip not in (net.network_address, net.broadcast_address)


def test_last_gpu_nvlink_ip_is_not_the_27_broadcast():
    # a /27 has 30 host addresses; the 31st would be the broadcast
    assert naming.MAX_GPUS_PER_NODE <= 30
    ip = ipaddress.IPv4Address(naming.nvlink_ip(0, naming.MAX_GPUS_PER_NODE - 1))
    assert ip != ipaddress.ip_network("172.16.0.0/27").broadcast_address


@pytest.mark.parametrize("node, gpu", [(-1, 0), (naming.MAX_NODES, 0), (0, -1),
                                       (0, naming.MAX_GPUS_PER_NODE)])
def test_nvlink_ip_rejects_out_of_range(node, gpu):
    with pytest.raises(ValueError):
        naming.nvlink_ip(node, gpu)


@pytest.mark.parametrize("ip", ["172.16.0.0", "172.16.0.31", "172.16.0.32", "172.16.1.63", "172.15.255.255",
                                "172.32.0.1", "10.0.0.1"])
def test_parse_nvlink_ip_rejects_non_nvlink_addresses(ip):
    with pytest.raises(ValueError):
        naming.parse_nvlink_ip(ip)


@given(ipv4)
def test_parse_nvlink_ip_only_accepts_addresses_nvlink_ip_makes(ip):
    try:
        node, gpu = naming.parse_nvlink_ip(ip)
    except ValueError:
        return
    assert naming.nvlink_ip(node, gpu) == ip


def test_fabric_and_nvlink_spaces_are_disjoint():
    with pytest.raises(ValueError):
        naming.parse_nvlink_ip(naming.fabric_ip(0, 0))
    with pytest.raises(ValueError):
        naming.parse_fabric_ip(naming.nvlink_ip(0, 0))


# -- MACs ---------------------------------------------------------------------------------------------------
MAC_RE = re.compile(r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")


@given(ipv4)
def test_mac_ip_round_trip(ip):
    mac = naming.mac_for_ip(ip)
    assert MAC_RE.match(mac)
    first = int(mac[:2], 16)
    assert first & 0x02 and not first & 0x01  # locally administered, unicast
    assert naming.ip_for_mac(mac) == ip
    assert naming.ip_for_mac(mac.upper()) == ip


def test_mac_carries_the_address_bytes():
    assert naming.mac_for_ip("10.16.0.1") == "02:00:0a:10:00:01"


@pytest.mark.parametrize("mac", ["00:00:0a:00:00:01", "02:01:0a:00:00:01", "02:00:0a:00:00",
                                 "02:00:0a:00:00:01:02", "02:00:0a:00:00:zz", "02:00:0a:00:00:100", ""])
def test_ip_for_mac_rejects_foreign_macs(mac):
    with pytest.raises(ValueError):
        naming.ip_for_mac(mac)


# -- datapath ids -------------------------------------------------------------------------------------------
roles = st.sampled_from(sorted(naming.ROLE_CODES))


@given(roles, st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF))
def test_dpid_round_trip(role, plane, index):
    value = naming.dpid(role, plane, index)
    assert 0 < value < 2**64  # OVS needs a non-zero 64-bit datapath id
    assert naming.parse_dpid(value) == (role, plane, index)


@pytest.mark.parametrize("value", [0, 1, 5 << 48, 0xFF << 48, 1 << 56])
def test_parse_dpid_rejects_foreign_ids(value):
    with pytest.raises(ValueError):
        naming.parse_dpid(value)


@pytest.mark.parametrize("plane, index", [(1 << 16, 0), (-1, 0), (0, 1 << 32), (0, -1)])
def test_dpid_rejects_out_of_range(plane, index):
    # unchecked, plane 1<<16 would be OR-ed into the role bits: dpid('leaf', 1<<16, 0) == dpid('leaf', 0, 0)
    with pytest.raises(ValueError):
        naming.dpid("leaf", plane, index)


# -- node names -----------------------------------------------------------------------------------------
@given(st.sampled_from(["leaf", "spine", "core"]), planes, st.integers(0, 99_999))
def test_switch_name_round_trip(role, plane, index):
    name = naming.switch_name(role, plane, index)
    assert naming.parse_name(name) == naming.Position("switch", plane, role, index)
    storage = naming.switch_name(role, plane, index, storage=True)
    assert storage.startswith("st")
    assert naming.parse_name(storage) == naming.Position("switch", None, role, index, storage=True)


@given(nodes, gpus)
def test_node_names_round_trip(node, gpu):
    assert naming.parse_name(naming.gpu_name(node, gpu)) == naming.Position("gpu", node=node, gpu=gpu)
    assert naming.parse_name(naming.nvlink_name(node)) == naming.Position("nvlink", node=node)
    assert naming.parse_name(naming.storage_client_name(node)) == naming.Position(
        "storage_client", node=node, storage=True)
    assert naming.parse_name(naming.storage_server_name(node)) == naming.Position(
        "storage_server", index=node, storage=True)
    assert naming.parse_name(naming.plain_host_name(node)) == naming.Position("host", index=node)
    for name in (naming.gpu_name(node, gpu), naming.nvlink_name(node), naming.storage_client_name(node),
                 naming.storage_server_name(node), naming.plain_host_name(node)):
        assert naming.check_name(name) == name


@pytest.mark.parametrize("name", ["", "x1", "p0x1", "n1", "h", "p0l", "stq1", "n0g", "H1"])
def test_parse_name_rejects_foreign_names(name):
    with pytest.raises(ValueError):
        naming.parse_name(name)


# -- interface names and the shell ---------------------------------------------------------------------------
def test_intf_name_follows_mininet_and_the_15_character_limit():
    assert naming.intf_name("h1", 0) == "h1-eth0"
    assert naming.intf_name("abcdefghij", 9) == "abcdefghij-eth9"  # exactly 15
    with pytest.raises(ValueError):
        naming.intf_name("p10s1000", 1000)  # 16


FABRICS = [("mpft", {}), ("mpft", {"storage": True}), ("mpft", {"planes": 15, "k": 8, "storage": True}),
           ("mrft", {}), ("mrft", {"gpus": naming.MAX_GPUS_PER_NODE, "nodes": 4, "leaves_per_rail": 1}),
           ("ft2", {"k": 8}), ("ft2", {"leaves": 4096, "spines": 1, "hosts_per_leaf": 2}), ("ft3", {"k": 4})]


@pytest.mark.parametrize("topo, params", FABRICS)
def test_every_generated_name_is_safe_and_every_interface_name_fits(topo, params):
    fabric = build(topo, **params)
    for name, data in fabric.graph.nodes(data=True):
        assert naming.check_name(name) == name
        pos = naming.parse_name(name)
        if pos.kind == "switch":
            assert (pos.role, pos.index) == (data["role"], data["index"])
            assert pos.storage == fabric.is_storage_plane(data["plane"])
            assert pos.plane == (None if pos.storage else data["plane"])
        elif pos.kind == "nvlink":
            assert pos.node == data["node"]
        else:
            assert pos.kind == data["role"]
            if pos.kind == "gpu":
                assert (pos.node, pos.gpu) == (data["node"], data["gpu"])
            elif pos.kind == "host":
                assert pos.index == data["index"]
    for a, b, data in fabric.graph.edges(data=True):
        for node in (a, b):
            intf = f"{node}-eth{data['ports'][node]}"
            assert len(intf) <= naming.IFNAMSIZ, intf
            assert fabric.intf(node, b if node == a else a) == intf


@pytest.mark.parametrize("name", ["h1;reboot", "h1 && ls", "$(id)", "h1$x", "`id`", "h1|cat", "h1>x", "h1<x",
                                  "h1'", 'h1"', "h1\\", "h1*", "h1?", "../h1", "h1/x", "h1 ", " h1", "h1\t",
                                  "h1\nreboot", "\nh1", "H1", "1h", "-h1", "h-1", "", "a" * 11, "h1\x00"])
def test_check_name_refuses_unsafe_names(name):
    with pytest.raises(ValueError):
        naming.check_name(name)


SAFE = re.compile(r"[a-z][a-z0-9]{0,9}")


@given(st.text(max_size=14) | st.from_regex(r"[a-z][a-z0-9]{0,9}\n?", fullmatch=True))
def test_check_name_accepts_exactly_the_safe_names(name):
    try:
        accepted = naming.check_name(name)
    except ValueError:
        assert not SAFE.fullmatch(name)
    else:
        assert accepted == name and SAFE.fullmatch(name)


def test_check_name_refuses_trailing_newline():
    # `$` in a regex also matches before a final newline; the check must not
    with pytest.raises(ValueError):
        naming.check_name("h1\n")
