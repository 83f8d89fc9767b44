"""The paper's back-of-envelope limits, path diversity, and the analysis subcommands' JSON."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from collections import Counter
from fractions import Fraction

import pytest

from emulator.analysis import limits
from emulator.cli.analysis import add_commands
from emulator.model.errors import UserError
from emulator.model.topologies import build


# -- decode limit (PAPER.md: 120.96 us, 14.76 ms, ~67.8 tokens/s; 6.72 us, 0.82 ms at 900 GB/s) -------
def test_decode_limit_with_the_papers_inputs():
    r = limits.decode_limit(bandwidth_gbps=50, tokens=32, hidden=7000, experts_per_token=9, dispatch_bytes=1,
                            combine_bytes=2, layers=61, micro_batches=2)
    assert round(r.exchange_us, 2) == 120.96
    assert round(r.token_ms, 2) == 14.76
    assert round(r.tokens_per_s, 1) == 67.8
    assert math.floor(r.tokens_per_s) == 67  # the paper's "67 tokens/s"


def test_decode_limit_at_nvl72_bandwidth():
    r = limits.decode_limit(bandwidth_gbps=900)
    assert round(r.exchange_us, 2) == 6.72
    assert round(r.token_ms, 2) == 0.82
    assert r.tokens_per_s == pytest.approx(1200, rel=0.02)  # the paper's "about 1,200 tokens/s"


@pytest.mark.parametrize("bad", [{"bandwidth_gbps": 0}, {"tokens": -1}, {"layers": 1.5},
                                 {"hidden": float("inf")}, {"micro_batches": True}])
def test_decode_limit_refuses_bad_values(bad):
    with pytest.raises(UserError):
        limits.decode_limit(**bad)


# -- node-limited routing --------------------------------------------------------------------------------
def test_node_limit_with_the_papers_placement():
    r = limits.node_limit(experts=256, nodes=8, top_k=8, limit=4, hidden=7000, bytes_per_element=1)
    assert (r.worst_nodes_unrestricted, r.worst_nodes_limited) == (8, 4)  # "cost falls from 8t to Mt"
    assert r.bytes_worst_limited / r.bytes_worst_unrestricted == 0.5
    assert round(r.expected_nodes_unrestricted, 1) == 5.3
    # by hand: 8 x (1 - C(224, 8) / C(256, 8)) = 5.29465...
    assert round(r.expected_nodes_unrestricted, 3) == 5.295
    dist = r.nodes_distribution
    assert sum(dist) == pytest.approx(1)
    assert sum(j * p for j, p in enumerate(dist)) == pytest.approx(r.expected_nodes_unrestricted, abs=1e-12)
    assert r.share_over_limit == pytest.approx(sum(dist[5:]))
    assert r.bytes_expected_unrestricted == pytest.approx(r.expected_nodes_unrestricted * 7000)


def test_nodes_distribution_matches_enumeration():
    experts, nodes, top_k = 12, 4, 4
    seen = Counter(len({e // (experts // nodes) for e in chosen})
                   for chosen in itertools.combinations(range(experts), top_k))
    total = math.comb(experts, top_k)
    assert limits.nodes_distribution(experts, nodes, top_k) == [Fraction(seen[j], total)
                                                                for j in range(nodes + 1)]


@pytest.mark.parametrize("bad", [{"limit": 0}, {"experts": 250}, {"top_k": 300}, {"limit": 1, "top_k": 40}])
def test_node_limit_refuses_bad_values(bad):
    with pytest.raises(UserError):
        limits.node_limit(**bad)


# -- path diversity --------------------------------------------------------------------------------------
def _hosts_by_leaf(fabric, plane=0):
    table: dict[str, list[str]] = {}
    for host in fabric.hosts():
        for leaf, data in fabric.graph[host].items():
            if data["kind"] == "host" and data["plane"] == plane:
                table.setdefault(leaf, []).append(host)
    return list(table.values())


def test_equal_cost_paths_on_a_small_ft2():
    fabric = build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    first, second = _hosts_by_leaf(fabric)[:2]
    assert limits.equal_cost_paths(fabric, first[0], first[1]) == 1
    assert limits.equal_cost_paths(fabric, first[0], second[0]) == 4
    classes = limits.path_classes(fabric)
    assert [(c.paths, c.switches, c.pairs) for c in classes] == [(1, 1, 4 * math.comb(4, 2)),
                                                                  (4, 3, math.comb(16, 2) - 24)]


def test_path_classes_of_a_three_tier_fat_tree():
    k = 4
    classes = {(c.paths, c.switches): c.pairs for c in limits.path_classes(build("ft3", k=k))}
    half = k // 2
    same_leaf = k * half * math.comb(half, 2)
    same_pod = k * math.comb(half, 2) * half * half
    assert classes == {(1, 1): same_leaf, (half, 3): same_pod,
                       (half * half, 5): math.comb(k ** 3 // 4, 2) - same_leaf - same_pod}


def test_hosts_never_transit_inside_a_plane():
    # two GPUs of one node sit on different rail leaves, joined by NVLink: the fabric still offers 4 paths
    fabric = build("mrft", gpus=2, nodes=16, leaves_per_rail=4, spines=4)
    g0, g1 = sorted(h for h in fabric.hosts() if fabric.node(h)["node"] == 0)
    assert limits.equal_cost_paths(fabric, g0, g1) == 4


def test_mpft_pairs_only_within_a_plane():
    fabric = build("mpft", planes=2, nodes=16, leaves=4, spines=4)
    classes = limits.path_classes(fabric)
    assert sum(c.pairs for c in classes) == 2 * math.comb(16, 2)
    assert {c.paths for c in classes} == {1, 4}


def test_used_fraction_tends_to_one_minus_one_over_e():
    assert limits.used_fraction(10 ** 6, 10 ** 6) == pytest.approx(1 - 1 / math.e, abs=1e-6)
    assert round(limits.used_fraction(1000, 1000), 3) == 0.632  # "about 63 %"


def test_hashing_matches_enumeration_of_a_small_case():
    n = flows = 4
    outcomes = list(itertools.product(range(n), repeat=flows))
    used = statistics.fmean(len(set(o)) / n for o in outcomes)
    busiest = statistics.fmean(max(Counter(o).values()) for o in outcomes)
    h = limits.hashing(n, flows, trials=20_000, seed=1)
    assert h.used_fraction == pytest.approx(used)
    assert h.max_load_hashed == pytest.approx(busiest, abs=0.05)
    assert h.max_load_sprayed == 1.0
    assert limits.hashing(n, flows, trials=500, seed=7) == limits.hashing(n, flows, trials=500, seed=7)


# -- the subcommands -------------------------------------------------------------------------------------
def _run(argv: list[str], capsys) -> dict:
    parser = argparse.ArgumentParser(prog="mpft")
    add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out)


def test_cost_command_json(capsys):
    data = _run(["cost", "--json"], capsys)
    rows = {r["key"]: r for r in data["rows"]}
    ft3 = rows["FT3"]
    assert (ft3["endpoints"], ft3["switches"], ft3["links"]) == (65_536, 5_120, 131_072)
    assert (rows["DF"]["endpoints"], rows["DF"]["links"]) == (261_632, 384_272)
    assert all(abs(r["deviation"]) < 0.05 for r in data["rows"])


def test_decode_limit_command_json(capsys):
    data = _run(["decode-limit", "--json"], capsys)
    assert [(round(r["exchange_us"], 2), round(r["token_ms"], 2)) for r in data["limits"]] == \
        [(120.96, 14.76), (6.72, 0.82)]


def test_node_limit_command_json(capsys):
    data = _run(["node-limit", "--json"], capsys)
    assert (data["worst_nodes_unrestricted"], data["worst_nodes_limited"]) == (8, 4)
    assert round(data["expected_nodes_unrestricted"], 1) == 5.3


def test_paths_command_json(capsys):
    argv = ["paths", "--topo", "ft2", "--leaves", "4", "--spines", "4", "--flows", "4", "--json"]
    data = _run(argv, capsys)
    assert {(c["paths"], c["switches"]) for c in data["pair_classes"]} == {(1, 1), (4, 3)}
    [h] = data["hashing"]
    assert h["used_fraction"] == pytest.approx(1 - (3 / 4) ** 4)


def test_bad_command_values_are_user_errors():
    parser = argparse.ArgumentParser(prog="mpft")
    add_commands(parser.add_subparsers(dest="command", required=True))
    for argv in (["cost", "--radix", "30"], ["paths", "--topo", "ft3", "--planes", "2"],
                 ["node-limit", "--limit", "0"]):
        args = parser.parse_args(argv)
        with pytest.raises(UserError):
            args.func(args)
