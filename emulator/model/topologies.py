"""Topology builders: ft2, ft3, mrft and mpft, all producing the same typed fabric graph.

Each builder validates its parameters (a UserError names the bad one) and returns a Fabric. Rates are in
Mbit/s at this interface and bit/s in the model. The defaults are the scaled-down fabric every command uses
when given no topology: a 2-plane MPFT, 16 nodes x 2 GPUs, per plane 4 leaves x 4 GPUs and 4 spines.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import networkx as nx

from emulator.model import naming
from emulator.model.errors import UserError
from emulator.model.fabric import DEFAULT_ECN_PMAX, Fabric

DEFAULT_TOPO = "mpft"
NVLINK_FACTOR = 4.0    # scale-up : scale-out bandwidth is about 4 : 1 in the paper
QUEUEING = ("fifo", "class", "voq")  # one shared queue, one per traffic class, one per queue-pair bucket
LOSSLESS_FRAMES_BELOW_XOFF = 4  # a lossless queue sized by build(): frames of backlog before its port pauses
# Mbit/s: the link rates link_mbps = "auto" chooses among (emulator.run.autorate), lowest first
AUTO_RATES = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100)


@dataclass(frozen=True)
class LinkOptions:
    """Link settings every builder takes (as keyword arguments).

    The defaults keep the default fabric's all-to-all inside what one ovs-vswitchd thread forwards here: it
    pays per packet, not per byte (emulator/README.md, "Fidelity"), so the MTU is a jumbo 9000 and NICs run at
    10 Mbit/s.
    """

    link_mbps: float = 10.0            # NIC and switch-switch links
    nvlink_mbps: float | None = None   # default: NVLINK_FACTOR x link_mbps
    mtu: int = 9000
    queue_kb: float = 128.0            # egress queue limit per port
    delay_ms: float = 0.0              # one-way delay per link (netem; not on module-less kernels)
    loss_pct: float = 0.0              # random loss per link (netem)
    ecn: bool = False                  # switches mark ECN: RED, or the eBPF marker (emulator.net.marking)
    ecn_kmin_kb: float = 0.0           # marking starts at this backlog (0: a quarter of the queue)
    ecn_kmax_kb: float = 0.0           # and is certain from this one (0: half the queue; = kmin: DCTCP's K)
    ecn_pmax: float = DEFAULT_ECN_PMAX # the marking probability just below kmax
    queueing: str = "fifo"             # switch egress queues: fifo, class (per traffic class), voq (per QP bucket)
    lossless: bool = False             # ports pause their feeders instead of dropping (emulator.net.pause)
    pfc_reaction_us: float = 2000.0    # the time a pause may take to hold a feeder, which the headroom allows for

    def check(self) -> LinkOptions:
        _check_range("link_mbps", self.link_mbps, 0.01, 100_000)
        nvlink = NVLINK_FACTOR * self.link_mbps if self.nvlink_mbps is None else self.nvlink_mbps
        _check_range("nvlink_mbps", nvlink, 0.01, 400_000)
        _check_range("mtu", self.mtu, 576, 9000)
        _check_range("queue_kb", self.queue_kb, 2 * self.mtu / 1024, 1024 * 1024)
        _check_range("delay_ms", self.delay_ms, 0, 10_000)
        _check_range("loss_pct", self.loss_pct, 0, 100)
        if not isinstance(self.ecn, bool):
            raise UserError(f"must be true or false, got {self.ecn!r}", field="ecn")
        kmin, kmax = self._ecn_kb()
        _check_range("ecn_kmin_kb", kmin, 0, self.queue_kb)
        _check_range("ecn_kmax_kb", kmax, kmin, self.queue_kb)
        _check_range("ecn_pmax", self.ecn_pmax, 0, 1)
        if self.queueing not in QUEUEING:
            raise UserError(f"must be one of {', '.join(QUEUEING)}, got {self.queueing!r}", field="queueing")
        if not isinstance(self.lossless, bool):
            raise UserError(f"must be true or false, got {self.lossless!r}", field="lossless")
        _check_range("pfc_reaction_us", self.pfc_reaction_us, 0, 1_000_000)
        if self.lossless and self.queueing == "voq":
            raise UserError("lossless links pause a port's FIFO or one traffic class of it (PFC's priorities), "
                            "not a virtual output queue", field="queueing")
        if self.lossless and (self.delay_ms or self.loss_pct):
            raise UserError("lossless links hold packets in a TBF gate, which cannot sit under netem's delay or "
                            "loss", field="lossless")
        return replace(self, nvlink_mbps=nvlink)

    def _ecn_kb(self) -> tuple[float, float]:
        """ECN's kmin and kmax in KiB, the defaults (a quarter and a half of the queue) filled in."""
        kmin = self.ecn_kmin_kb or self.queue_kb / 4
        return kmin, self.ecn_kmax_kb or max(kmin, self.queue_kb / 2)

    def ecn_thresholds(self) -> list:
        """[kmin bytes, kmax bytes, pmax], as Fabric.ecn_thresholds reads them."""
        kmin, kmax = self._ecn_kb()
        return [int(kmin * 1024), int(kmax * 1024), float(self.ecn_pmax)]


