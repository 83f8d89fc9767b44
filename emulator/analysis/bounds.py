"""The best rates a fabric allows a set of flows, computed from the model.

Each flow follows the hosts' routes (NVLink inside a node, its NIC on its own plane, PXN through the same-node
GPU on the destination's plane otherwise, or every plane port of a multi-port host) and, inside a plane, is
split evenly over the equal-cost next hops (what ECMP gives in expectation and spraying gives per packet; on
leaf-spine and fat-tree planes of equal link rates the even split is also the min-max optimal one). Rates are
max-min fair (progressive filling), the classic yardstick for what a fair transport can reach. lower_bound_s
gives the completion time of a whole schedule that no transport can beat on those paths, counting the bytes
the shaper counts; on asymmetric fabrics (a degraded link, an irregular model) it solves emulator.analysis.minmax's
programme instead of trusting the even split.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from controllers.routing import Routes, shortest_path_routes
from emulator.analysis import minmax
from emulator.model import wire
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.model.topologies import BUILDERS

Link = tuple[str, str]  # directed: (from node, to node)
MAX_CUTS = 8  # post times at which an asymmetric fabric's bound solves the min-max programme


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
    return {link: fabric.rate(*link) for a, b in fabric.graph.edges for link in ((a, b), (b, a))}


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


TCP_HDR = 20 + 32  # IPv4 and TCP with timestamps, as the kernel sends a full segment


def tcp_goodput_factor(mtu: int) -> float:
    """Share of the shaped wire rate left for TCP payload (HTB counts the 14-byte Ethernet header;
    IPv4 20 bytes and TCP 32 with timestamps)."""
    return (mtu - TCP_HDR) / (mtu + wire.ETH)


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


def tcp_wire_bytes(mtu: int, payload_bytes: int) -> tuple[int, int]:
    """wire_bytes over kernel TCP: full segments of mtu - TCP_HDR payload, each with its headers and Ethernet;
    no ACK bytes (delayed and cumulative ACKs can be far fewer than segments: leaving them out keeps the bound
    one)."""
    segments = max(1, math.ceil(payload_bytes / (mtu - TCP_HDR)))
    return payload_bytes + segments * (TCP_HDR + wire.ETH), 0


Demand = dict[tuple[str, str], float]  # (source, destination) -> bits


def _demands(fabric: Fabric, messages: list[Message], routes: Routes,
             transport: str = "rdma") -> tuple[list[Demand], dict[tuple[str, str], dict[Link, float]]]:
    """Per message: its bits from source to destination (data) and back (ACKs); and each pair's path (the
    fraction of a flow on every link it may use, flow_links)."""
    paths: dict[tuple[str, str], dict[Link, float]] = {}
    demands = []
    for msg in messages:
        data, ack = (tcp_wire_bytes(fabric.mtu, msg.bytes) if transport == "tcp" else
                     wire_bytes(fabric.mtu, msg.bytes, msg.op))
        for pair in ((msg.src, msg.dst), (msg.dst, msg.src)):
            if pair not in paths:
                paths[pair] = flow_links(fabric, *pair, routes=routes)
        demands.append({(msg.src, msg.dst): 8.0 * data, (msg.dst, msg.src): 8.0 * ack})
    return demands, paths


def _even_loads(demands: list[Demand], paths: dict[tuple[str, str], dict[Link, float]]) -> list[dict[Link, float]]:
    """The bits each message puts on every link, split as flow_links splits it."""
    loads = []
    for demand in demands:
        bits: dict[Link, float] = defaultdict(float)
        for pair, amount in demand.items():
            for link, frac in paths[pair].items():
                bits[link] += amount * frac
        loads.append(bits)
    return loads


def _dependency_order(messages: list[Message], index: dict) -> list[int]:
    """Message indices, each after its dependencies (Kahn's order, no recursion: schedules run to 10^5
    messages)."""
    dependents: list[list[int]] = [[] for _ in messages]
    for i, msg in enumerate(messages):
        for dep in msg.deps:
            if dep not in index:
                raise ValueError(f"message {msg.id} depends on unknown message {dep}")
            dependents[index[dep]].append(i)
    unmet = [len(msg.deps) for msg in messages]
    todo = [i for i, n in enumerate(unmet) if n == 0]
    order = []
    while todo:
        i = todo.pop()
        order.append(i)
        for j in dependents[i]:
            unmet[j] -= 1
            if unmet[j] == 0:
                todo.append(j)
    if len(order) != len(messages):
        raise ValueError("the dependencies form a cycle")
    return order


def _earliest_posts(messages: list[Message], alone: list[float], certain: list[dict[Link, float]],
                    capacity: dict[Link, float]) -> list[float]:
    """The earliest time each message can be posted: its start time, every dependency finished at the
    earliest (a dependency takes at least its alone time after its own earliest post), and its dependencies
    finished together: their bits on a link each of them must cross (`certain`) need that link's time after
    they are posted (an expert GPU's combine waits for all the dispatch its NIC brings in)."""
    index = {msg.id: i for i, msg in enumerate(messages)}
    if len(index) != len(messages):
        raise ValueError("message ids are not unique")
    post = [msg.start_s for msg in messages]
    together: dict[tuple, float] = {}  # a set of dependencies -> when they can all have finished
    for i in _dependency_order(messages, index):
        deps = messages[i].deps
        if deps:
            post[i] = max(post[i], *(post[index[d]] + alone[index[d]] for d in deps))
        if len(deps) > 1:
            post[i] = max(post[i], _finished_together(deps, index, post, certain, capacity, together))
    return post


def _finished_together(deps: Iterable, index: dict, post: list[float], certain: list[dict[Link, float]],
                       capacity: dict[Link, float], memo: dict[tuple, float]) -> float:
    """When `deps` can all have finished: for every post time t among them, t + the busiest link's share of the
    bits that the deps posted at t or later must cross there (none of those bits crosses before t). The first
    post alone would credit an expert's combine with NVLink time that overlaps the dispatch it must wait for.
    Latest posts first, so each dependency's bits are added once."""
    key = tuple(deps)
    if key not in memo:
        bits: dict[Link, float] = defaultdict(float)
        busiest = done = 0.0
        order = sorted((post[index[dep]], index[dep]) for dep in key)
        for k in range(len(order) - 1, -1, -1):
            t, i = order[k]
            for link, b in certain[i].items():
                bits[link] += b
                busiest = max(busiest, bits[link] / capacity[link])
            if k == 0 or order[k - 1][0] != t:
                done = max(done, t + busiest)
        memo[key] = done
    return memo[key]


def _load_bounds(post: list[float], loads: list[dict[Link, float]], capacity: dict[Link, float]) -> dict[float, float]:
    """Per post time t: t + the busiest link's load from messages not posted before t, at its rate: those bits
    cannot cross before t. Latest posts first, so each message's load is added once."""
    total: dict[Link, float] = defaultdict(float)
    busiest = 0.0
    bounds = {}
    order = sorted(range(len(post)), key=post.__getitem__, reverse=True)
    for k, i in enumerate(order):
        for link, bits in loads[i].items():
            total[link] += bits
            busiest = max(busiest, total[link] / capacity[link])
        if k + 1 == len(order) or post[order[k + 1]] != post[i]:  # every message posted at >= post[i] is in
            bounds[post[i]] = post[i] + busiest
    return bounds


def _exact_load_bound(post: list[float], demands: list[Demand], paths: dict[tuple[str, str], dict[Link, float]],
                      capacity: dict[Link, float], cuts: Iterable[float]) -> float:
    """max over the post times `cuts` of t + the min-max time of the messages not posted before t."""
    bound = 0.0
    for t in cuts:
        later: Demand = defaultdict(float)
        for p, demand in zip(post, demands, strict=True):
            if p >= t:
                for pair, bits in demand.items():
                    later[pair] += bits
        bound = max(bound, t + minmax.min_max_s(later, {pair: paths[pair].keys() for pair in later}, capacity))
    return bound


def even_split_is_optimal(fabric: Fabric) -> bool:
    """Whether splitting evenly over equal-cost next hops minimises the most loaded link: on the builders'
    regular topologies with one fabric-link rate per plane and no link degraded."""
    if fabric.is_degraded() or fabric.topo not in BUILDERS:
        return False
    rates: dict[int, set[float]] = defaultdict(set)
    for _, _, d in fabric.graph.edges(data=True):
        if d["kind"] == "fabric":
            rates[d["plane"]].add(d["bps"])
    return all(len(r) == 1 for r in rates.values())


def lower_bound_s(fabric: Fabric, messages: Iterable[Message], routes: Routes | None = None,
                  exact: bool | None = None, transport: str = "rdma") -> float:
    """Seconds from the trace start before which no transport can complete `messages` on this fabric.

    Traffic is counted as the shaper counts it (wire_bytes; tcp_wire_bytes with `transport` tcp, whose headers
    are smaller than RoCE's) and may use the links the routing allows. The
    bound is the larger of two that hold for any transport: a dependency chain takes at least the sum of its
    messages' alone times (ring all-reduce steps add up) and a message waiting for several waits for their
    bits to cross the links each must use (MoE's combine after its dispatch); and the bits of messages that
    cannot be posted before t need the fabric's least min-max time after t. Where the even split is optimal
    (even_split_is_optimal) that is the busiest link's load under it, at every post time; elsewhere (`exact`,
    by default on asymmetric fabrics) a min-max flow programme at the MAX_CUTS post times where the even split
    would bind hardest and the first, with alone times from each pair's maximum flow.
    """
    messages = list(messages)
    if not messages:
        return 0.0
    return _lower_bound(fabric, messages, _Traffic(fabric, messages, routes, transport), exact)


class _Traffic:
    """What both estimates read from a schedule: its links' rates, each message's bits per pair, each pair's path
    and each message's bits per link under the even split (worked out once: 16 k pairs on 128 GPUs)."""

    def __init__(self, fabric: Fabric, messages: list[Message], routes: Routes | None, transport: str) -> None:
        self.capacity = _capacities(fabric)
        routes = routes if routes is not None else shortest_path_routes(fabric)
        self.demands, self.paths = _demands(fabric, messages, routes, transport)
        self.loads = _even_loads(self.demands, self.paths)


def _lower_bound(fabric: Fabric, messages: list[Message], t: _Traffic, exact: bool | None) -> float:
    exact = not even_split_is_optimal(fabric) if exact is None else exact
    capacity, demands, paths = t.capacity, t.demands, t.paths
    per_bit: dict[tuple[str, str], float] = {}  # seconds per bit of a pair's data alone
    for pair, path in paths.items():
        per_bit[pair] = (1 / minmax.max_flow_bps(*pair, path, capacity) if exact
                         else max(frac / capacity[link] for link, frac in path.items()))
    alone = [demand[(m.src, m.dst)] * per_bit[(m.src, m.dst)] for m, demand in zip(messages, demands, strict=True)]
    certain = [{link: demand[(m.src, m.dst)] for link, frac in paths[(m.src, m.dst)].items() if frac >= 1.0}
               for m, demand in zip(messages, demands, strict=True)]
    post = _earliest_posts(messages, alone, certain, capacity)
    chain = max(p + a for p, a in zip(post, alone, strict=True))
    even = _load_bounds(post, t.loads, capacity)
    if not exact:
        return max(chain, *even.values())
    cuts = sorted(even, key=even.__getitem__, reverse=True)[:MAX_CUTS] + [min(post)]
    return max(chain, _exact_load_bound(post, demands, paths, capacity, set(cuts)))


def in_sequence_s(fabric: Fabric, messages: Iterable[Message], routes: Routes | None = None,
                  transport: str = "rdma") -> float:
    """How long a transport that shares every link fairly takes, as an estimate (not a bound): the messages of
    each dependency depth after those of the one before, each depth at its busiest link's load under the even
    split, and at least lower_bound_s. MoE's dispatch, dispatch-nvlink, combine-nvlink and combine are its four
    depths (a relay may combine while another still receives its dispatch, which the bound credits and no fair
    transport makes: measured, 1.05x this and 1.20x the bound on the paper's 64 GPUs); an all-to-all has one
    depth and a ring all-reduce one per step, where this is the bound."""
    messages = list(messages)
    if not messages:
        return 0.0
    t = _Traffic(fabric, messages, routes, transport)
    index = {m.id: i for i, m in enumerate(messages)}
    depth = [0] * len(messages)
    for i in _dependency_order(messages, index):
        depth[i] = max((depth[index[d]] + 1 for d in messages[i].deps), default=0)
    levels: dict[int, dict[Link, float]] = defaultdict(lambda: defaultdict(float))
    for i, load in enumerate(t.loads):
        for link, bits in load.items():
            levels[depth[i]][link] += bits
    serial = sum(max(bits / t.capacity[link] for link, bits in level.items()) for level in levels.values())
    return max(serial, _lower_bound(fabric, messages, t, None))
