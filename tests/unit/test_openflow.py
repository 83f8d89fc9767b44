"""OpenFlow 1.5 builders: select groups carrying OVS's selection-method property, route tables turned into
groups and flows, byte-identical on rebuild, and decoded by Open vSwitch's own printer."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from os_ken.ofproto import ofproto_v1_5
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controllers import openflow
from controllers.routing import shortest_path_routes
from emulator.model import naming
from emulator.model.topologies import build

REPO = Path(__file__).resolve().parents[2]
NTR_VENDOR_ID = 0x0000154D  # Netronome's OUI, under which OVS defines the selection-method property


@pytest.fixture
def dp():
    return ProtocolDesc(ofproto_v1_5.OFP_VERSION)


def _words_to_bytes(words):
    return b"".join(struct.pack("!I", w) for w in words)


# -- select groups ------------------------------------------------------------------------------------------
def test_select_group_has_one_bucket_per_port(dp):
    ports = [7, 3, 9, 12]
    msg = openflow.select_group(dp, 5, ports, basis=1234)
    assert msg.group_id == 5 and msg.type == dp.ofproto.OFPGT_SELECT
    assert msg.command == 0x8000  # OVS's ADD_OR_MOD extension, so a resync modifies in place
    assert [b.bucket_id for b in msg.buckets] == list(range(len(ports)))
    assert [[a.port for a in b.actions] for b in msg.buckets] == [[p] for p in ports]
    assert all([p.weight for p in b.properties if hasattr(p, "weight")] == [1] for b in msg.buckets)
    # every bucket watches its own port, so the switch skips a dead link by itself
    assert [[p.watch for p in b.properties if hasattr(p, "watch")] for b in msg.buckets] == [[p] for p in ports]


def test_select_group_weights(dp):
    msg = openflow.select_group(dp, 1, [1, 2, 3], basis=0, weights=[3, 1, 2])
    assert [[p.weight for p in b.properties if hasattr(p, "weight")] for b in msg.buckets] == [[3], [1], [2]]


@pytest.mark.parametrize("method", ["dp_hash", "hash"])
@pytest.mark.parametrize("basis", [0, 1, 0xFEEC5722, 2**64 - 1])
def test_selection_method_property(dp, method, basis):
    msg = openflow.select_group(dp, 1, [1, 2], basis=basis, method=method)
    [prop] = msg.properties
    assert prop.type == dp.ofproto.OFPGPT_EXPERIMENTER
    assert prop.experimenter == NTR_VENDOR_ID
    assert prop.exp_type == 1  # NTRT_SELECTION_METHOD
    data = _words_to_bytes(prop.data)
    # OVS's struct ntr_group_prop_selection_method after the 12-byte header: pad[4], char[16], be64 param
    assert len(data) == 4 + 16 + 8
    assert data[:4] == bytes(4)
    assert data[4:20] == method.encode().ljust(16, b"\0")
    assert struct.unpack("!Q", data[20:])[0] == basis


def test_selection_method_property_on_the_wire(dp):
    basis = 0x0123456789ABCDEF
    wire = openflow.encode(openflow.select_group(dp, 1, [1, 2], basis=basis))
    # type OFPGPT_EXPERIMENTER, length 40 (OVS refuses shorter), experimenter, exp_type
    header = struct.pack("!HHII", 0xFFFF, 40, NTR_VENDOR_ID, 1)
    start = wire.index(header)
    assert wire[start + 12:start + 40] == bytes(4) + b"dp_hash".ljust(16, b"\0") + struct.pack("!Q", basis)
    assert struct.unpack("!H", wire[2:4])[0] == len(wire)


def test_unknown_selection_method_is_refused(dp):
    with pytest.raises(ValueError):
        openflow.select_group(dp, 1, [1, 2], basis=0, method="round_robin")


# -- hash basis ---------------------------------------------------------------------------------------------
def test_hash_basis_differs_between_switches():
    for fabric in (build("mpft", planes=8, k=8), build("ft3", k=8)):
        bases = [openflow.hash_basis(s) for s in fabric.switches()]
        assert len(set(bases)) == len(bases)
        assert all(0 <= b < 2**32 for b in bases)


def test_hash_basis_depends_on_the_seed():
    assert openflow.hash_basis("p0l0", seed=0) != openflow.hash_basis("p0l0", seed=1)
    assert openflow.hash_basis("p0l0", seed=7) == openflow.hash_basis("p0l0", seed=7)


def test_hash_basis_is_stable_across_processes():
    # Python's own hash() of a string changes with PYTHONHASHSEED; the basis must not.
    names = ["p0l0", "p1s3", "stl0"]
    code = ("import sys; from controllers.openflow import hash_basis; "
            "print(*[hash_basis(n, 3) for n in sys.argv[1:]])")
    outputs = set()
    for seed in ("1", "2"):
        run = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}, cwd=REPO)
        outputs.add(run.stdout.strip())
    assert outputs == {" ".join(str(openflow.hash_basis(n, 3)) for n in names)}


# -- route messages -----------------------------------------------------------------------------------------
def _flows(dp, msgs):
    return [m for m in msgs if isinstance(m, dp.ofproto_parser.OFPFlowMod)]


def _groups(dp, msgs):
    return [m for m in msgs if isinstance(m, dp.ofproto_parser.OFPGroupMod)]


def _flow_action(flow):
    [inst] = flow.instructions
    [action] = inst.actions
    return action


def test_route_messages_for_a_synthetic_table(dp):
    routes = {"10.0.0.1": (1,), "10.0.0.2": (2,), "10.0.0.5": (5, 6, 7, 8), "10.0.0.6": (5, 6, 7, 8),
              "10.0.0.7": (5, 6)}
    msgs = openflow.route_messages(dp, routes, basis=99)
    groups = _groups(dp, msgs)
    assert msgs[:len(groups)] == groups  # groups before the flows that use them
    buckets = {g.group_id: [b.actions[0].port for b in g.buckets] for g in groups}
    assert buckets == {1: [5, 6], 2: [5, 6, 7, 8]}
    flows = _flows(dp, msgs)
    assert len(flows) == len(routes) + 1
    by_ip = {f.match["ipv4_dst"]: f for f in flows if f.priority != 0}
    assert set(by_ip) == set(routes)
    parser = dp.ofproto_parser
    for ip, ports in routes.items():
        flow = by_ip[ip]
        assert flow.match["eth_type"] == 0x0800
        assert flow.priority == openflow.ROUTE_PRIORITY
        assert flow.cookie & openflow.COOKIE_MASK == openflow.COOKIE
        action = _flow_action(flow)
        if len(ports) == 1:
            assert isinstance(action, parser.OFPActionOutput) and action.port == ports[0]
        else:
            assert isinstance(action, parser.OFPActionGroup)
            group = next(g for g in groups if g.group_id == action.group_id)
            assert tuple(b.actions[0].port for b in group.buckets) == ports


def test_route_messages_end_with_one_drop_miss(dp):
    msgs = openflow.route_messages(dp, {"10.0.0.1": (1,)}, basis=0)
    misses = [f for f in _flows(dp, msgs) if f.priority == 0]
    assert len(misses) == 1 and msgs[-1] is misses[0]
    assert misses[0].instructions == [] and dict(misses[0].match.items()) == {}
    assert openflow.route_messages(dp, {}, basis=0)[-1].priority == 0
    assert len(openflow.route_messages(dp, {}, basis=0)) == 1


def test_route_messages_for_the_default_fabric(dp):
    fabric = build()
    routes = shortest_path_routes(fabric)
    leaf, spine = naming.switch_name("leaf", 1, 2), naming.switch_name("spine", 1, 0)
    leaf_msgs = openflow.route_messages(dp, routes[leaf], openflow.hash_basis(leaf))
    # 4 local GPUs output directly, 12 remote ones share one group over the 4 spines
    [group] = _groups(dp, leaf_msgs)
    assert len(group.buckets) == 4
    assert _words_to_bytes(group.properties[0].data)[20:] == struct.pack("!Q", openflow.hash_basis(leaf))
    actions = [_flow_action(f) for f in _flows(dp, leaf_msgs) if f.priority != 0]
    assert len(actions) == 16
    assert sum(isinstance(a, dp.ofproto_parser.OFPActionGroup) for a in actions) == 12
    spine_msgs = openflow.route_messages(dp, routes[spine], openflow.hash_basis(spine))
    assert _groups(dp, spine_msgs) == [] and len(spine_msgs) == 16 + 1


def _encoded(msgs):
    return [openflow.encode(m, xid=i + 1) for i, m in enumerate(msgs)]


def test_route_messages_are_byte_identical_when_rebuilt(dp):
    fabric = build("ft3", k=4)
    routes = shortest_path_routes(fabric)
    for switch in fabric.switches():
        basis = openflow.hash_basis(switch)
        first = _encoded(openflow.route_messages(dp, routes[switch], basis))
        fresh_dp = ProtocolDesc(ofproto_v1_5.OFP_VERSION)
        again = _encoded(openflow.route_messages(fresh_dp, routes[switch], basis))
        shuffled = dict(reversed(list(routes[switch].items())))
        reordered = _encoded(openflow.route_messages(dp, shuffled, basis))
        assert first == again == reordered


def test_routes_from_rebuilt_models_give_identical_bytes(dp):
    a, b = build("mpft"), build("mpft")
    ra, rb = shortest_path_routes(a), shortest_path_routes(b)
    for switch in a.switches():
        basis = openflow.hash_basis(switch)
        assert _encoded(openflow.route_messages(dp, ra[switch], basis)) == \
            _encoded(openflow.route_messages(dp, rb[switch], basis))


# -- decoded by Open vSwitch ---------------------------------------------------------------------------------
def _ofp_print(wire: bytes) -> str:
    run = subprocess.run(["ovs-ofctl", "ofp-print", wire.hex()], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    return run.stdout


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl is not installed")
def test_ovs_decodes_the_messages(dp):
    leaf = naming.switch_name("leaf", 0, 1)
    basis = openflow.hash_basis(leaf)
    routes = {"10.0.0.5": (1,), "10.0.0.9": (5, 6, 7, 8)}
    group, single, grouped, miss = openflow.route_messages(dp, routes, basis)
    text = _ofp_print(openflow.encode(group))
    assert "OFPT_GROUP_MOD (OF1.5)" in text
    assert "ADD_OR_MOD" in text and "group_id=1" in text and "type=select" in text
    assert "selection_method=dp_hash" in text
    assert f"selection_method_param={basis}" in text
    assert [f"actions=output:{p}" in text for p in (5, 6, 7, 8)] == [True] * 4
    text = _ofp_print(openflow.encode(single))
    assert "OFPT_FLOW_MOD (OF1.5)" in text and "ADD" in text
    assert "priority=100" in text and "nw_dst=10.0.0.5" in text and "actions=output:1" in text
    assert f"cookie:{openflow.COOKIE:#x}" in text
    text = _ofp_print(openflow.encode(grouped))
    assert "nw_dst=10.0.0.9" in text and "actions=group:1" in text
    text = _ofp_print(openflow.encode(miss))
    assert "priority=0" in text and "actions=drop" in text and "nw_dst" not in text


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl is not installed")
def test_ovs_decodes_a_64_bit_basis_and_the_hash_method(dp):
    basis = 2**64 - 2
    text = _ofp_print(openflow.encode(openflow.select_group(dp, 7, [2, 3], basis=basis, method="hash")))
    assert "selection_method=hash" in text and f"selection_method_param={basis}" in text
    assert "group_id=7" in text


def test_spray_tables_map_source_port_bits_round_robin_with_failover(dp):
    """A leaf's remote destinations go to a spray table whose 2^b source-port values each pick a fast-failover
    group starting at a different uplink, so stepping the source port walks the uplinks in turn."""
    from controllers.routing import shortest_path_routes
    from emulator.model import topologies

    routes = shortest_path_routes(topologies.build())["p0l0"]
    msgs = openflow.spray_messages(dp, routes, basis=1)
    ofp = dp.ofproto
    ff = [m for m in msgs if getattr(m, "type", None) == ofp.OFPGT_FF]
    assert len(ff) == 4  # 4 uplinks: 2 bits, one group per value
    firsts = [m.buckets[0].actions[0].port for m in ff]
    assert sorted(firsts) == [5, 6, 7, 8] and all(len(m.buckets) == 4 for m in ff)
    udp = [m for m in msgs if getattr(m, "table_id", 0) == 1 and m.priority == openflow.ROUTE_PRIORITY]
    assert sorted(m.match["udp_src"] for m in udp) == [(v, 3) for v in range(4)]
    gotos = [m for m in msgs if getattr(m, "table_id", None) == 0 and m.priority == openflow.ROUTE_PRIORITY
             and m.instructions[0].__class__.__name__ == "OFPInstructionGotoTable"]
    assert len(gotos) == 12  # the 12 GPUs of plane 0 behind other leaves


@pytest.mark.parametrize("n, bits", [(1, 1), (2, 1), (4, 2), (8, 3), (3, 4), (6, 5)])
def test_spray_bits_even_for_powers_of_two_and_fine_otherwise(n, bits):
    assert openflow.spray_bits(n) == bits
    counts = [sum(1 for v in range(1 << bits) if v % n == i) for i in range(n)]
    assert max(counts) - min(counts) <= (0 if n & (n - 1) == 0 else 1)


def test_failover_group_watches_each_port_in_order(dp):
    msg = openflow.failover_group(dp, 7, [6, 7, 5])
    assert msg.type == dp.ofproto.OFPGT_FF and msg.command == openflow.OFPGC_ADD_OR_MOD
    assert [b.actions[0].port for b in msg.buckets] == [6, 7, 5]
    assert [[p.watch for p in b.properties] for b in msg.buckets] == [[6], [7], [5]]


def test_goto_flow_sends_a_destination_to_its_table(dp):
    msg = openflow.goto_flow(dp, "10.0.0.9", table_id=3)
    assert msg.table_id == 0 and msg.match["ipv4_dst"] == "10.0.0.9"
    assert msg.instructions[0].table_id == 3


# -- sweeping what a switch should not hold -------------------------------------------------------------------
@pytest.mark.parametrize("builder", ["ecmp", "spray", "static"])
def test_a_flow_read_back_from_the_wire_has_the_key_it_was_sent_with(dp, builder):
    """The sweep compares flows a switch reports (matches parsed from its bytes) with the messages the app sent
    (matches built in Python): every key must survive the round trip, masked source ports included."""
    from controllers.static import pinned_flow

    routes = shortest_path_routes(build("mpft", planes=2, nodes=8, leaves=2, spines=2))
    table = routes["p0l0"]
    msgs = {"ecmp": lambda: openflow.route_messages(dp, table, basis=7),
            "spray": lambda: openflow.spray_messages(dp, table, basis=7),
            "static": lambda: [pinned_flow(dp, "10.0.0.1", "10.0.0.5", 3)]}[builder]()
    flows, groups = openflow.state_of(msgs)
    assert flows and (groups or builder == "static")
    parser = dp.ofproto_parser
    for m in msgs:
        if isinstance(m, parser.OFPFlowMod):
            buf = bytearray()
            m.match.serialize(buf, 0)
            back = parser.OFPMatch.parser(bytes(buf), 0)
            assert openflow.flow_key(m.table_id, m.priority, back) in flows


def test_state_of_keeps_one_key_per_table_priority_and_match(dp):
    a = openflow.flow(dp, {"eth_type": 0x0800, "ipv4_dst": "10.0.0.1"}, [], priority=5)
    b = openflow.flow(dp, {"ipv4_dst": "10.0.0.1", "eth_type": 0x0800}, [dp.ofproto_parser.OFPActionOutput(2)],
                      priority=5)  # same flow, other actions and field order: one key
    c = openflow.flow(dp, {"eth_type": 0x0800, "ipv4_dst": "10.0.0.1"}, [], priority=6)
    flows, groups = openflow.state_of([a, b, c, openflow.failover_group(dp, 4, [1, 2])])
    assert len(flows) == 2 and groups == {4}
