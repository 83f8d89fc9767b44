"""Back-of-envelope limits from the paper, computed rather than quoted: the expert-parallel decode bound,
node-limited routing, and path diversity of a fabric model with what random flow hashing makes of it.

These are the analytic companions the studies compare their measurements against. GB here is 10^9 bytes.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from dataclasses import dataclass
from fractions import Fraction

import networkx as nx

from emulator.model.errors import UserError
from emulator.model.fabric import Fabric


def _positive(name: str, value: float, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not value > 0 or (integer and value != int(value)):
        kind = "a positive whole number" if integer else "a positive number"
        raise UserError(f"must be {kind}, got {value!r}", field=name)


# -- decode speed -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeLimit:
    """Time to exchange one layer's dispatch + combine over the scale-out link, and per output token."""

    bandwidth_gbps: float  # GB/s, GB = 10^9 bytes
    tokens: int  # tokens per device
    hidden: int
    experts_per_token: int
    dispatch_bytes: float  # bytes per element
    combine_bytes: float
    layers: int
    micro_batches: int
    exchange_bytes: float
    exchange_us: float
    token_ms: float
    tokens_per_s: float


def decode_limit(bandwidth_gbps: float = 50.0, tokens: int = 32, hidden: int = 7000,
                 experts_per_token: int = 9, dispatch_bytes: float = 1.0, combine_bytes: float = 2.0,
                 layers: int = 61, micro_batches: int = 2) -> DecodeLimit:
    """(dispatch + combine bytes) x tokens x experts x hidden / bandwidth is one layer's exchange; with
    micro-batches overlapping compute and communication, a token takes micro_batches exchanges per layer."""
    for name, value in (("bandwidth_gbps", bandwidth_gbps), ("dispatch_bytes", dispatch_bytes),
                        ("combine_bytes", combine_bytes)):
        _positive(name, value)
    for name, value in (("tokens", tokens), ("hidden", hidden), ("experts_per_token", experts_per_token),
                        ("layers", layers), ("micro_batches", micro_batches)):
        _positive(name, value, integer=True)
    exchange_bytes = (dispatch_bytes + combine_bytes) * tokens * experts_per_token * hidden
    exchange_s = exchange_bytes / (bandwidth_gbps * 1e9)
    token_s = micro_batches * exchange_s * layers
    return DecodeLimit(bandwidth_gbps, tokens, hidden, experts_per_token, dispatch_bytes, combine_bytes,
                       layers, micro_batches, exchange_bytes, exchange_s * 1e6, token_s * 1e3, 1 / token_s)


# -- node-limited routing -----------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeLimit:
    """Scale-out traffic per token: each destination node gets the token once and NVLink fans it out."""

    experts: int
    nodes: int
    experts_per_node: int
    top_k: int
    limit: int  # M: most nodes a token may reach
    hidden: int
    bytes_per_element: float
    worst_nodes_unrestricted: int
    worst_nodes_limited: int
    expected_nodes_unrestricted: float
    nodes_distribution: list[float]  # P(a token reaches exactly j nodes), j = 0.., without the limit
    share_over_limit: float  # fraction of tokens the limit constrains (they would reach more than M nodes)
    bytes_worst_unrestricted: float
    bytes_expected_unrestricted: float
    bytes_worst_limited: float


def nodes_distribution(experts: int, nodes: int, top_k: int) -> list[Fraction]:
    """Exact P(j distinct nodes) when top_k experts are drawn uniformly without replacement from `experts`
    spread evenly over `nodes` (inclusion-exclusion over which of the j chosen nodes are left empty)."""
    per_node = experts // nodes
    total = math.comb(experts, top_k)
    dist = []
    for j in range(nodes + 1):
        onto = sum((-1) ** i * math.comb(j, i) * math.comb((j - i) * per_node, top_k) for i in range(j + 1))
        dist.append(Fraction(math.comb(nodes, j) * onto, total))
    return dist


def node_limit(experts: int = 256, nodes: int = 8, top_k: int = 8, limit: int = 4, hidden: int = 7000,
               bytes_per_element: float = 1.0) -> NodeLimit:
    """Nodes per token and scale-out dispatch bytes per token with and without a node limit M."""
    for name, value in (("experts", experts), ("nodes", nodes), ("top_k", top_k), ("limit", limit),
                        ("hidden", hidden)):
        _positive(name, value, integer=True)
    _positive("bytes_per_element", bytes_per_element)
    if experts % nodes:
        raise UserError(f"{experts} experts do not spread evenly over {nodes} nodes", field="experts")
    if top_k > experts:
        raise UserError(f"cannot route to {top_k} of {experts} experts", field="top_k")
    per_node = experts // nodes
    if limit * per_node < top_k:
        raise UserError(f"{limit} nodes of {per_node} experts cannot hold {top_k} experts", field="limit")
    dist = nodes_distribution(experts, nodes, top_k)
    # E[distinct nodes] = nodes x P(a given node gets at least one of the chosen experts)
    expected = nodes * (1 - Fraction(math.comb(experts - per_node, top_k), math.comb(experts, top_k)))
    worst = min(top_k, nodes)
    worst_limited = min(worst, limit)
    token_bytes = hidden * bytes_per_element
    return NodeLimit(experts, nodes, per_node, top_k, limit, hidden, bytes_per_element, worst, worst_limited,
                     float(expected), [float(p) for p in dist], float(sum(dist[limit + 1:])),
                     worst * token_bytes, float(expected) * token_bytes, worst_limited * token_bytes)


