"""Table 3 of the paper from the fabric model: counts exactly, costs within 5 %, sane at other radices."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from emulator.analysis import scale
from emulator.model.errors import UserError

# The paper's Table 3 (64-port switches): endpoints, switches, switch-switch links, cost M$, cost k$/endpoint.
PAPER = {
    "FT2": (2_048, 96, 2_048, 9, 4.39),
    "MPFT": (16_384, 768, 16_384, 72, 4.39),
    "FT3": (65_536, 5_120, 131_072, 491, 7.5),
    "SF": (32_928, 1_568, 32_928, 146, 4.4),
    "DF": (261_632, 16_352, 384_272, 1_522, 5.8),
}


@pytest.fixture(scope="module")
def table64() -> dict[str, scale.CostRow]:
    return {row.key: row for row in scale.cost_table(64)}


def test_counts_at_radix_64_equal_the_paper(table64):
    assert list(table64) == list(PAPER)
    for key, (endpoints, switches, links, _, _) in PAPER.items():
        row = table64[key]
        assert (row.endpoints, row.switches, row.links) == (endpoints, switches, links), key


def test_fat_tree_rows_come_from_the_model_graphs(table64):
    assert [table64[k].source for k in ("FT2", "MPFT", "FT3")] == ["model"] * 3


@pytest.mark.parametrize("key", list(PAPER))
def test_cost_per_endpoint_within_5_percent_of_the_paper(table64, key):
    row = table64[key]
    paper_kusd = PAPER[key][4]
    assert row.cost_per_endpoint_usd / 1000 == pytest.approx(paper_kusd, rel=0.05)
    assert row.deviation == pytest.approx(row.cost_per_endpoint_usd / (paper_kusd * 1000) - 1)
    assert row.cost_usd / 1e6 == pytest.approx(PAPER[key][3], rel=0.05)


def test_mpft_costs_eight_ft2_planes(table64):
    assert table64["MPFT"].cost_usd == pytest.approx(8 * table64["FT2"].cost_usd)


@pytest.mark.parametrize("k", [8, 16, 32])
def test_fat_tree_closed_forms_match_the_model(k):
    # PAPER.md: FT2 k^2/2 hosts, 3k/2 switches; FT3 k^3/4 hosts, 5k^2/4 switches, k^3/2 links; MPFT = 8 x FT2
    ft2 = {"endpoints": k * k // 2, "switches": 3 * k // 2, "leaf-spine": k * k // 2}
    assert scale.model_link_counts("ft2", k) == ft2
    assert scale.model_link_counts("mpft", k) == {name: 8 * n for name, n in ft2.items()}
    ft3 = scale.model_link_counts("ft3", k)
    assert (ft3["endpoints"], ft3["switches"]) == (k ** 3 // 4, 5 * k * k // 4)
    assert ft3["leaf-spine"] + ft3["core-spine"] == k ** 3 // 2
    for topo in ("ft2", "mpft", "ft3"):
        assert scale.fat_tree_formula(topo, k) == scale.model_link_counts(topo, k)


@pytest.mark.parametrize("radix", [32, 128])
def test_other_radices_are_sane(table64, radix):
    rows = {row.key: row for row in scale.cost_table(radix)}
    small, large = (rows, table64) if radix < 64 else (table64, rows)
    for key in PAPER:
        row = rows[key]
        assert row.endpoints > 0 and row.switches > 0 and row.links > 0
        assert 1_000 < row.cost_per_endpoint_usd < 20_000
        assert row.deviation is None
        assert all(a > b for a, b in zip((large[key].endpoints, large[key].switches, large[key].links,
                                          large[key].cost_usd),
                                         (small[key].endpoints, small[key].switches, small[key].links,
                                          small[key].cost_usd), strict=True))
    ft2, mpft = rows["FT2"], rows["MPFT"]
    assert (mpft.endpoints, mpft.switches, mpft.links) == (8 * ft2.endpoints, 8 * ft2.switches, 8 * ft2.links)
    assert rows["FT3"].cost_per_endpoint_usd > ft2.cost_per_endpoint_usd


@pytest.mark.parametrize("radix", [30, 4, 260, "64"])
def test_bad_radix_is_a_user_error(radix):
    with pytest.raises(UserError):
        scale.cost_table(radix)


def test_slim_fly_row_is_the_papers_q28():
    # PAPER.md: q = 28 -> network radix 42, 21 endpoints per switch, 63 of 64 ports used
    assert scale.slim_fly_size(64) == (28, 42, 21)


@pytest.mark.parametrize("q", [5, 7])
def test_slim_fly_mms_graph(q):
    g = scale.slim_fly_graph(q)
    delta = 1 if q % 4 == 1 else -1
    assert g.number_of_nodes() == 2 * q * q
    assert {d for _, d in g.degree()} == {(3 * q - delta) // 2}
    assert nx.diameter(g) == 2
    closed = scale.slim_fly_formula(q)
    assert closed["switches"] == g.number_of_nodes()
    assert closed["network_radix"] == (3 * q - delta) // 2
    assert closed["links"] == g.number_of_edges()
    # the cost layout's rack blocks: groups (0, x, .) and (1, x, .) of one x
    assert closed["pair_links"] == sum(1 for a, b in g.edges if a[1] == b[1])


def test_slim_fly_graph_needs_a_prime():
    with pytest.raises(UserError):
        scale.slim_fly_graph(9)


def test_dragonfly_row_is_the_papers():
    # PAPER.md: 511 groups of 32 switches, 16 endpoints and 16 global links per switch
    assert scale.dragonfly_size(64) == (32, 16, 16, 511)


@pytest.mark.parametrize(("a", "h"), [(4, 2), (8, 4)])
def test_dragonfly_graph(a, h):
    groups = a * h - 1  # as in the paper's row: more global links than group pairs
    g = scale.dragonfly_graph(a, h, groups)
    assert nx.diameter(g) == 3
    assert {d for _, d in g.degree()} == {a - 1 + h}
    counts = scale.dragonfly_formula(a, h, h, groups)
    assert g.number_of_nodes() == counts["switches"]
    assert g.number_of_edges() == counts["local"] + counts["global"]
    linked = {frozenset((u[0], v[0])) for u, v, d in g.edges(data=True) if d.get("kind") == "global"}
    assert linked == {frozenset(p) for p in itertools.combinations(range(groups), 2)}
    assert counts["global"] - len(linked) == groups  # two spare ports per group: one parallel ring


def test_dragonfly_graph_refuses_too_many_groups():
    with pytest.raises(UserError):
        scale.dragonfly_graph(4, 2, 10)
