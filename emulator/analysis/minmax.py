"""The least time demands need on a fabric whose equal-cost paths are not alike: a min-max multicommodity flow
linear programme over the links the routing allows (HiGHS, through scipy.optimize.linprog).

Splitting evenly over equal-cost next hops is optimal when those next hops lead to alike paths (regular
leaf-spine and fat-tree planes of one link rate). With a link slowed, or on an irregular model, a transport that
sends less over the slow path beats the even split, so only the programme's optimum bounds every transport.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx

Link = tuple[str, str]  # directed: (from node, to node)
Pair = tuple[str, str]  # (source, destination) of a demand
UNIT = 1e6  # bits and bit/s in millions keep the programme's coefficients near 1


def min_max_s(demands: dict[Pair, float], allowed: dict[Pair, Iterable[Link]], capacity: dict[Link, float]) -> float:
    """The least T such that every demand's bits can cross its allowed links (a DAG from its source to its
    destination, split there as a transport pleases) with no link carrying more than its capacity × T.

    Variables: per demand, the fraction of it on each of its links, and T. Per demand and node but its
    destination: what leaves minus what arrives is 1 at the source, 0 elsewhere; per link: the bits on it
    at most capacity × T; minimise T."""
    import numpy as np  # scipy takes 0.4 s to import: only asymmetric fabrics' bounds pay for it
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    demands = {pair: bits for pair, bits in demands.items() if bits > 0}
    if not demands:
        return 0.0
    columns: list[tuple[int, Link]] = []  # (demand index, link) of every fraction variable
    rows_eq, cols_eq, vals_eq, rhs_eq = [], [], [], []
    node_row: dict[tuple[int, str], int] = {}
    for k, pair in enumerate(demands):
        src, dst = pair
        for link in allowed[pair]:
            col = len(columns)
            columns.append((k, link))
            for node, sign in ((link[0], 1.0), (link[1], -1.0)):
                if node == dst:
                    continue
                if (k, node) not in node_row:
                    node_row[(k, node)] = len(rhs_eq)
                    rhs_eq.append(1.0 if node == src else 0.0)
                rows_eq.append(node_row[(k, node)])
                cols_eq.append(col)
                vals_eq.append(sign)
    t_col = len(columns)
    links = sorted({link for _, link in columns})
    link_row = {link: i for i, link in enumerate(links)}
    bits = list(demands.values())
    rows_ub = [link_row[link] for _, link in columns] + list(range(len(links)))
    cols_ub = list(range(len(columns))) + [t_col] * len(links)
    vals_ub = [bits[k] / UNIT for k, _ in columns] + [-capacity[link] / UNIT for link in links]
    cost = np.zeros(t_col + 1)
    cost[t_col] = 1.0
    result = linprog(cost,
                     A_ub=coo_matrix((vals_ub, (rows_ub, cols_ub)), shape=(len(links), t_col + 1)).tocsr(),
                     b_ub=np.zeros(len(links)),
                     A_eq=coo_matrix((vals_eq, (rows_eq, cols_eq)), shape=(len(rhs_eq), t_col + 1)).tocsr(),
                     b_eq=np.array(rhs_eq), bounds=(0, None), method="highs")
    if result.status != 0:
        raise RuntimeError(f"the min-max programme found no optimum: {result.message}")
    return float(result.x[t_col])


def max_flow_bps(src: str, dst: str, links: Iterable[Link], capacity: dict[Link, float]) -> float:
    """The most one demand alone can get from `src` to `dst` over its allowed links (bit/s)."""
    graph = nx.DiGraph()
    graph.add_edges_from((a, b, {"capacity": capacity[(a, b)]}) for a, b in links)
    return nx.maximum_flow_value(graph, src, dst)
