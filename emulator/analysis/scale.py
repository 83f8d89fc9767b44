"""Topology scale and cost at full size: the paper's Table 3 from the same model the emulator runs.

FT2, MPFT and FT3 counts are read from the real fabric graphs (emulator.topologies), so a scaled-down
experiment and its full-size counterpart are one object; past MODEL_LIMIT endpoints (radix 128 FT3 has
half a million) their closed forms stand in, checked against the graphs by the unit tests. Slim Fly and
Dragonfly have graph builders for small instances and closed forms at full size.

Cost model. The paper costs Table 3 with the method of the Slim Fly paper (Besta & Hoefler, "Slim Fly: a
cost effective low-diameter network topology", SC'14, cost and power section): a switch costs a price per
port times its radix; a cable costs a fixed part plus a part per metre, electrical inside a rack and optical
between racks; lengths come from a floor plan of racks on a square grid (mean Manhattan distance between
racks plus the runs up and down them). Their coefficients are 2014 prices for 40 Gb/s FDR10 InfiniBand and
the paper does not publish the ones it used, so CostParams holds round 400 Gb/s-era magnitudes (a 64-port
switch at $64k, a 2 m DAC at $300, an optical link at $1,000 + $5/m for two transceivers and fibre, racks
0.6 m apart) fitted once, as one set for all five topologies, to Table 3's cost per endpoint (all rows
within 1.5 %). `mpft cost` prints each row's deviation from the paper so the fit stays visible.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

import networkx as nx

from emulator.model.errors import UserError
from emulator.model.topologies import build

MPFT_PLANES = 8
MODEL_LIMIT = 65_536  # endpoints: a graph this size builds in a few seconds; beyond it, closed forms

# Table 3 as printed in the paper (64-port switches), for the deviation column.
PAPER_RADIX = 64
PAPER_COST_PER_ENDPOINT_KUSD = {"FT2": 4.39, "MPFT": 4.39, "FT3": 7.5, "SF": 4.4, "DF": 5.8}


@dataclass(frozen=True)
class CableClass:
    """`count` cables of one kind; `racks` is the size of the rack block they span (None: inside one rack)."""

    name: str
    count: int
    racks: float | None


@dataclass(frozen=True)
class TopologyCounts:
    """One Table 3 row before costing: the counts, where they came from, and the cable layout."""

    key: str
    label: str
    radix: int
    endpoints: int
    switches: int
    links: int  # switch-switch links
    source: str  # "model" (read from the built graph) or "closed form"
    cables: tuple[CableClass, ...]


@dataclass(frozen=True)
class CostParams:
    """One parameter set for every topology (see the module docstring for provenance)."""

    usd_per_switch_port: float = 1000.0
    electric_usd: float = 200.0
    electric_usd_per_m: float = 50.0
    optical_usd: float = 1000.0
    optical_usd_per_m: float = 5.0
    endpoints_per_rack: int = 32  # four 8-GPU nodes and their leaf (or router)
    rack_pitch_m: float = 0.6  # distance between neighbouring racks on the grid
    in_rack_m: float = 2.0  # a cable inside one rack
    riser_m: float = 2.0  # up out of one rack and down into another

    def cable_usd(self, racks: float | None) -> float:
        """Mean cost of a cable between two random racks of a square block of `racks` racks."""
        if racks is None or racks <= 1:
            return self.electric_usd + self.electric_usd_per_m * self.in_rack_m
        side = math.sqrt(racks)
        length = self.riser_m + self.rack_pitch_m * 2 * (side * side - 1) / (3 * side)
        return self.optical_usd + self.optical_usd_per_m * length


@dataclass(frozen=True)
class CostRow:
    """A costed Table 3 row; `deviation` is relative to the paper's cost per endpoint (radix 64 only)."""

    key: str
    label: str
    endpoints: int
    switches: int
    links: int
    source: str
    switch_usd: float
    cable_usd: float
    cost_usd: float
    cost_per_endpoint_usd: float
    paper_kusd_per_endpoint: float | None
    deviation: float | None
    cables: list[dict[str, Any]]  # per cable class: name, count, usd_each, electric


