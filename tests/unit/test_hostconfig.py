"""Per-host configuration: addresses, static neighbours, NVLink and PXN routes, sysctls; and a hop-by-hop
replay of the generated `ip` lines showing every GPU reaches every other GPU without ARP."""

from __future__ import annotations

import ipaddress

import pytest

from emulator.model import naming
from emulator.model.hostconfig import host_setup
from emulator.model.topologies import build


@pytest.fixture(scope="module")
def mpft():
    return build()


def _nic(fabric, host):
    """(interface, record) of the host's one fabric NIC."""
    [(_, port)] = fabric.nic_links(host)
    return naming.intf_name(host, port), fabric.node(host)["ports"][port]


def _nvl(fabric, host):
    domain = fabric.nvlink_peer(host)
    port = fabric.port(host, domain)
    return naming.intf_name(host, port), fabric.node(host)["ports"][port]


def test_gpu_interfaces_come_up_with_mtu_and_addresses(mpft):
    host = naming.gpu_name(3, 1)
    lines = host_setup(mpft, host).ip_lines
    nic, _ = _nic(mpft, host)
    nvl, _ = _nvl(mpft, host)
    assert f"link set dev {nic} mtu {mpft.mtu} up" in lines
    assert f"link set dev {nvl} mtu {mpft.mtu} up" in lines
    assert f"addr add {naming.fabric_ip(1, 3)}/12 dev {nic}" in lines
    assert f"addr add {naming.nvlink_ip(3, 1)}/27 dev {nvl}" in lines
    assert host_setup(mpft, host).intfs == sorted([nic, nvl])
    # the prefixes agree with the address plan
    assert ipaddress.ip_network(f"{naming.fabric_ip(1, 3)}/12", strict=False) == ipaddress.ip_network(
        naming.plane_subnet(1))


def test_set_mtu_false_leaves_the_mtu_alone(mpft):
    host = naming.gpu_name(0, 1)
    with_mtu = host_setup(mpft, host).ip_lines
    without = host_setup(mpft, host, set_mtu=False).ip_lines
    links = [line for line in without if line.startswith("link ")]
    assert links == [f"link set dev {intf} up" for intf in host_setup(mpft, host).intfs]
    assert [line for line in without if not line.startswith("link ")] == \
        [line for line in with_mtu if not line.startswith("link ")]


def test_gpu_has_permanent_neighbours_for_every_same_plane_nic(mpft):
    nodes = 16
    for host in (naming.gpu_name(0, 0), naming.gpu_name(9, 1)):
        plane, node = mpft.node(host)["plane"], mpft.node(host)["node"]
        nic, _ = _nic(mpft, host)
        lines = host_setup(mpft, host).ip_lines
        on_nic = {line for line in lines if line.startswith("neigh ") and line.split()[6] == nic}
        expected = {f"neigh replace {naming.fabric_ip(plane, n)} lladdr "
                    f"{naming.mac_for_ip(naming.fabric_ip(plane, n))} dev {nic} nud permanent"
                    for n in range(nodes) if n != node}
        assert on_nic == expected


def test_same_node_gpus_are_reached_over_nvlink_from_the_fabric_address():
    planes, nodes = 4, 4
    fabric = build("mpft", planes=planes, nodes=nodes, leaves=2, spines=2)
    host = naming.gpu_name(2, 1)
    my_ip = naming.fabric_ip(1, 2)
    nvl, _ = _nvl(fabric, host)
    lines = host_setup(fabric, host).ip_lines
    for g in range(planes):
        if g == 1:
            continue
        peer_ip, peer_nvl = naming.fabric_ip(g, 2), naming.nvlink_ip(2, g)
        mac = naming.mac_for_ip(peer_nvl)
        assert f"route replace {peer_ip}/32 dev {nvl} src {my_ip}" in lines
        assert f"neigh replace {peer_nvl} lladdr {mac} dev {nvl} nud permanent" in lines
        # the peer's fabric address resolves to its NVLink port, so the /32 needs no ARP either
        assert f"neigh replace {peer_ip} lladdr {mac} dev {nvl} nud permanent" in lines


