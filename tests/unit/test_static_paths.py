"""Static routing: the edge-colouring spine assignment is collision-free for every permutation on a non-blocking
two-tier plane (choosing the spine by destination is not), refuses what cannot be routed, and becomes pinned
flows on source leaves only, above ECMP's routes, decoded by Open vSwitch's own printer."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from os_ken.ofproto import ofproto_v1_5
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controllers import openflow
from controllers.routing import shortest_path_routes
from controllers.static import PINNED_PRIORITY, pinned_flow, static_messages
from controllers.static_paths import (
    assign_from_file,
    assign_spines,
    check_pattern,
    edge_colouring,
    entry_leaf,
    leaf_of,
    load_pattern,
    permutation,
    plane_spines,
)
from emulator.model.errors import UserError
from emulator.model.topologies import build

SEEDS = st.integers(0, 2**32 - 1)


@cache
def _ft2(leaves: int, spines: int, hosts_per_leaf: int):
    return build("ft2", leaves=leaves, spines=spines, hosts_per_leaf=hosts_per_leaf)


@cache
def _mpft():
    return build("mpft")


def _shared_links(fabric, assignment) -> set:
    """Leaf->spine and spine->leaf links that carry more than one assigned flow."""
    use = Counter()
    for (src, dst), spine in assignment.items():
        use[leaf_of(fabric, src), spine] += 1
        use[spine, leaf_of(fabric, dst)] += 1
    return {link for link, n in use.items() if n > 1}


def _check_collision_free(fabric, pairs) -> None:
    assignment = assign_spines(fabric, pairs)
    crossing = {(s, d) for s, d in pairs if leaf_of(fabric, s) != leaf_of(fabric, d)}
    assert set(assignment) == crossing
    for (src, _), spine in assignment.items():
        assert spine in plane_spines(fabric, fabric.node(src)["plane"])
    assert _shared_links(fabric, assignment) == set()


# -- collision-free on permutations ----------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(leaves=st.integers(2, 6), hosts=st.integers(1, 4), extra_spine=st.booleans(), seed=SEEDS)
def test_random_permutations_on_ft2_are_collision_free(leaves, hosts, extra_spine, seed):
    fabric = _ft2(leaves, hosts + extra_spine, hosts)
    _check_collision_free(fabric, permutation(fabric, 0, seed))


@pytest.mark.parametrize("plane", [0, 1])
@settings(max_examples=50, deadline=None)
@given(seed=SEEDS)
def test_random_permutations_on_each_mpft_plane_are_collision_free(plane, seed):
    fabric = _mpft()
    _check_collision_free(fabric, permutation(fabric, plane, seed))


@pytest.mark.parametrize(("leaves", "spines", "hosts"), [(4, 4, 4), (5, 3, 3), (3, 4, 2)])
def test_every_shift_permutation_is_collision_free(leaves, spines, hosts):
    fabric = _ft2(leaves, spines, hosts)
    for shift in range(leaves * hosts):
        _check_collision_free(fabric, permutation(fabric, 0, shift=shift))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=40))
def test_edge_colouring_uses_max_degree_colours(edges):
    sided = [(("l", u), ("r", v)) for u, v in edges]
    colours = edge_colouring(sided)
    degree = Counter(end for edge in sided for end in edge)
    assert all(0 <= c < max(degree.values()) for c in colours)
    at_vertex = Counter((end, c) for edge, c in zip(sided, colours, strict=True) for end in edge)
    assert set(at_vertex.values()) <= {1}


def test_choosing_the_spine_by_destination_collides():
    fabric = _ft2(4, 4, 4)
    spines = plane_spines(fabric, 0)

    def by_destination(pairs):
        return {(s, d): spines[fabric.node(d)["index"] % len(spines)] for s, d in pairs
                if leaf_of(fabric, s) != leaf_of(fabric, d)}

    seed = next(seed for seed in range(100) if _shared_links(fabric, by_destination(permutation(fabric, 0, seed))))
    pairs = permutation(fabric, 0, seed)
    assert _shared_links(fabric, assign_spines(fabric, pairs)) == set()


def test_same_leaf_and_repeated_pairs():
    fabric = _ft2(2, 2, 2)
    assert assign_spines(fabric, [("h0", "h1")]) == {}
    assert list(assign_spines(fabric, [("h0", "h2"), ("h0", "h2")])) == [("h0", "h2")]


def test_permutation_is_seeded_and_shifts():
    fabric = _mpft()
    assert permutation(fabric, 1, 5) == permutation(fabric, 1, 5) != permutation(fabric, 1, 6)
    assert permutation(fabric, 0, shift=1)[:2] == [("n0g0", "n1g0"), ("n1g0", "n2g0")]
    assert permutation(fabric, 0, shift=16) == []
    with pytest.raises(UserError) as err:
        permutation(fabric, 2)
    assert err.value.field == "plane"


# -- refused patterns --------------------------------------------------------------------------------------------
def test_more_flows_than_spines_is_refused():
    fabric = _ft2(2, 1, 2)
    with pytest.raises(UserError) as err:
        assign_spines(fabric, [("h0", "h2"), ("h1", "h3")])
    assert err.value.field == "pattern"
    assert "collision-free on plane 0" in str(err.value) and "p0l0 sends 2 flows" in str(err.value)


def test_cross_plane_pair_enters_at_the_pxn_relays_leaf():
    fabric = _mpft()
    assert entry_leaf(fabric, "n0g0", "n5g1") == leaf_of(fabric, "n0g1")
    assignment = assign_spines(fabric, [("n0g0", "n5g1"), ("n0g1", "n6g1")])
    assert len(assignment) == 2 and len(set(assignment.values())) == 2  # same entry leaf: different spines


def test_balanced_spreads_an_all_to_all_over_the_spines_evenly():
    fabric = _ft2(4, 2, 2)
    pairs = [(s, d) for s in fabric.hosts() for d in fabric.hosts() if s != d]
    with pytest.raises(UserError):
        assign_spines(fabric, pairs)
    use = Counter()
    for (s, d), spine in assign_spines(fabric, pairs, balanced=True).items():
        use[leaf_of(fabric, s), spine] += 1
        use[spine, leaf_of(fabric, d)] += 1
    assert max(use.values()) - min(use.values()) <= 1, use


def test_three_tier_plane_is_refused():
    fabric = build("ft3", k=4)
    with pytest.raises(UserError) as err:
        assign_spines(fabric, [("h0", "h15")])
    assert err.value.field == "topo"


@pytest.mark.parametrize(("text", "field", "line"), [
    ("{", None, 1),
    ('{"flows": []}', "pairs", None),
    ('{"pairs": [["h0", "h1"], ["h2"]]}', "pairs[1]", None),
    ('{"pairs": [["h0", 3]]}', "pairs[0]", None),
])
def test_bad_pattern_files(tmp_path, text, field, line):
    path = tmp_path / "pattern.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_pattern(path)
    assert (err.value.file, err.value.field, err.value.line) == (str(path), field, line)
    assert "\n" not in str(err.value)


def test_missing_pattern_file(tmp_path):
    with pytest.raises(UserError) as err:
        load_pattern(tmp_path / "nope.json")
    assert err.value.file == str(tmp_path / "nope.json")


@pytest.mark.parametrize(("pairs", "field"), [
    ([("n0g0", "n5g0"), ("n0g0", "n99g0")], "pairs[1]"),
    ([("p0l0", "n5g0")], "pairs[0]"),
    ([("n0g0", "n5g0"), ("n1g0", "n6g0"), ("n2g0", "n2g0")], "pairs[2]"),
])
def test_check_pattern_names_the_bad_entry(pairs, field):
    with pytest.raises(UserError) as err:
        check_pattern(_mpft(), pairs)
    assert err.value.field == field


def test_assign_from_file_names_the_file(tmp_path):
    fabric = _mpft()
    path = tmp_path / "pattern.json"
    path.write_text(json.dumps({"pairs": [["n0g0", "n5g0"], ["n1g0", "n9g0"]]}))
    assert assign_from_file(fabric, path) == assign_spines(fabric, [("n0g0", "n5g0"), ("n1g0", "n9g0")])
    path.write_text(json.dumps({"pairs": [["n0g0", "x1"]]}))
    with pytest.raises(UserError) as err:
        assign_from_file(fabric, path)
    assert str(err.value).startswith(f"{path}: pairs[0]: unknown host")


# -- OpenFlow messages ---------------------------------------------------------------------------------------------
@pytest.fixture
def dp():
    return ProtocolDesc(ofproto_v1_5.OFP_VERSION)


def _encoded(msgs):
    return [openflow.encode(m, xid=i + 1) for i, m in enumerate(msgs)]


def _pinned(dp, msgs):
    return [m for m in msgs if isinstance(m, dp.ofproto_parser.OFPFlowMod) and m.priority == PINNED_PRIORITY]


def test_pinned_flows_only_on_source_leaves(dp):
    fabric = _mpft()
    routes = shortest_path_routes(fabric)
    assignment = assign_spines(fabric, permutation(fabric, 0, 1) + permutation(fabric, 1, 2))
    assert assignment
    for switch in fabric.switches():
        basis = openflow.hash_basis(switch)
        msgs = static_messages(dp, fabric, routes, assignment, switch, basis)
        ecmp = openflow.route_messages(dp, routes[switch], basis, "dp_hash")
        assert _encoded(msgs[:len(ecmp)]) == _encoded(ecmp)
        got = set()
        for flow in _pinned(dp, msgs[len(ecmp):]):
            [inst] = flow.instructions
            [action] = inst.actions
            assert flow.match["eth_type"] == 0x0800 and flow.cookie == openflow.COOKIE
            got.add((fabric.host_by_ip(flow.match["ipv4_src"]), fabric.host_by_ip(flow.match["ipv4_dst"]),
                     fabric.peer(switch, action.port)))
        assert got == {(s, d, spine) for (s, d), spine in assignment.items() if leaf_of(fabric, s) == switch}
        assert len(msgs) == len(ecmp) + len(got)


def test_without_a_pattern_it_is_ecmp(dp):
    fabric = _mpft()
    routes = shortest_path_routes(fabric)
    for switch in fabric.switches():
        basis = openflow.hash_basis(switch, 3)
        assert _encoded(static_messages(dp, fabric, routes, {}, switch, basis)) == \
            _encoded(openflow.route_messages(dp, routes[switch], basis, "dp_hash"))


@pytest.mark.skipif(shutil.which("ovs-ofctl") is None, reason="ovs-ofctl is not installed")
def test_ovs_decodes_a_pinned_flow(dp):
    fabric = _mpft()
    [((src, dst), spine)] = assign_spines(fabric, [("n0g1", "n9g1")]).items()
    leaf = leaf_of(fabric, src)
    port = fabric.port(leaf, spine)
    wire = openflow.encode(pinned_flow(dp, fabric.ip(src), fabric.ip(dst), port))
    run = subprocess.run(["ovs-ofctl", "ofp-print", wire.hex()], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    text = run.stdout
    assert "OFPT_FLOW_MOD (OF1.5)" in text and f"priority={PINNED_PRIORITY}" in text
    assert f"nw_src={fabric.ip(src)}" in text and f"nw_dst={fabric.ip(dst)}" in text
    assert f"actions=output:{port}" in text and f"cookie:{openflow.COOKIE:#x}" in text
