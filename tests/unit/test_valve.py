"""The apps' decisions (their valves) applied to fake switches that really forward (tests/unit/fakeswitch.py):
after a full sync every host pair on a plane is reachable over shortest paths; after a link fails and the
valve's repair is applied, every pair the model can still connect is reached around the failed link, and a
recovered link leaves exactly the state of a fresh sync; a sweep removes exactly what the app would not
install; adaptive re-weighting moves traffic off a loaded next hop; the least-loaded example pins new flows."""

from __future__ import annotations

from collections import Counter

import networkx as nx
import pytest
from os_ken.lib.packet import ethernet, ipv4, packet, udp

from controllers import openflow
from controllers.adaptive import SLOT_BITS, WEIGHT_SCALE, AdaptiveValve
from controllers.ecmp import EcmpValve
from controllers.examples.least_loaded import LeastLoadedValve
from controllers.spray import SprayValve
from controllers.static import StaticValve
from controllers.static_paths import assign_spines, permutation
from emulator.model.fabric import Fabric
from emulator.model.topologies import build
from tests.unit.fakeswitch import CONTROLLER, FakeFabric, SwitchError

FABRICS = {
    "ft2": ("ft2", {"k": 4}),
    "mpft": ("mpft", {"planes": 2, "nodes": 8, "leaves": 2, "spines": 2}),
    "mpft3s": ("mpft", {"planes": 2, "nodes": 8, "leaves": 2, "spines": 3}),
    "multiport": ("mpft", {"planes": 2, "nodes": 4, "leaves": 2, "spines": 2, "multiport": True}),
}
APPS = ("ecmp", "spray", "static", "adaptive")
UDP_SOURCES = (49152, 49153, 49154, 49155, 49159, 50001)


def _fabric(name: str) -> Fabric:
    topo, params = FABRICS[name]
    return build(topo, **params)