def test_other_planes_are_reached_via_the_same_node_gpu_on_that_plane():
    planes = 4
    fabric = build("mpft", planes=planes, nodes=4, leaves=2, spines=2, storage=True)
    host = naming.gpu_name(1, 2)
    nvl, _ = _nvl(fabric, host)
    routes = [line for line in host_setup(fabric, host).ip_lines if line.startswith("route ")]
    pxn = sorted(line for line in routes if "via" in line)
    assert pxn == sorted(f"route replace {naming.plane_subnet(q)} via {naming.nvlink_ip(1, q)} dev {nvl} "
                         f"src {naming.fabric_ip(2, 1)}" for q in range(planes) if q != 2)
    storage = naming.plane_subnet(planes)
    assert not any(storage in line for line in host_setup(fabric, host).ip_lines)


def test_sysctls_for_gpus_and_plain_hosts(mpft):
    setup = host_setup(mpft, naming.gpu_name(0, 0))
    assert setup.sysctls["net.ipv4.ip_forward"] == "1"
    assert setup.sysctls["net.ipv4.conf.all.rp_filter"] == "0"
    for intf in setup.intfs:
        assert setup.sysctls[f"net.ipv4.conf.{intf}.rp_filter"] == "0"
    ft2 = build("ft2", k=4)
    plain = host_setup(ft2, naming.plain_host_name(5))
    assert plain.sysctls["net.ipv4.ip_forward"] == "0"
    assert plain.sysctls["net.ipv4.conf.all.rp_filter"] == "0"
    assert not any(line.startswith("route ") for line in plain.ip_lines)
    assert plain.intfs == ["h5-eth0"]


def test_ft2_host_has_neighbours_for_every_other_host_and_no_nvlink():
    k = 4
    fabric = build("ft2", k=k)
    lines = host_setup(fabric, "h0").ip_lines
    neigh = [line for line in lines if line.startswith("neigh ")]
    assert len(neigh) == k * k // 2 - 1
    assert not any("172.16." in line for line in lines)


def test_mrft_has_nvlink_routes_but_no_plane_routes():
    fabric = build("mrft")
    host = naming.gpu_name(4, 0)
    lines = host_setup(fabric, host).ip_lines
    routes = [line for line in lines if line.startswith("route ")]
    nvl, _ = _nvl(fabric, host)
    assert routes == [f"route replace {fabric.ip(naming.gpu_name(4, 1))}/32 dev {nvl} src {fabric.ip(host)}"]
    nic, _ = _nic(fabric, host)
    on_nic = [line for line in lines if line.startswith("neigh ") and f" dev {nic} " in line]
    assert len(on_nic) == 31  # every other GPU of the one plane
    assert host_setup(fabric, host).sysctls["net.ipv4.ip_forward"] == "1"


def test_storage_endpoints_neighbour_only_the_storage_plane():
    nodes, servers = 16, 4
    fabric = build("mpft", storage=True, storage_servers=servers)
    setup = host_setup(fabric, naming.storage_client_name(3))
    assert setup.sysctls["net.ipv4.ip_forward"] == "0"
    neigh = [line.split()[2] for line in setup.ip_lines if line.startswith("neigh ")]
    assert len(neigh) == nodes + servers - 1
    assert {naming.parse_fabric_ip(ip)[0] for ip in neigh} == {2}


# -- replay ---------------------------------------------------------------------------------------------
class _Host:
    """A host's addresses, neighbours and routes as the `ip` lines would leave them in the kernel."""

    def __init__(self, fabric, name):
        setup = host_setup(fabric, name)
        self.forwards = setup.sysctls["net.ipv4.ip_forward"] == "1"
        self.local: set[str] = set()
        self.neigh: dict[tuple[str, str], str] = {}
        self.routes: list[tuple[ipaddress.IPv4Network, str, str | None, str | None]] = []
        for line in setup.ip_lines:
            w = line.split()
            if w[:2] == ["addr", "add"]:
                self.local.add(w[2].split("/")[0])
                self.routes.append((ipaddress.ip_network(w[2], strict=False), w[4], None, w[2].split("/")[0]))
            elif w[:2] == ["neigh", "replace"]:
                assert w[3] == "lladdr" and w[5] == "dev" and w[7:] == ["nud", "permanent"], line
                self.neigh[(w[6], w[2])] = w[4]
            elif w[:2] == ["route", "replace"]:
                via = w[w.index("via") + 1] if "via" in w else None
                src = w[w.index("src") + 1] if "src" in w else None
                self.routes.append((ipaddress.ip_network(w[2]), w[w.index("dev") + 1], via, src))
            else:
                assert w[:2] == ["link", "set"], line

    def lookup(self, dst):
        addr = ipaddress.IPv4Address(dst)
        matches = [r for r in self.routes if addr in r[0]]
        assert matches, f"no route to {dst}"
        best = max(r[0].prefixlen for r in matches)
        chosen = [r for r in matches if r[0].prefixlen == best]
        assert len(chosen) == 1, chosen
        return chosen[0]