LINK_PARAMS = [f.name for f in fields(LinkOptions)]


class _Builder:
    """Adds typed nodes and links, numbering ports in the order links are made."""

    def __init__(self, topo: str, params: dict[str, Any], link: dict[str, Any]) -> None:
        unknown = sorted(set(link) - set(LINK_PARAMS))
        if unknown:
            raise UserError(f"topology {topo} has no parameter {unknown[0]!r}", field=unknown[0])
        opts = LinkOptions(**link).check()
        self.link_bps = opts.link_mbps * 1e6
        self.nvlink_bps = opts.nvlink_mbps * 1e6
        self.g = nx.Graph(topo=topo, params=params, mtu=int(opts.mtu), queue_bytes=int(opts.queue_kb * 1024),
                          delay_ms=float(opts.delay_ms), loss_pct=float(opts.loss_pct), ecn=opts.ecn,
                          ecn_thresholds=opts.ecn_thresholds(),
                          queueing=opts.queueing, lossless=opts.lossless,
                          pfc_reaction_us=float(opts.pfc_reaction_us), storage_plane=None)
        self._next_port: dict[str, int] = {}

    def switch(self, role: str, plane: int, index: int, storage: bool = False) -> str:
        name = naming.switch_name(role, plane, index, storage)
        self.g.add_node(name, kind="switch", role=role, plane=plane, index=index,
                        dpid=naming.dpid(role, plane, index))
        self._next_port[name] = 1  # OpenFlow ports start at 1
        return name

    def host(self, name: str, role: str, plane: int, index: int, node: int | None = None,
             gpu: int | None = None) -> str:
        self.g.add_node(name, kind="host", role=role, plane=plane, index=index, node=node, gpu=gpu,
                        ip=naming.fabric_ip(plane, index), ports={})
        self.g.nodes[name]["mac"] = naming.mac_for_ip(self.g.nodes[name]["ip"])
        self._next_port[name] = 0  # hosts start at eth0
        return name

    def nvlink_domain(self, node: int) -> str:
        name = naming.nvlink_name(node)
        self.g.add_node(name, kind="nvlink", role="nvlink", plane=None, node=node, index=node)
        self._next_port[name] = 1
        return name

    def _take_port(self, node: str) -> int:
        port = self._next_port[node]
        self._next_port[node] = port + 1
        naming.intf_name(node, port)  # refuses names over Linux's limit
        return port

    def connect(self, a: str, b: str, plane: int) -> None:
        """A switch-switch link."""
        self.g.add_edge(a, b, kind="fabric", plane=plane, bps=self.link_bps,
                        ports={a: self._take_port(a), b: self._take_port(b)})

    def attach(self, host: str, leaf: str, plane: int, bps: float | None = None) -> None:
        """A host NIC (port) on `plane`, at the link rate unless `bps` says otherwise; the host's index gives
        its address there."""
        hport, lport = self._take_port(host), self._take_port(leaf)
        ip = naming.fabric_ip(plane, self.g.nodes[host]["index"])
        self.g.nodes[host]["ports"][hport] = {"ip": ip, "mac": naming.mac_for_ip(ip), "plane": plane}
        self.g.add_edge(host, leaf, kind="host", plane=plane, bps=bps or self.link_bps,
                        ports={host: hport, leaf: lport})

    def join_nvlink(self, host: str, domain: str) -> None:
        data = self.g.nodes[host]
        hport, dport = self._take_port(host), self._take_port(domain)
        ip = naming.nvlink_ip(data["node"], data["gpu"])
        data["ports"][hport] = {"ip": ip, "mac": naming.mac_for_ip(ip), "plane": None}
        self.g.add_edge(host, domain, kind="nvlink", plane=None, bps=self.nvlink_bps,
                        ports={host: hport, domain: dport})

    def two_tier(self, plane: int, leaves: int, spines: int, hosts_of_leaf: Callable[[int], list[str]],
                 storage: bool = False, host_bps: float | None = None) -> None:
        """A leaf-spine plane: every leaf links to every spine once; hosts first, so leaf ports 1..h face down."""
        leaf_names = [self.switch("leaf", plane, i, storage) for i in range(leaves)]
        spine_names = [self.switch("spine", plane, j, storage) for j in range(spines)]
        for i, leaf in enumerate(leaf_names):
            for host in hosts_of_leaf(i):
                self.attach(host, leaf, plane, host_bps)
        for leaf in leaf_names:
            for spine in spine_names:
                self.connect(leaf, spine, plane)

    def fabric(self) -> Fabric:
        return Fabric(self.g)


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise UserError(f"must be a whole number from {low} to {high}, got {value!r}", field=name)
    return value