def _valve(app: str, fabric: Fabric):
    if app == "static":
        pairs = permutation(fabric, plane=0, shift=len(fabric.hosts(plane=0)) // 2)
        return StaticValve(fabric, assignment=assign_spines(fabric, pairs, balanced=True))
    return {"ecmp": EcmpValve, "spray": SprayValve, "adaptive": AdaptiveValve}[app](fabric)


def _synced(valve) -> FakeFabric:
    fake = FakeFabric(valve.fabric)
    for switch in valve.fabric.switches():
        fake.apply(valve.switch_connected(switch))
    return fake


def _pairs(fabric: Fabric):
    """(source host, destination address) of every host pair with NICs on one plane."""
    for plane in fabric.planes:
        nics = fabric.plane_nics(plane)
        yield from ((src, rec["ip"]) for src, _ in nics for dst, rec in nics if src != dst)


def _model_hops(fabric: Fabric, failed: set[frozenset[str]], src: str, dst_ip: str) -> int | None:
    """Links on a shortest path from `src` to `dst_ip` in the model without the failed links, or None."""
    dst = fabric.host_by_ip(dst_ip)
    plane = next(rec["plane"] for rec in fabric.node(dst)["ports"].values() if rec["ip"] == dst_ip)
    ends = [fabric.nic_on_plane(src, plane), fabric.nic_on_plane(dst, plane)]
    if {frozenset((src, ends[0])), frozenset((dst, ends[1]))} & failed:
        return None
    graph = nx.Graph()
    graph.add_nodes_from(fabric.switches(plane=plane))
    graph.add_edges_from((a, b) for a, b in fabric.links("fabric")
                         if fabric.link(a, b)["plane"] == plane and frozenset((a, b)) not in failed)
    try:
        return nx.shortest_path_length(graph, *ends) + 2
    except nx.NetworkXNoPath:
        return None


def _check_reachable(fake: FakeFabric) -> int:
    """Every pair the model connects is delivered on every path, over a shortest path that avoids failed links;
    returns how many pairs were checked."""
    checked = 0
    for src, dst_ip in _pairs(fake.fabric):
        hops = _model_hops(fake.fabric, fake.failed, src, dst_ip)
        if hops is None:
            continue
        for udp_src in UDP_SOURCES:
            for path in fake.walk(src, dst_ip, udp_src=udp_src):
                assert path.end == "delivered", (src, dst_ip, udp_src, path)
                assert len(path.nodes) - 1 == hops, path
                assert not path.links() & fake.failed, path
        checked += 1
    return checked


def _fail(valve, fake: FakeFabric, a: str, b: str, down: bool = True) -> dict:
    """Take a link down (or up) in the fake fabric and apply the valve's answer to each port-status message."""
    answers = {}
    for switch, port in fake.set_link(a, b, down):
        answers[switch] = valve.port_status(switch, port, down, fake.switches)
        fake.apply(answers[switch])
    return answers


# -- full sync ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("name", FABRICS)
def test_a_full_sync_reaches_every_host_pair_of_a_plane(name, app):
    fabric = _fabric(name)
    fake = _synced(_valve(app, fabric))
    assert _check_reachable(fake) == sum(1 for _ in _pairs(fabric)) > 0


@pytest.mark.parametrize("app", APPS)
def test_a_resync_leaves_the_state_as_it_was(app):
    valve = _valve(app, _fabric("mpft"))
    fake = _synced(valve)
    before = fake.state()
    for switch in valve.fabric.switches():
        fake.apply(valve.switch_connected(switch))
    assert fake.state() == before


def test_ecmp_hashes_over_every_spine_and_spray_steps_through_them():
    """ECMP's select group can send a flow to any spine; spraying sends consecutive source ports to the spines
    in turn (masked udp_src matches), each source port to exactly one."""
    fabric = _fabric("mpft3s")
    spines = set(fabric.switches(role="spine", plane=0))
    dst_ip = fabric.ip("n7g0")  # behind the other leaf
    ecmp = _synced(_valve("ecmp", fabric))
    assert {path.nodes[2] for path in ecmp.walk("n0g0", dst_ip)} == spines
    spray = _synced(_valve("spray", fabric))
    bits = openflow.spray_bits(len(spines))
    chosen = []
    for udp_src in range(49152, 49152 + (1 << bits)):
        [path] = spray.walk("n0g0", dst_ip, udp_src=udp_src)
        chosen.append(path.nodes[2])
    assert set(chosen) == spines
    assert sorted(chosen.count(s) for s in spines) == [5, 5, 6]  # 16 source-port values over 3 spines


def test_static_pins_each_pair_to_its_spine():
    fabric = _fabric("ft2")
    valve = _valve("static", fabric)
    fake = _synced(valve)
    assert valve.assignment
    for (src, dst), spine in valve.assignment.items():
        for udp_src in UDP_SOURCES:
            assert {path.nodes[2] for path in fake.walk(src, fabric.ip(dst), udp_src=udp_src)} == {spine}


# -- repair -----------------------------------------------------------------------------------------------------
LINKS = {
    "leaf-spine": ("p0l0", "p0s0"),   # the leaf has other uplinks: a local alternative
    "spine-far-leaf": ("p0s1", "p0l1"),  # other leaves must be steered away from this spine
}


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("app", APPS)
@pytest.mark.parametrize("name", FABRICS)
def test_after_a_link_failure_every_pair_is_reached_around_it(name, app, link):
    fabric = _fabric(name)
    valve = _valve(app, fabric)
    fake = _synced(valve)
    answers = _fail(valve, fake, *LINKS[link])
    first, second = answers.values()
    assert first and second == {}  # the second end's report changes nothing
    assert {fabric.node(s)["plane"] for s in first} == {0}  # only the failed link's plane is touched
    assert _check_reachable(fake) == sum(1 for _ in _pairs(fabric))


@pytest.mark.parametrize("app", APPS)
def test_a_failed_host_link_cuts_only_that_host(app):
    fabric = _fabric("mpft")
    valve = _valve(app, fabric)
    fake = _synced(valve)
    _fail(valve, fake, "n0g0", "p0l0")
    assert fake.failed == {frozenset(("n0g0", "p0l0"))}
    checked = _check_reachable(fake)
    assert checked == sum(1 for src, dst_ip in _pairs(fabric) if "n0g0" not in (src, fabric.host_by_ip(dst_ip)))


def test_without_the_repair_a_spine_that_lost_a_leaf_strands_traffic():
    """What the repair is for: the spine has no other way down, only the controller can steer the others away
    (and the fake switches notice)."""
    fabric = _fabric("mpft")
    valve = _valve("ecmp", fabric)
    fake = _synced(valve)
    events = fake.set_link("p0s1", "p0l1", down=True)
    paths = [p for udp_src in UDP_SOURCES for p in fake.walk("n0g0", fabric.ip("n7g0"), udp_src=udp_src)]
    assert "dead link" in {p.end for p in paths}
    for switch, port in events:
        fake.apply(valve.port_status(switch, port, True, fake.switches))
    assert _check_reachable(fake)


@pytest.mark.parametrize("link", LINKS)
@pytest.mark.parametrize("app", APPS)
def test_a_recovered_link_leaves_exactly_the_state_of_a_fresh_sync(app, link):
    """Repairs change switches in place and remove what only the old state had (a spray table matching source
    ports for three uplinks, when four are back), so nothing stale is left to overlap the new flows."""
    fabric = _fabric("mpft3s")
    valve = _valve(app, fabric)
    fake = _synced(valve)
    fresh = fake.state()
    _fail(valve, fake, *LINKS[link])
    assert fake.state() != fresh
    _fail(valve, fake, *LINKS[link], down=False)
    assert fake.state() == fresh
    assert _check_reachable(fake)


def test_ports_the_model_does_not_know_change_nothing():
    valve = _valve("ecmp", _fabric("mpft"))
    ofp = valve.dp.ofproto
    assert valve.port_status("p0l0", ofp.OFPP_LOCAL, True, ["p0l0"]) == {}
    assert valve.port_status("p0l0", 99, True, ["p0l0"]) == {}
    assert valve.failed_links == set()


# -- sweep ------------------------------------------------------------------------------------------------------
def _plant(dp, switch: str, fake: FakeFabric) -> int:
    """Flows and groups an earlier controller might have left on a switch; how many entries."""
    parser = dp.ofproto_parser
    drop = []
    own = next(match for table, priority, match in fake.switches[switch].flow_entries()
               if (table, priority) == (0, openflow.ROUTE_PRIORITY))
    msgs = [openflow.flow(dp, {"eth_type": 0x0800, "ipv4_dst": "10.99.0.1"}, drop, priority=30000),
            parser.OFPGroupMod(dp, command=dp.ofproto.OFPGC_ADD, type_=dp.ofproto.OFPGT_SELECT, group_id=4000,
                               buckets=[parser.OFPBucket(actions=[])]),
            openflow.flow(dp, {"eth_type": 0x0800, "ipv4_dst": "10.99.0.2"}, [parser.OFPActionGroup(4000)]),
            openflow.flow(dp, {"eth_type": 0x0800, "ip_proto": 17, "udp_src": 7}, drop, priority=5, table_id=1),
            openflow.flow(dp, dict(own.items()), [parser.OFPActionOutput(1)],
                          priority=openflow.ROUTE_PRIORITY + 1),  # shadows one of the app's own routes
            openflow.failover_group(dp, 4001, [1, 2])]
    for msg in msgs:
        fake.switches[switch].apply(msg)
    return len(msgs)


@pytest.mark.parametrize("app", APPS)
def test_a_sweep_removes_exactly_what_the_app_would_not_install(app):
    valve = _valve(app, _fabric("mpft"))
    fake = _synced(valve)
    fresh = fake.state()
    planted = _plant(valve.dp, "p0l0", fake) + _plant(valve.dp, "p1s1", fake)
    assert fake.state() != fresh
    deletions = 0
    for name, switch in fake.switches.items():  # one reply after the other, as the shim passes them on
        for part in ({"flows": switch.flow_entries()}, {"groups": switch.group_ids()}):
            answer = valve.sweep(name, **part)
            assert set(answer) == {name}
            deletions += len(answer[name])
            fake.apply(answer)
    assert fake.state() == fresh
    assert deletions == planted
    assert all(valve.sweep(name, switch.flow_entries(), switch.group_ids()) == {name: []}
               for name, switch in fake.switches.items())


# -- adaptive re-weighting ----------------------------------------------------------------------------------------
def test_reweighting_moves_traffic_off_loaded_next_hops_and_back():
    fabric = _fabric("mpft3s")
    valve = _valve("adaptive", fabric)
    fake = _synced(valve)
    leaf, dst_ip = "p0l0", fabric.ip("n7g0")
    uplinks = sorted(fabric.port(leaf, s) for s in fabric.switches(role="spine", plane=0))

    def shares() -> dict:
        return fake.switches[leaf].forward({"eth_type": 0x0800, "ipv4_dst": dst_ip})

    fake.apply(valve.reweight({}, fake.switches))  # first weights: every next hop idle
    assert shares() == pytest.approx({p: 1 / 3 for p in uplinks})
    assert valve.reweight({}, fake.switches) == {}  # nothing changed, nothing sent

    busy, backlogged, idle = uplinks
    bps = fabric.link(leaf, fabric.peer(leaf, busy))["bps"]
    valve.port_stats(leaf, [(busy, 0)], now=10.0)
    valve.port_stats(leaf, [(busy, int(bps / 8 / 2))], now=11.0)  # half the link rate over a second
    answer = valve.reweight({leaf: {str(backlogged): fabric.queue_bytes}}, fake.switches)
    assert set(answer) == {leaf}
    fake.apply(answer)
    share = shares()
    assert share[backlogged] < share[busy] < share[idle]
    weights = {b.actions[0][1]: b.weight for gid, g in fake.switches[leaf].groups.items()
               if gid < openflow.SPRAY_GROUP_BASE for b in g.buckets}
    assert weights[idle] == WEIGHT_SCALE
    before = fake.state()
    fake.apply(valve.switch_connected(leaf))  # a resync keeps the weights
    assert fake.state() == before

    valve.port_stats(leaf, [(busy, int(bps / 8 / 2))], now=12.0)  # no bytes since: idle again
    fake.apply(valve.reweight({}, fake.switches))
    assert shares() == pytest.approx({p: 1 / 3 for p in uplinks})


def test_a_slowed_spine_to_leaf_hop_thins_the_far_leaves_paths_until_restored():
    """Spine 0 -> leaf 0 at a quarter: leaf 3 sends a quarter share through spine 0 towards leaf 0 (but not towards
    leaf 1), as the model says once the app re-reads it; with the rate back, the shares are even again."""
    fabric = build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    slow = fabric.copy()
    slow.degrade("p0l0", "p0s0", 0.25, "b_to_a")
    valve = _valve("adaptive", slow)
    fake = _synced(valve)
    spine0 = fabric.port("p0l3", "p0s0")

    def shares(dst: str) -> dict:
        return fake.switches["p0l3"].forward({"eth_type": 0x0800, "ipv4_dst": fabric.ip(dst)})

    assert shares("h0")[spine0] == pytest.approx(25 / 325)
    assert shares("h4") == pytest.approx({p: 1 / 4 for p in shares("h4")})
    valve.set_rates(fabric)
    fake.apply(valve.reweight({}, fake.switches))
    assert shares("h0") == pytest.approx({p: 1 / 4 for p in shares("h0")})


def test_entropy_is_dealt_by_the_models_widths_and_only_rates_re_deal_it():
    """UDP packets stepping their source port are spread in proportion to path width (spray's round robin on a
    symmetric fabric), load does not move them (that would make OVS revalidate every poll), a slowed far hop does,
    and its restore deals them evenly again."""
    fabric = build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    valve = _valve("adaptive", fabric)
    fake = _synced(valve)
    uplinks = sorted(fabric.port("p0l3", s) for s in fabric.switches(role="spine", plane=0))
    spine0 = fabric.port("p0l3", "p0s0")

    def per_slot(dst: str) -> Counter:
        pkt = {"eth_type": 0x0800, "ip_proto": 17, "ipv4_dst": fabric.ip(dst)}
        return Counter(port for value in range(1 << SLOT_BITS)
                       for port, share in fake.switches["p0l3"].forward({**pkt, "udp_src": 49152 + value}).items()
                       if share == 1.0)

    even = per_slot("h0")
    assert even == {p: (1 << SLOT_BITS) // 4 for p in uplinks}
    assert [next(iter(fake.switches["p0l3"].forward({"eth_type": 0x0800, "ip_proto": 17, "udp_src": 49152 + v,
                                                      "ipv4_dst": fabric.ip("h0")}))) for v in range(4)] == uplinks
    valve.port_stats("p0l3", [(spine0, 0)], now=1.0)
    valve.port_stats("p0l3", [(spine0, 10**9)], now=2.0)
    answer = valve.reweight({"p0l3": {str(spine0): fabric.queue_bytes}}, fake.switches)
    assert all(msg.group_id < openflow.SPRAY_GROUP_BASE for msg in answer["p0l3"])  # only the select groups
    fake.apply(answer)
    assert per_slot("h0") == even

    slow = fabric.copy()
    slow.degrade("p0l0", "p0s0", 0.25, "b_to_a")
    valve.set_rates(slow)
    valve.tx_bps.clear()
    fake.apply(valve.reweight({}, fake.switches))
    assert 1 <= per_slot("h0")[spine0] <= round((1 << SLOT_BITS) * 25 / 325)  # its share, never nothing
    assert per_slot("h4") == even  # towards leaf 1 spine 0 is as wide as the others
    valve.set_rates(fabric)
    fake.apply(valve.reweight({}, fake.switches))
    assert per_slot("h0") == even


def test_port_stats_give_transmit_rates_from_consecutive_readings():
    valve = _valve("ecmp", _fabric("mpft"))
    valve.port_stats("p0l0", [(3, 1000)], now=5.0)
    assert valve.tx_bps == {}
    valve.port_stats("p0l0", [(3, 3000)], now=5.5)
    assert valve.tx_bps == {("p0l0", 3): pytest.approx(2000 * 8 / 0.5)}


# -- a user app: least-loaded placement ----------------------------------------------------------------------------
def _udp_packet(src_ip: str, dst_ip: str, udp_src: int, payload: int = 8000) -> bytes:
    """A UDP packet as the first of a flow reaches the app; a full one (bulk data) unless `payload` is small."""
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(ethertype=0x0800))
    pkt.add_protocol(ipv4.ipv4(src=src_ip, dst=dst_ip, proto=17))
    pkt.add_protocol(udp.udp(src_port=udp_src, dst_port=4791))
    pkt.add_protocol(bytes(payload))
    pkt.serialize()
    return bytes(pkt.data)


def test_least_loaded_pins_each_new_flow_to_the_least_loaded_uplink():
    fabric = _fabric("mpft3s")
    valve = LeastLoadedValve(fabric)
    fake = _synced(valve)
    leaf, src, dst_ip = "p0l0", "n0g0", fabric.ip("n7g0")
    assert {p.end for p in fake.walk(src, dst_ip)} == {CONTROLLER}  # a new flow goes to the app
    assert {p.end for p in fake.walk(src, fabric.ip("n1g0"))} == {"delivered"}  # same leaf: routed directly
    uplinks = sorted(fabric.port(leaf, s) for s in fabric.switches(role="spine", plane=0))
    valve.tx_bps.update({(leaf, uplinks[0]): 5e6, (leaf, uplinks[1]): 1e5, (leaf, uplinks[2]): 5e5})
    placed = []
    for udp_src in (50000, 50001):
        answer = valve.packet_in(leaf, valve.dp.ofproto_parser.OFPMatch(in_port=fabric.port(leaf, src)),
                                 _udp_packet(fabric.ip(src), dst_ip, udp_src))
        flow, packet_out = answer[leaf]
        fake.apply({leaf: [flow]})
        [path] = fake.walk(src, dst_ip, udp_src=udp_src)
        assert path.end == "delivered"
        placed.append(fabric.port(leaf, path.nodes[2]))
        assert [a.port for a in packet_out.actions] == placed[-1:]
    assert placed == [uplinks[1], uplinks[2]]  # the first flow placed makes its uplink the busier
    again = valve.packet_in(leaf, valve.dp.ofproto_parser.OFPMatch(in_port=fabric.port(leaf, src)),
                            _udp_packet(fabric.ip(src), dst_ip, 50000))[leaf]  # beat its flow entry to the switch
    assert [a.port for a in again[1].actions] == placed[:1]
    ack = valve.packet_in(leaf, valve.dp.ofproto_parser.OFPMatch(in_port=fabric.port(leaf, src)),
                          _udp_packet(fabric.ip(src), dst_ip, 50003, payload=40))[leaf]
    assert [a.port for a in ack[1].actions] == [uplinks[0]]  # small: not counted, so the next bulk flow goes there
    bulk = valve.packet_in(leaf, valve.dp.ofproto_parser.OFPMatch(in_port=fabric.port(leaf, src)),
                           _udp_packet(fabric.ip(src), dst_ip, 50004))[leaf]
    assert [a.port for a in bulk[1].actions] == [uplinks[0]]  # the busiest by rate, but no bulk flow on it yet
    assert {p.end for p in fake.walk(src, dst_ip, udp_src=50002)} == {CONTROLLER}


def test_least_loaded_keeps_two_new_flows_to_one_leaf_off_the_same_spine():
    """Flows from two leaves to one: the second leaf's uplinks are all idle, but one of them leads to the spine whose
    link down to that leaf the first flow now loads (ECMP or a look at the uplinks alone would collide there)."""
    fabric = build()  # 4 leaves of 4 GPUs and 4 spines per plane
    valve = LeastLoadedValve(fabric)
    fake = _synced(valve)
    spines = []
    for src, dst in (("n0g0", "n8g0"), ("n4g0", "n9g0")):  # leaves p0l0 and p0l1, both to p0l2
        leaf, dst_ip = fabric.nic_links(src)[0][0], fabric.ip(dst)
        [(flow, _out)] = [valve.packet_in(leaf, valve.dp.ofproto_parser.OFPMatch(in_port=fabric.port(leaf, src)),
                                          _udp_packet(fabric.ip(src), dst_ip, 50000))[leaf]]
        fake.apply({leaf: [flow]})
        [path] = fake.walk(src, dst_ip, udp_src=50000)
        assert path.end == "delivered" and fabric.nic_links(dst)[0][0] == path.nodes[3]
        spines.append(path.nodes[2])
    assert spines[0] != spines[1]


def test_the_fake_switch_refuses_what_open_vswitch_would():
    """The fake must be able to catch ordering mistakes and ambiguous tables, or the tests above prove little."""
    fabric = _fabric("mpft")
    valve = _valve("ecmp", fabric)
    msgs = valve.switch_messages("p0l0")
    fake = FakeFabric(fabric)
    with pytest.raises(SwitchError, match="do not exist"):  # a flow before the group it uses
        fake.apply({"p0l0": msgs[1:] + msgs[:1]})
    fake = _synced(valve)
    udp_drop = openflow.flow(valve.dp, {"eth_type": 0x0800, "ip_proto": 17}, [], priority=openflow.ROUTE_PRIORITY)
    fake.apply({"p0l0": [udp_drop]})  # as specific as the routes, at their priority
    with pytest.raises(SwitchError, match="flows of priority"):
        fake.walk("n0g0", fabric.ip("n7g0"))