def _deliver(fabric, hosts, src, dst_ip):
    """The hosts a packet from `src` to `dst_ip` visits; the fabric delivers by destination IP inside a plane,
    the NVLink bridge by destination MAC; a host accepts only frames to its own MAC."""
    visited, host = [src], src
    source_ip = None
    for _ in range(4):
        h = hosts[host]
        if dst_ip in h.local:
            return visited, source_ip
        assert host == src or h.forwards, f"{host} does not forward"
        _, dev, via, src_hint = h.lookup(dst_ip)
        if host == src:
            source_ip = src_hint
        mac = h.neigh.get((dev, via or dst_ip))
        assert mac is not None, f"{host} has no neighbour {via or dst_ip} on {dev} (it would ARP)"
        peer = fabric.peer(host, int(dev.rsplit("-eth", 1)[1]))
        if fabric.node(peer)["kind"] == "nvlink":
            nxt = fabric.host_by_ip(naming.ip_for_mac(mac))
            assert fabric.nvlink_peer(nxt) == peer, f"{mac} is not on {peer}"
        else:
            plane = fabric.link(host, peer)["plane"]
            assert ipaddress.IPv4Address(dst_ip) in ipaddress.ip_network(naming.plane_subnet(plane))
            nxt = fabric.host_by_ip(dst_ip)
            nic = [r for r in fabric.node(nxt)["ports"].values() if r["plane"] == plane]
            assert nic and nic[0]["mac"] == mac, f"frame to {mac} reaches {nxt} on plane {plane}"
        visited.append(nxt)
        host = nxt
    raise AssertionError(f"{src} -> {dst_ip}: no delivery after {visited}")


@pytest.mark.parametrize("topo, params", [
    ("mpft", {}), ("mpft", {"planes": 4, "nodes": 4, "leaves": 2, "spines": 2, "storage": True}),
    ("mpft", {"planes": 3, "nodes": 4, "leaves": 2, "spines": 2, "multiport": True}),
    ("mrft", {}), ("ft2", {"k": 4})])
def test_every_gpu_reaches_every_gpu(topo, params):
    fabric = build(topo, **params)
    hosts = {h: _Host(fabric, h) for h in fabric.hosts()}
    storage = [h for h in fabric.hosts() if fabric.is_storage_plane(fabric.node(h)["plane"])]
    compute = [h for h in fabric.hosts() if h not in storage]
    for group in (compute, storage):
        for src in group:
            for dst in group:
                if src == dst:
                    continue
                path, source_ip = _deliver(fabric, hosts, src, fabric.ip(dst))
                assert path[-1] == dst
                fabric_ips = [r["ip"] for r in fabric.node(src)["ports"].values() if r["plane"] is not None]
                assert source_ip in (None, *fabric_ips)  # replies go to a fabric address, not NVLink's
                same_node = fabric.nvlink_peer(src) is not None and \
                    fabric.nvlink_peer(src) == fabric.nvlink_peer(dst)
                src_planes = {r["plane"] for r in fabric.node(src)["ports"].values()}
                if same_node or fabric.node(dst)["plane"] in src_planes:
                    assert len(path) == 2, path  # direct: over NVLink or inside one plane
                else:
                    assert len(path) == 3, path  # PXN through one same-node GPU
                    relay = fabric.node(path[1])
                    assert relay["node"] == fabric.node(src)["node"]
                    assert relay["plane"] == fabric.node(dst)["plane"]


def test_multiport_gpus_reach_every_plane_address_directly():
    fabric = build("mpft", planes=2, nodes=4, leaves=2, spines=2, multiport=True)
    hosts = {h: _Host(fabric, h) for h in fabric.hosts()}
    for dst in fabric.hosts():
        if fabric.nvlink_peer(dst) == fabric.nvlink_peer("n0g0"):
            continue
        for rec in fabric.node(dst)["ports"].values():
            if rec["plane"] is not None:
                path, _ = _deliver(fabric, hosts, "n0g0", rec["ip"])
                assert path == ["n0g0", dst]  # out of n0g0's own port on that plane, no PXN relay