def _check_range(name: str, value: Any, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise UserError(f"must be a number from {low:g} to {high:g}, got {value!r}", field=name)


def _divide(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise UserError(f"{total} does not divide evenly over {parts} {what}", field=what)
    return total // parts


def _radix(k: Any) -> int:
    k = _check_int("k", k, 2, 256)
    if k % 2:
        raise UserError(f"radix must be even, got {k}", field="k")
    return k


def ft2(k: int | None = None, leaves: int = 4, spines: int = 4, hosts_per_leaf: int = 4,
        **link: Any) -> Fabric:
    """Two-tier fat-tree (leaf-spine). Radix k gives k leaves, k/2 spines, k/2 hosts per leaf (k^2/2 hosts);
    explicit counts allow oversubscription (hosts_per_leaf > spines)."""
    if k is not None:
        k = _radix(k)
        leaves, spines, hosts_per_leaf = k, k // 2, k // 2
    leaves = _check_int("leaves", leaves, 1, 4096)
    spines = _check_int("spines", spines, 1, 4096)
    hosts_per_leaf = _check_int("hosts_per_leaf", hosts_per_leaf, 1, 4096)
    params = {"k": k, "leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf}
    b = _Builder("ft2", params, link)
    b.two_tier(0, leaves, spines, lambda i: [
        b.host(naming.plain_host_name(h), "host", 0, h)
        for h in range(i * hosts_per_leaf, (i + 1) * hosts_per_leaf)])
    return b.fabric()


def ft3(k: int = 4, **link: Any) -> Fabric:
    """k-ary three-tier fat-tree: k pods of k/2 leaves and k/2 spines (aggregation), (k/2)^2 cores,
    k^3/4 hosts, 5k^2/4 switches, k^3/2 switch-switch links."""
    k = _radix(k)
    half = k // 2
    b = _Builder("ft3", {"k": k}, link)
    cores = [b.switch("core", 0, c) for c in range(half * half)]
    for pod in range(k):
        leaves = [b.switch("leaf", 0, pod * half + i) for i in range(half)]
        aggs = [b.switch("spine", 0, pod * half + j) for j in range(half)]
        for i, leaf in enumerate(leaves):
            for h in range(half):
                index = (pod * half + i) * half + h
                b.attach(b.host(naming.plain_host_name(index), "host", 0, index), leaf, 0)
        for leaf in leaves:
            for agg in aggs:
                b.connect(leaf, agg, 0)
        for j, agg in enumerate(aggs):
            for c in range(half):
                b.connect(agg, cores[j * half + c], 0)
    return b.fabric()


def _gpu_nodes(b: _Builder, nodes: int, gpus: int, plane_of: Callable[[int], int],
               index_of: Callable[[int, int], int]) -> list[list[str]]:
    """GPU hosts and the NVLink domain of every node; returns host names by [node][gpu]."""
    table = []
    for n in range(nodes):
        b.nvlink_domain(n)
        table.append([b.host(naming.gpu_name(n, g), "gpu", plane_of(g), index_of(n, g), node=n, gpu=g)
                      for g in range(gpus)])
    return table


def _join_nvlink(b: _Builder, table: list[list[str]]) -> None:
    """Called after the planes are wired, so every GPU's eth0 is its NIC and eth1 its NVLink port."""
    for n, row in enumerate(table):
        for host in row:
            b.join_nvlink(host, naming.nvlink_name(n))


def mrft(gpus: int = 2, nodes: int = 16, leaves_per_rail: int = 4, spines: int = 4,
         **link: Any) -> Fabric:
    """Multi-rail fat-tree: one two-tier fabric whose leaves are grouped by rail; GPU i of every node sits on
    a rail-i leaf, all leaves share the spines, so cross-rail traffic may cross the fabric."""
    gpus = _check_int("gpus", gpus, 1, naming.MAX_GPUS_PER_NODE)
    nodes = _check_int("nodes", nodes, 1, naming.MAX_NODES)
    leaves_per_rail = _check_int("leaves_per_rail", leaves_per_rail, 1, 4096)
    spines = _check_int("spines", spines, 1, 4096)
    per_leaf = _divide(nodes, leaves_per_rail, "leaves_per_rail")
    params = {"gpus": gpus, "nodes": nodes, "leaves_per_rail": leaves_per_rail, "spines": spines}
    b = _Builder("mrft", params, link)
    table = _gpu_nodes(b, nodes, gpus, lambda g: 0, lambda n, g: n * gpus + g)

    def hosts_of_leaf(i: int) -> list[str]:
        rail, j = divmod(i, leaves_per_rail)
        return [table[n][rail] for n in range(j * per_leaf, (j + 1) * per_leaf)]

    b.two_tier(0, gpus * leaves_per_rail, spines, hosts_of_leaf)
    _join_nvlink(b, table)
    return b.fabric()


def mpft(planes: int = 2, nodes: int = 16, leaves: int = 4, spines: int = 4, k: int | None = None,
         storage: bool = False, storage_servers: int = 4, storage_leaves: int = 2, storage_spines: int = 2,
         multiport: bool = False, **link: Any) -> Fabric:
    """Multi-plane fat-tree: P isolated two-tier planes; GPU i of every node attaches only to plane i and the
    GPUs of a node share an NVLink domain. Radix k gives each plane k leaves, k/2 spines and k^2/2 nodes.
    With storage=True each node gets a storage NIC (host `n<N>sc`) on a separate storage plane shared with
    `storage_servers` servers.

    multiport=True builds the paper's ideal variant (its Fig. 4): every GPU's NIC has a port on every plane, at
    1/P of the link rate, so a GPU has the same NIC bandwidth and each leaf the same down- and uplink capacity
    as in the one-port MPFT, and one queue pair can spray across planes without crossing NVLink (PXN)."""
    planes = _check_int("planes", planes, 1, naming.MAX_PLANES - 1)
    if k is not None:
        k = _radix(k)
        leaves, spines, nodes = k, k // 2, k * k // 2
    nodes = _check_int("nodes", nodes, 1, naming.MAX_NODES)
    leaves = _check_int("leaves", leaves, 1, 4096)
    spines = _check_int("spines", spines, 1, 4096)
    per_leaf = _divide(nodes, leaves, "leaves")
    for name, flag in (("storage", storage), ("multiport", multiport)):
        if not isinstance(flag, bool):
            raise UserError(f"must be true or false, got {flag!r}", field=name)
    params = {"planes": planes, "nodes": nodes, "leaves": leaves, "spines": spines, "k": k,
              "storage": storage, "multiport": multiport}
    b = _Builder("mpft", params, link)
    if multiport:  # every GPU on every plane: addresses must be unique per plane, so index by (node, GPU)
        table = _gpu_nodes(b, nodes, planes, lambda g: g, lambda n, g: n * planes + g)
        for p in range(planes):
            b.two_tier(p, leaves, spines,
                       lambda i: [h for n in range(i * per_leaf, (i + 1) * per_leaf) for h in table[n]],
                       host_bps=b.link_bps / planes)
    else:
        table = _gpu_nodes(b, nodes, planes, lambda g: g, lambda n, g: n)
        for p in range(planes):
            b.two_tier(p, leaves, spines,
                       lambda i, p=p: [table[n][p] for n in range(i * per_leaf, (i + 1) * per_leaf)])
    if storage:
        _storage_plane(b, planes, nodes, storage_servers, storage_leaves, storage_spines)
        params.update(storage_servers=storage_servers, storage_leaves=storage_leaves,
                      storage_spines=storage_spines)
    _join_nvlink(b, table)
    return b.fabric()


def _storage_plane(b: _Builder, plane: int, nodes: int, servers: Any, leaves: Any, spines: Any) -> None:
    """One storage NIC per node plus the storage servers, spread in blocks over a leaf-spine fabric."""
    servers = _check_int("storage_servers", servers, 1, 4096)
    leaves = _check_int("storage_leaves", leaves, 1, 4096)
    spines = _check_int("storage_spines", spines, 1, 4096)
    endpoints = [b.host(naming.storage_client_name(n), "storage_client", plane, n, node=n)
                 for n in range(nodes)]
    endpoints += [b.host(naming.storage_server_name(s), "storage_server", plane, nodes + s)
                  for s in range(servers)]
    per_leaf = math.ceil(len(endpoints) / leaves)
    b.g.graph["storage_plane"] = plane
    b.two_tier(plane, leaves, spines, lambda i: endpoints[i * per_leaf:(i + 1) * per_leaf], storage=True)


BUILDERS: dict[str, Callable[..., Fabric]] = {"ft2": ft2, "ft3": ft3, "mrft": mrft, "mpft": mpft}


def parameters(topo: str) -> list[str]:
    """Names of the parameters a builder takes: its own and the link options."""
    own = [n for n, p in inspect.signature(BUILDERS[topo]).parameters.items() if p.kind != p.VAR_KEYWORD]
    return own + LINK_PARAMS


def build(topo: str = DEFAULT_TOPO, **params: Any) -> Fabric:
    """Build a fabric by name; unknown topologies and parameters are user errors. A lossless fabric whose queue
    the user left to it gets queues deep enough for its busiest port: that port's headroom plus
    LOSSLESS_FRAMES_BELOW_XOFF frames, where the default queue is not (Fabric.queue_sized says so)."""
    if topo not in BUILDERS:
        raise UserError(f"unknown topology {topo!r} (choose from {', '.join(BUILDERS)})", field="topo")
    allowed = parameters(topo)
    for key in params:
        if key not in allowed:
            raise UserError(f"topology {topo} has no parameter {key!r} (it takes {', '.join(allowed)})",
                            field=key)
    fabric = BUILDERS[topo](**params)
    if fabric.lossless and "queue_kb" not in params:
        headroom, switch, peer = fabric.largest_headroom()
        need = headroom + LOSSLESS_FRAMES_BELOW_XOFF * (fabric.mtu + 14)
        if need > fabric.queue_bytes:
            queue_kb = math.ceil(need / 1024)
            fabric = BUILDERS[topo](**params, queue_kb=queue_kb)
            fabric.graph.graph["queue_sized"] = {"queue_kb": queue_kb, "headroom_kb": headroom / 1024,
                                                 "port": f"{switch} to {peer}",
                                                 "feeders": len(fabric.feeders(switch, peer)),
                                                 "frames": LOSSLESS_FRAMES_BELOW_XOFF}
    return fabric