# -- path diversity -----------------------------------------------------------------------------------
PATH_WORK_LIMIT = 20_000_000  # about ten seconds of breadth-first search


@dataclass(frozen=True)
class PairClass:
    """Host pairs on one plane that have `paths` equal-cost paths crossing `switches` switches."""

    paths: int
    switches: int
    pairs: int


def _switch_graph(fabric: Fabric, plane: int) -> nx.Graph:
    """A plane's switches and the links between them: only switches transit inside a plane."""
    return fabric.graph.subgraph(fabric.switches(plane=plane))


def _shortest_path_counts(graph: nx.Graph, source: str) -> dict[str, tuple[int, int]]:
    """node -> (distance, number of shortest paths) from `source`, by breadth-first search."""
    found = {source: (0, 1)}
    queue = deque([source])
    while queue:
        node = queue.popleft()
        dist, count = found[node]
        for peer in graph[node]:
            if peer not in found:
                found[peer] = (dist + 1, count)
                queue.append(peer)
            elif found[peer][0] == dist + 1:
                found[peer] = (dist + 1, found[peer][1] + count)
    return found


def _leaf_of(fabric: Fabric, host: str, plane: int) -> str:
    leaf = fabric.nic_on_plane(host, plane)
    if leaf is not None:
        return leaf
    raise UserError(f"host {host} has no NIC on plane {plane}", field="plane")


def equal_cost_paths(fabric: Fabric, src: str, dst: str, plane: int | None = None) -> int:
    """Number of shortest paths between two hosts' NICs on a plane (their first common plane by default)."""
    if plane is None:
        common = sorted(fabric.nic_planes(src) & fabric.nic_planes(dst))
        if not common:
            raise UserError(f"{src} and {dst} share no plane", field="plane")
        plane = common[0]
    a, b = _leaf_of(fabric, src, plane), _leaf_of(fabric, dst, plane)
    if a == b:
        return 1
    found = _shortest_path_counts(_switch_graph(fabric, plane), a)
    if b not in found:
        return 0
    return found[b][1]


def path_classes(fabric: Fabric) -> list[PairClass]:
    """Every pair of hosts sharing a plane, grouped by (equal-cost paths, switches crossed), over all planes.

    One breadth-first search per leaf; fabrics needing more than PATH_WORK_LIMIT link visits are refused."""
    tally: Counter[tuple[int, int]] = Counter()
    for plane in fabric.planes:
        attached = Counter(_leaf_of(fabric, h, plane) for h in fabric.hosts()
                           if plane in fabric.nic_planes(h))
        leaves = sorted(attached)
        graph = _switch_graph(fabric, plane)
        if len(leaves) * graph.number_of_edges() > PATH_WORK_LIMIT:
            raise UserError(f"{len(leaves)} leaves x {graph.number_of_edges()} links per plane is too large "
                            "to enumerate paths; use a smaller radix", field="topo")
        for i, a in enumerate(leaves):
            tally[1, 1] += math.comb(attached[a], 2)
            found = _shortest_path_counts(graph, a)
            for b in leaves[i + 1:]:
                dist, count = found.get(b, (-1, 0))
                tally[count, dist + 1] += attached[a] * attached[b]
    return [PairClass(paths, switches, pairs) for (paths, switches), pairs in sorted(tally.items()) if pairs]


@dataclass(frozen=True)
class Hashing:
    """F flows hashed onto n equal-cost paths versus sprayed evenly over them (loads in flows per path)."""

    paths: int
    flows: int
    used_fraction: float  # expected share of paths carrying at least one flow
    used_paths: float
    max_load_hashed: float  # expected busiest path's flow count (Monte Carlo)
    max_load_sprayed: float  # F / n: spraying spreads every flow over every path
    trials: int
    seed: int


def used_fraction(paths: int, flows: int) -> float:
    """Expected share of n paths used by F uniformly hashed flows: 1 - (1 - 1/n)^F (-> 1 - 1/e at F = n)."""
    return -math.expm1(flows * math.log1p(-1 / paths)) if paths > 1 else 1.0


def expected_max_load(paths: int, flows: int, trials: int = 2000, seed: int = 0) -> float:
    """Mean over `trials` seeded throws of F flows onto n paths of the busiest path's flow count."""
    rng = random.Random(seed)
    choices = range(paths)
    total = 0
    for _ in range(trials):
        load = [0] * paths
        for path in rng.choices(choices, k=flows):
            load[path] += 1
        total += max(load)
    return total / trials


def hashing(paths: int, flows: int, trials: int = 2000, seed: int = 0) -> Hashing:
    _positive("paths", paths, integer=True)
    _positive("flows", flows, integer=True)
    _positive("trials", trials, integer=True)
    used = used_fraction(paths, flows)
    return Hashing(paths, flows, used, used * paths, expected_max_load(paths, flows, trials, seed),
                   flows / paths, trials, seed)
