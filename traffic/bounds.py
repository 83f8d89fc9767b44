"""The best rates a fabric allows a set of flows, computed from the model.

Each flow follows the hosts' routes (NVLink inside a node, its NIC on its own plane, PXN through the same-node
GPU on the destination's plane otherwise) and, inside a plane, is split evenly over the equal-cost next hops
(what ECMP gives in expectation and spraying gives per packet). Rates are max-min fair (progressive
filling), the classic yardstick for what a fair transport can reach.
"""

from __future__ import annotations

from collections import defaultdict

from controllers.routing import Routes, shortest_path_routes
from emulator.model import Fabric

Link = tuple[str, str]  # directed: (from node, to node)


def _fabric_split(fabric: Fabric, routes: Routes, leaf: str, dst_ip: str, dst: str,
                  share: float, out: dict[Link, float]) -> None:
    """Spread `share` of a flow from `leaf` towards `dst` over equal-cost next hops, hop by hop."""
    frontier = {leaf: share}
    while frontier:
        nxt: dict[str, float] = defaultdict(float)
        for switch, amount in frontier.items():
            ports = routes[switch][dst_ip]
            for port in ports:
                peer = fabric.peer(switch, port)
                out[(switch, peer)] += amount / len(ports)
                if peer != dst:
                    nxt[peer] += amount / len(ports)
        frontier = nxt


def flow_links(fabric: Fabric, src: str, dst: str, routes: Routes | None = None) -> dict[Link, float]:
    """Fraction of a src->dst flow on every directed link it may use."""
    routes = routes if routes is not None else shortest_path_routes(fabric)
    out: dict[Link, float] = defaultdict(float)
    domain = fabric.nvlink_peer(src)
    if domain is not None and domain == fabric.nvlink_peer(dst):
        out[(src, domain)] += 1.0
        out[(domain, dst)] += 1.0
        return dict(out)
    dst_ip = fabric.ip(dst)
    dst_plane = fabric.node(dst)["plane"]
    sender = src
    if dst_plane not in fabric.nic_planes(src):
        if domain is None:
            raise ValueError(f"{src} has no path to plane {dst_plane}")
        sender = next(g for g in fabric.node_gpus(domain) if fabric.node(g)["plane"] == dst_plane)
        out[(src, domain)] += 1.0
        out[(domain, sender)] += 1.0
    leaf = fabric.nic_on_plane(sender, dst_plane)
    out[(sender, leaf)] += 1.0
    if leaf in routes and dst_ip in routes[leaf]:
        _fabric_split(fabric, routes, leaf, dst_ip, dst, 1.0, out)
    return dict(out)


def max_min_rates(fabric: Fabric, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Max-min fair rate (bit/s on the wire) of every flow, by progressive filling over fractional paths."""
    routes = shortest_path_routes(fabric)
    usage = {pair: flow_links(fabric, *pair, routes=routes) for pair in pairs}
    capacity = {}
    for a, b, d in fabric.graph.edges(data=True):
        capacity[(a, b)] = capacity[(b, a)] = d["bps"]
    rate = {pair: 0.0 for pair in pairs}
    active = set(pairs)
    residual = dict(capacity)
    while active:
        load: dict[Link, float] = defaultdict(float)
        for pair in active:
            for link, frac in usage[pair].items():
                load[link] += frac
        increment, bottlenecks = min(((residual[link] / w, link) for link, w in load.items() if w > 0),
                                     default=(0.0, None))
        if bottlenecks is None:
            break
        for pair in active:
            rate[pair] += increment
            for link, frac in usage[pair].items():
                residual[link] -= increment * frac
        saturated = {link for link, w in load.items() if w > 0 and residual[link] <= 1e-9 * capacity[link]}
        active = {pair for pair in active if not saturated & usage[pair].keys()}
    return rate


def tcp_goodput_factor(mtu: int) -> float:
    """Share of the shaped wire rate left for TCP payload (HTB counts the 14-byte Ethernet header;
    IPv4 20 bytes and TCP 32 with timestamps)."""
    return (mtu - 20 - 32) / (mtu + 14)
