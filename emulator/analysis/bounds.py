"""The best rates a fabric allows a set of flows, computed from the model.

Each flow follows the hosts' routes (NVLink inside a node, its NIC on its own plane, PXN through the same-node
GPU on the destination's plane otherwise, or every plane port of a multi-port host) and, inside a plane, is
split evenly over the equal-cost next hops (what ECMP gives in expectation and spraying gives per packet; on
leaf-spine and fat-tree planes of equal link rates the even split is also the min-max optimal one). Rates are
max-min fair (progressive filling), the classic yardstick for what a fair transport can reach. lower_bound_s
gives the completion time of a whole schedule that no transport can beat on those paths, counting the bytes
the shaper counts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from controllers.routing import Routes, shortest_path_routes
from emulator.model import wire
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message

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
    common = sorted(fabric.nic_planes(src) & fabric.nic_planes(dst))
    if len(common) > 1:  # multi-port hosts: a sprayed queue pair is split evenly over the planes
        for plane in common:
            leaf = fabric.nic_on_plane(src, plane)
            out[(src, leaf)] += 1.0 / len(common)
            _fabric_split(fabric, routes, leaf, fabric.nic_ip(dst, plane), dst, 1.0 / len(common), out)
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


def _capacities(fabric: Fabric) -> dict[Link, float]:
    """The rate (bit/s) of every directed link: each direction of a link is shaped on its own."""
    capacity = {}
    for a, b, d in fabric.graph.edges(data=True):
        capacity[(a, b)] = capacity[(b, a)] = d["bps"]
    return capacity


def max_min_rates(fabric: Fabric, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Max-min fair rate (bit/s on the wire) of every flow, by progressive filling over fractional paths."""
    routes = shortest_path_routes(fabric)
    usage = {pair: flow_links(fabric, *pair, routes=routes) for pair in pairs}
    capacity = _capacities(fabric)
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


IP_HDR = wire.IP_UDP - wire.UDP_HDR.size  # the IPv4 header the kernel writes on the raw socket (no options)
DATA_HDR = wire.OVERHEAD - wire.RETH_HDR.size + wire.ETH  # counted per data packet: IP .. ICRC, plus Ethernet
ACK_WIRE = IP_HDR + wire.ACK_LEN + wire.ETH  # one ACK as the shaper counts it


def wire_bytes(mtu: int, payload_bytes: int, op: str = "write") -> tuple[int, int]:
    """Bytes the shapers count for one message: its data packets, and the ACKs the receiver answers them with.

    The transport cuts a message into payload_per_packet(mtu) pieces (one packet even for no payload), only the
    first packet of a WRITE carries the RETH, and the receiver acknowledges every data packet. Retransmissions
    and CNPs are left out: a transport that needs none is possible.
    """
    packets = max(1, math.ceil(payload_bytes / wire.payload_per_packet(mtu)))
    reth = wire.RETH_HDR.size if op == "write" else 0
    return payload_bytes + packets * DATA_HDR + reth, packets * ACK_WIRE


def _demands(fabric: Fabric, messages: list[Message], routes: Routes,
             capacity: dict[Link, float]) -> tuple[list[dict[Link, float]], list[float]]:
    """Per message: the bits it puts on every directed link (data forward, ACKs back) and the least time its
    data needs alone (the most loaded link of its path, at that link's rate)."""
    paths: dict[tuple[str, str], dict[Link, float]] = {}

    def path(src: str, dst: str) -> dict[Link, float]:
        if (src, dst) not in paths:
            paths[(src, dst)] = flow_links(fabric, src, dst, routes=routes)
        return paths[(src, dst)]

    loads, alone = [], []
    for msg in messages:
        data, ack = wire_bytes(fabric.mtu, msg.bytes, msg.op)
        bits: dict[Link, float] = defaultdict(float)
        for link, frac in path(msg.src, msg.dst).items():
            bits[link] += 8 * data * frac
        alone.append(max(b / capacity[link] for link, b in bits.items()))
        for link, frac in path(msg.dst, msg.src).items():
            bits[link] += 8 * ack * frac
        loads.append(bits)
    return loads, alone


def _earliest_posts(messages: list[Message], alone: list[float]) -> list[float]:
    """The earliest time each message can be posted: its start time, and every dependency finished at the
    earliest (a dependency takes at least its alone time after its own earliest post). Kahn's order, no
    recursion: schedules run to 10^5 messages."""
    index = {msg.id: i for i, msg in enumerate(messages)}
    if len(index) != len(messages):
        raise ValueError("message ids are not unique")
    dependents: list[list[int]] = [[] for _ in messages]
    for i, msg in enumerate(messages):
        for dep in msg.deps:
            if dep not in index:
                raise ValueError(f"message {msg.id} depends on unknown message {dep}")
            dependents[index[dep]].append(i)
    unmet = [len(msg.deps) for msg in messages]
    post = [msg.start_s for msg in messages]
    todo = [i for i, n in enumerate(unmet) if n == 0]
    done = 0
    while todo:
        i = todo.pop()
        done += 1
        finish = post[i] + alone[i]
        for j in dependents[i]:
            post[j] = max(post[j], finish)
            unmet[j] -= 1
            if unmet[j] == 0:
                todo.append(j)
    if done != len(messages):
        raise ValueError("the dependencies form a cycle")
    return post


def _load_bound(post: list[float], loads: list[dict[Link, float]], capacity: dict[Link, float]) -> float:
    """max over t of t + the busiest link's load from messages not posted before t, at its rate: those bits
    cannot cross before t. Latest posts first, so each message's load is added once."""
    total: dict[Link, float] = defaultdict(float)
    busiest = bound = 0.0
    order = sorted(range(len(post)), key=post.__getitem__, reverse=True)
    for k, i in enumerate(order):
        for link, bits in loads[i].items():
            total[link] += bits
            busiest = max(busiest, total[link] / capacity[link])
        if k + 1 == len(order) or post[order[k + 1]] != post[i]:  # every message posted at >= post[i] is in
            bound = max(bound, post[i] + busiest)
    return bound


def lower_bound_s(fabric: Fabric, messages: Iterable[Message], routes: Routes | None = None) -> float:
    """Seconds from the trace start before which no transport can complete `messages` on this fabric.

    Traffic is split over the paths the routing may use as flow_links splits it (evenly over equal-cost next
    hops, which minimises the most loaded link on leaf-spine and fat-tree planes with equal link rates), and
    counted as the shaper counts it (wire_bytes). The bound is the larger of two that hold for any transport:
    a dependency chain takes at least the sum of its messages' alone times (ring all-reduce steps add up), and
    the bits of messages that cannot be posted before t need their busiest link after t.
    """
    messages = list(messages)
    if not messages:
        return 0.0
    routes = routes if routes is not None else shortest_path_routes(fabric)
    capacity = _capacities(fabric)
    loads, alone = _demands(fabric, messages, routes, capacity)
    post = _earliest_posts(messages, alone)
    chain = max(p + a for p, a in zip(post, alone, strict=True))
    return max(chain, _load_bound(post, loads, capacity))