def check_radix(radix: int) -> int:
    """Every topology here needs the switch radix to be a multiple of 4 (Dragonfly splits it in quarters)."""
    if isinstance(radix, bool) or not isinstance(radix, int) or not 8 <= radix <= 256 or radix % 4:
        raise UserError(f"must be a multiple of 4 from 8 to 256, got {radix!r}", field="radix")
    return radix


# -- fat trees: the emulator's own model ------------------------------------------------------------
def fat_tree_formula(topo: str, k: int) -> dict[str, int]:
    """Closed forms of ft2, mpft (8 planes) and ft3 at radix k, in the shape of model_link_counts."""
    half = k // 2
    if topo == "ft2":
        return {"endpoints": k * half, "switches": k + half, "leaf-spine": k * half}
    if topo == "mpft":
        return {"endpoints": MPFT_PLANES * k * half, "switches": MPFT_PLANES * (k + half),
                "leaf-spine": MPFT_PLANES * k * half}
    if topo == "ft3":
        return {"endpoints": k ** 3 // 4, "switches": 5 * k * k // 4, "leaf-spine": k ** 3 // 4,
                "core-spine": k ** 3 // 4}
    raise ValueError(topo)


def model_link_counts(topo: str, k: int) -> dict[str, int]:
    """Endpoints, switches and switch-switch links by tier pair, read from the built fabric graph."""
    return dict(_model_link_counts(topo, k))


@cache
def _model_link_counts(topo: str, k: int) -> tuple[tuple[str, int], ...]:
    """Cached, since a 65,536-host FT3 takes seconds to build and several rows and tests read it."""
    params = {"planes": MPFT_PLANES, "k": k} if topo == "mpft" else {"k": k}
    fabric = build(topo, **params)
    counts = fabric.counts()
    tiers: Counter[str] = Counter()
    for a, b, d in fabric.graph.edges(data=True):
        if d["kind"] == "fabric":
            tiers["-".join(sorted((fabric.node(a)["role"], fabric.node(b)["role"])))] += 1
    return (("endpoints", counts["hosts"]), ("switches", counts["switches"]), *sorted(tiers.items()))


def fat_tree_counts(topo: str, radix: int, params: CostParams) -> TopologyCounts:
    """FT2, MPFT or FT3 counts: from the model graph up to MODEL_LIMIT endpoints, else the closed form."""
    formula = fat_tree_formula(topo, radix)
    from_model = formula["endpoints"] <= MODEL_LIMIT
    c = model_link_counts(topo, radix) if from_model else formula
    endpoints = c["endpoints"]
    rack = params.endpoints_per_rack
    if topo == "ft3":
        pod_endpoints = (radix // 2) ** 2
        cables = (CableClass("host", endpoints, None),
                  CableClass("leaf-aggregation", c["leaf-spine"], pod_endpoints / rack),
                  CableClass("aggregation-core", c["core-spine"], endpoints / rack))
        label, links = "FT3", c["leaf-spine"] + c["core-spine"]
    else:
        planes = MPFT_PLANES if topo == "mpft" else 1
        # each plane is laid out as the FT2 it is, so MPFT costs planes x FT2 (the paper's 72 = 8 x 9 M$)
        cables = (CableClass("host", endpoints, None),
                  CableClass("leaf-spine", c["leaf-spine"], endpoints / planes / rack))
        label = f"MPFT ({planes} planes)" if topo == "mpft" else "FT2"
        links = c["leaf-spine"]
    return TopologyCounts(topo.upper(), label, radix, endpoints, c["switches"], links,
                          "model" if from_model else "closed form", cables)


# -- Slim Fly -------------------------------------------------------------------------------------------
def slim_fly_delta(q: int) -> int:
    """delta in q = 4w + delta; MMS graphs exist for delta in {-1, 0, 1}."""
    delta = {0: 0, 1: 1, 3: -1}.get(q % 4)
    if delta is None:
        raise UserError(f"q = {q} is 2 mod 4; Slim Fly needs q = 4w + delta, delta in -1, 0, 1", field="q")
    return delta


def slim_fly_size(radix: int) -> tuple[int, int, int]:
    """(q, network radix k', endpoints per switch p) of the largest Slim Fly whose k' + p fits the radix.

    p = ceil(k'/2) gives full global bandwidth. Like the paper (q = 28 at radix 64) q need not be a prime
    power here: the counts are closed forms, whether or not an MMS graph of that q exists."""
    best = None
    for q in range(3, radix):
        if q % 4 != 2:
            c = slim_fly_formula(q)
            if c["network_radix"] + c["endpoints_per_switch"] <= radix:
                best = (q, c["network_radix"], c["endpoints_per_switch"])
    if best is None:
        raise UserError(f"no Slim Fly fits radix {radix}", field="radix")
    return best


def slim_fly_formula(q: int) -> dict[str, int]:
    """Closed form for a Slim Fly of q: 2q^2 switches of network radix k' = (3q - delta)/2, p = ceil(k'/2)
    endpoints each, q^2 k' links, of which `pair_links` join the groups (0, x, .) and (1, x, .) of one x:
    a switch's |X| = (q - delta)/2 intra-group links and one cross link."""
    k_net = (3 * q - slim_fly_delta(q)) // 2
    p = math.ceil(k_net / 2)
    return {"network_radix": k_net, "endpoints_per_switch": p, "switches": 2 * q * q,
            "endpoints": 2 * q * q * p, "links": q * q * k_net,
            "pair_links": q * q * ((q - slim_fly_delta(q)) // 2 + 1)}


def slim_fly_counts(radix: int, params: CostParams) -> TopologyCounts:
    """Closed form; a block of racks holds groups (0, x, .) and (1, x, .) as in the Slim Fly paper."""
    q, _, p = slim_fly_size(radix)
    c = slim_fly_formula(q)
    rack = params.endpoints_per_rack
    cables = (CableClass("host", c["endpoints"], None),
              CableClass("intra-group-pair", c["pair_links"], 2 * q * p / rack),
              CableClass("inter-group", c["links"] - c["pair_links"], c["endpoints"] / rack))
    return TopologyCounts("SF", f"Slim Fly (q={q})", radix, c["endpoints"], c["switches"], c["links"],
                          "closed form", cables)


def _primitive_root(q: int) -> int:
    order = q - 1
    factors = {f for f in range(2, order + 1) if order % f == 0 and all(f % d for d in range(2, f))}
    return next(g for g in range(2, q) if all(pow(g, order // f, q) != 1 for f in factors))


def slim_fly_graph(q: int) -> nx.Graph:
    """MMS graph of a Slim Fly for prime q, as the Slim Fly paper builds it: switches (s, x, y) over GF(q);
    (0,x,y)~(0,x,y') if y-y' in X, (1,m,c)~(1,m,c') if c-c' in X', (0,x,y)~(1,m,c) if y = m x + c."""
    if q < 3 or any(q % d == 0 for d in range(2, math.isqrt(q) + 1)):
        raise UserError(f"the graph builder takes an odd prime q, got {q}", field="q")
    delta = slim_fly_delta(q)
    xi = _primitive_root(q)
    w = (q - delta) // 4
    if delta == 1:
        x_exp, x2_exp = range(0, q - 2, 2), range(1, q - 1, 2)
    else:
        x_exp = [*range(0, 2 * w - 1, 2), *range(2 * w - 1, 4 * w - 2, 2)]
        x2_exp = [*range(1, 2 * w, 2), *range(2 * w, 4 * w - 1, 2)]
    gen = {pow(xi, e, q) for e in x_exp}
    gen2 = {pow(xi, e, q) for e in x2_exp}
    g = nx.Graph(q=q, delta=delta)
    gf = range(q)
    g.add_nodes_from((s, x, y) for s in (0, 1) for x in gf for y in gf)
    for x, y, y2 in itertools.product(gf, gf, gf):
        if (y - y2) % q in gen:
            g.add_edge((0, x, y), (0, x, y2))
        if (y - y2) % q in gen2:
            g.add_edge((1, x, y), (1, x, y2))
    for x, y, m in itertools.product(gf, gf, gf):
        g.add_edge((0, x, y), (1, m, (y - m * x) % q))
    return g


# -- Dragonfly ----------------------------------------------------------------------------------------
def dragonfly_size(radix: int) -> tuple[int, int, int, int]:
    """(a switches per group, p endpoints, h global links per switch, g groups) at a radix.

    The balanced a = 2p = 2h of Kim et al.; g = a h - 1 is the paper's row (511 groups at radix 64): each
    group has a h global ports for g - 1 peers, so two ports per group double up an existing pair."""
    a, p, h = radix // 2, radix // 4, radix // 4
    return a, p, h, a * h - 1


def dragonfly_formula(a: int, p: int, h: int, g: int) -> dict[str, int]:
    """Switches, endpoints, intra-group (complete groups) and global links of a Dragonfly."""
    return {"switches": g * a, "endpoints": g * a * p, "local": g * math.comb(a, 2), "global": g * a * h // 2}


def dragonfly_counts(radix: int, params: CostParams) -> TopologyCounts:
    """Closed form; a group's switches and endpoints share a block of racks, global cables span the floor."""
    a, p, h, g = dragonfly_size(radix)
    c = dragonfly_formula(a, p, h, g)
    rack = params.endpoints_per_rack
    cables = (CableClass("host", c["endpoints"], None),
              CableClass("intra-group", c["local"], a * p / rack),
              CableClass("global", c["global"], c["endpoints"] / rack))
    return TopologyCounts("DF", f"Dragonfly (g={g})", radix, c["endpoints"], c["switches"],
                          c["local"] + c["global"], "closed form", cables)


def dragonfly_graph(a: int, h: int, groups: int) -> nx.MultiGraph:
    """A Dragonfly's switches: complete groups of `a`, each switch with `h` global links. Every pair of groups
    gets one global link; spare ports (a h - groups + 1 per group, even) add rings of parallel links."""
    spare = a * h - (groups - 1)
    if groups < 2 or spare < 0 or spare % 2 or spare // 2 >= groups:
        raise UserError(f"{groups} groups do not fit {a} switches x {h} global links", field="groups")
    g = nx.MultiGraph(a=a, h=h, groups=groups)
    for grp in range(groups):
        g.add_nodes_from((grp, s) for s in range(a))
        g.add_edges_from(((grp, s), (grp, t)) for s, t in itertools.combinations(range(a), 2))
    pairs = list(itertools.combinations(range(groups), 2))
    pairs += [(grp, (grp + r) % groups) for r in range(1, spare // 2 + 1) for grp in range(groups)]
    used = [0] * groups  # global ports taken so far; port t sits on switch t // h
    for i, j in pairs:
        g.add_edge((i, used[i] // h), (j, used[j] // h), kind="global")
        used[i] += 1
        used[j] += 1
    return g


# -- the table --------------------------------------------------------------------------------------
def table3_counts(radix: int = PAPER_RADIX, params: CostParams | None = None) -> list[TopologyCounts]:
    """The five rows of Table 3 at a switch radix."""
    radix = check_radix(radix)
    params = params or CostParams()
    return [fat_tree_counts("ft2", radix, params), fat_tree_counts("mpft", radix, params),
            fat_tree_counts("ft3", radix, params), slim_fly_counts(radix, params),
            dragonfly_counts(radix, params)]


def cost_row(counts: TopologyCounts, params: CostParams) -> CostRow:
    """Switches by ports plus every cable class at its mean cost; the paper's figure at radix 64."""
    switch_usd = counts.switches * counts.radix * params.usd_per_switch_port
    cable_usd = sum(c.count * params.cable_usd(c.racks) for c in counts.cables)
    total = switch_usd + cable_usd
    per_endpoint = total / counts.endpoints
    paper = PAPER_COST_PER_ENDPOINT_KUSD[counts.key] if counts.radix == PAPER_RADIX else None
    return CostRow(counts.key, counts.label, counts.endpoints, counts.switches, counts.links, counts.source,
                   switch_usd, cable_usd, total, per_endpoint, paper,
                   None if paper is None else per_endpoint / (paper * 1000) - 1,
                   [{"name": c.name, "count": c.count, "usd_each": params.cable_usd(c.racks),
                     "electric": c.racks is None or c.racks <= 1} for c in counts.cables])


def cost_table(radix: int = PAPER_RADIX, params: CostParams | None = None) -> list[CostRow]:
    """Table 3 with costs: counts, total cost and cost per endpoint, and the deviation from the paper."""
    params = params or CostParams()
    return [cost_row(c, params) for c in table3_counts(radix, params)]
