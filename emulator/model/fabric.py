"""The fabric model: one typed networkx graph that the emulator, controllers, traffic and analysis all read.

Nodes carry `kind` ("host", "switch" or "nvlink") and position attributes; a host lists its interfaces in
`ports` (port number -> address record). Links carry `kind` ("fabric" between switches, "host" from a NIC to
a leaf, "nvlink" from a GPU to its node's NVLink domain), `plane` (None for NVLink), `bps`, `ports`
(node -> port number on that node) and, for a link running below its rate in a direction (a degraded link),
`egress_bps` (node -> bit/s of what that node sends over it). Interface names follow Mininet (`n0g1-eth0`) and
are derived, not stored.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx

from emulator.model import naming
from emulator.model.errors import UserError, load_json

FORMAT = "mpft-fabric/1"
DIRECTIONS = ("both", "a_to_b", "b_to_a")  # of a degraded link a-b: both ways, what a sends to b, or b to a
# On a lossless fabric an egress sends at most this many times its rate, one frame at a time: its gate
# (emulator.net.shaping) paces the burst HTB saved up while it was paused, as a port sends at line rate on resume
RESUME_RATE = 1.1



# ECN marking's probability just below kmax when none is given. Hardware DCQCN marks at 1 % there, but a flow
# sends tens of packets per CNP interval; here it sends a few, so a mark must be near certain by kmax for each flow
# to hear of the queue once per interval (an incast 15 -> 1 under DCQCN, kmax at 50 % of the queue, held a shorter
# queue after the start with 1 than with 0.1, by hand; benchmarks/marking.py measures the default)
DEFAULT_ECN_PMAX = 1.0


def default_ecn_thresholds(queue_bytes: int) -> tuple[int, int, float]:
    """ECN marking's kmin and kmax (bytes) and pmax when none are given: a quarter and half of the queue, and
    DEFAULT_ECN_PMAX."""
    return queue_bytes // 4, queue_bytes // 2, DEFAULT_ECN_PMAX


class Fabric:
    """Read access to a fabric graph, plus JSON round-trip. Build one with emulator.topologies."""

    def __init__(self, graph: nx.Graph) -> None:
        self.graph = graph

    # -- graph-wide settings -------------------------------------------------------------------
    @property
    def topo(self) -> str:
        return self.graph.graph["topo"]

    @property
    def params(self) -> dict[str, Any]:
        return self.graph.graph["params"]

    @property
    def mtu(self) -> int:
        return self.graph.graph["mtu"]

    @property
    def queue_bytes(self) -> int:
        return self.graph.graph["queue_bytes"]

    @property
    def delay_ms(self) -> float:
        return self.graph.graph.get("delay_ms", 0.0)

    @property
    def loss_pct(self) -> float:
        return self.graph.graph.get("loss_pct", 0.0)

    @property
    def ecn(self) -> bool:
        return self.graph.graph.get("ecn", False)

    @property
    def ecn_thresholds(self) -> tuple[int, int, float]:
        """Where switch queues start marking ECN, where they always mark (bytes), and the probability just below
        that (models saved without them: the defaults)."""
        kmin, kmax, pmax = self.graph.graph.get("ecn_thresholds") or default_ecn_thresholds(self.queue_bytes)
        return int(kmin), int(kmax), float(pmax)

    @property
    def lossless(self) -> bool:
        """Switch ports pause the ports feeding them instead of dropping (emulator.net.pause)."""
        return self.graph.graph.get("lossless", False)

    @property
    def pfc_reaction_ns(self) -> int:
        """How long a pause may take to hold its feeders, which each port's headroom allows for."""
        return int(self.graph.graph.get("pfc_reaction_us", 2000.0) * 1000)

    def feeders(self, switch: str, peer: str) -> list[tuple[str, str]]:
        """The links (from, to) whose egress feeds `switch`'s port towards `peer`: every other link into it."""
        return [(n, switch) for n in self.graph[switch] if n != peer]

    def pause_thresholds(self, switch: str, peer: str) -> tuple[int, int, int]:
        """(xoff, xon, headroom) in bytes of `switch`'s port towards `peer` on a lossless fabric. Once the port
        asks for a pause, each feeder may still deliver what it sends during the reaction time, at up to
        RESUME_RATE x its rate (a feeder resumed just before sends its HTB burst at that rate), the frame it
        was sending, and the one frame a paused gate lets through. The headroom holds all of it below the queue
        limit, with a frame more for the eBPF program's count of the queue, which may trail the qdisc's by one,
        and, queueing per class, two more: the program shares the port among its classes evenly, HTB's round
        robin two frames at a time (benchmarks/marking.py measures the difference). XON is two frames under XOFF."""
        frame = self.mtu + 14
        count = frame * (3 if self.queueing == "class" else 1)
        headroom = count + sum(2 * frame + int(RESUME_RATE * self.rate(a, b) / 8 * self.pfc_reaction_ns / 1e9)
                               for a, b in self.feeders(switch, peer))
        xoff = self.queue_bytes - headroom
        return xoff, max(0, xoff - 2 * frame), headroom

    def largest_headroom(self) -> tuple[int, str, str]:
        """(headroom in bytes, switch, peer) of the lossless port whose feeders need the most headroom."""
        return max((self.pause_thresholds(sw, peer)[2], sw, peer) for sw in self.switches() for peer in self.graph[sw])

    @property
    def queue_sized(self) -> dict[str, Any]:
        """What topologies.build sized a lossless fabric's queues for, where the user gave none ({}: not sized)."""
        return self.graph.graph.get("queue_sized", {})

    @property
    def queueing(self) -> str:
        """How switch egress ports queue: fifo, class or voq (emulator.shaping)."""
        return self.graph.graph.get("queueing", "fifo")

    # -- elements --------------------------------------------------------------------------------
    def node(self, name: str) -> dict[str, Any]:
        return self.graph.nodes[name]

    def _nodes(self, kind: str, role: str | None, plane: int | None) -> list[str]:
        return [n for n, d in self.graph.nodes(data=True)
                if d["kind"] == kind and (role is None or d["role"] == role)
                and (plane is None or d.get("plane") == plane)]

    def hosts(self, role: str | None = None, plane: int | None = None) -> list[str]:
        """Endpoints (GPUs, plain hosts, storage clients and servers), optionally filtered."""
        return self._nodes("host", role, plane)

    def gpu_hosts(self) -> list[str]:
        """Who runs jobs: the GPU hosts (n0g0, n0g1, n1g0, ...: consecutive ranks share a node, as on real
        machines), or the plain hosts of fabrics without GPUs."""
        return self.hosts("gpu") or self.hosts("host")

    def switches(self, role: str | None = None, plane: int | None = None) -> list[str]:
        """Fabric switches (leaf, spine, core); NVLink domains are not switches of the network."""
        return self._nodes("switch", role, plane)

    def nvlink_domains(self) -> list[str]:
        return self._nodes("nvlink", None, None)

    def links(self, kind: str | None = None) -> list[tuple[str, str]]:
        return [(a, b) for a, b, d in self.graph.edges(data=True) if kind is None or d["kind"] == kind]

    @cached_property
    def planes(self) -> list[int]:
        return sorted({d["plane"] for _, d in self.graph.nodes(data=True)
                       if d["kind"] == "switch"})

    def is_storage_plane(self, plane: int) -> bool:
        return plane == self.graph.graph.get("storage_plane")

    def counts(self) -> dict[str, int]:
        """Closed-form-checkable counts; `switches` excludes NVLink domains, as the paper's Table 3 does."""
        kinds = {"host": 0, "switch": 0, "nvlink": 0}
        for _, d in self.graph.nodes(data=True):
            kinds[d["kind"]] += 1
        links = {"fabric": 0, "host": 0, "nvlink": 0}
        for _, _, d in self.graph.edges(data=True):
            links[d["kind"]] += 1
        return {"hosts": kinds["host"], "switches": kinds["switch"], "fabric_links": links["fabric"],
                "host_links": links["host"], "nvlink_domains": kinds["nvlink"],
                "nvlink_links": links["nvlink"], "planes": len(self.planes)}

    # -- ports and interfaces -----------------------------------------------------------------
    def port(self, node: str, peer: str) -> int:
        """Port number on `node` of its link to `peer`."""
        return self.graph.edges[node, peer]["ports"][node]

    @cached_property
    def _peer_by_port(self) -> dict[tuple[str, int], str]:
        table = {}
        for a, b, d in self.graph.edges(data=True):
            table[a, d["ports"][a]] = b
            table[b, d["ports"][b]] = a
        return table

    def peer(self, node: str, port: int) -> str:
        return self._peer_by_port[node, port]

    def intf(self, node: str, peer: str) -> str:
        return naming.intf_name(node, self.port(node, peer))

    def link(self, a: str, b: str) -> dict[str, Any]:
        return self.graph.edges[a, b]

    def nic_links(self, host: str) -> list[tuple[str, int]]:
        """(leaf, host port) of each fabric NIC of a host."""
        return [(peer, d["ports"][host]) for peer, d in self.graph[host].items() if d["kind"] == "host"]

    def nvlink_peer(self, host: str) -> str | None:
        for peer, d in self.graph[host].items():
            if d["kind"] == "nvlink":
                return peer
        return None

    # -- addresses --------------------------------------------------------------------------------
    @cached_property
    def _host_by_ip(self) -> dict[str, str]:
        return {rec["ip"]: n for n in self.hosts() for rec in self.node(n)["ports"].values()}

    @cached_property
    def _nics_by_plane(self) -> dict[int, list[tuple[str, dict[str, Any]]]]:
        table: dict[int, list[tuple[str, dict[str, Any]]]] = {}
        for n in self.hosts():
            for rec in self.node(n)["ports"].values():
                if rec["plane"] is not None:
                    table.setdefault(rec["plane"], []).append((n, rec))
        return table

    def plane_nics(self, plane: int) -> list[tuple[str, dict[str, Any]]]:
        """(host, address record) of every NIC on `plane`, in host order."""
        return self._nics_by_plane.get(plane, [])

    def rate(self, a: str, b: str) -> float:
        """Bit/s from `a` to `b`: the link's rate, or what is left of it in that direction (`egress_bps`)."""
        data = self.graph.edges[a, b]
        return data.get("egress_bps", {}).get(a, data["bps"])

    def set_rate(self, a: str, b: str, bps: float | None) -> None:
        """Run the direction from `a` to `b` at `bps` (None: at the link's own rate again)."""
        data = self.graph.edges[a, b]
        egress = {n: r for n, r in data.get("egress_bps", {}).items() if n != a}
        if bps is not None and bps != data["bps"]:
            egress[a] = bps
        if egress:
            data["egress_bps"] = egress
        else:
            data.pop("egress_bps", None)

    def degrade(self, a: str, b: str, fraction: float, direction: str = "both") -> list[tuple[str, str]]:
        """Run link a-b at `fraction` of its rate in `direction` (DIRECTIONS); returns the (from, to) changed."""
        if not 0 < fraction <= 1:
            raise ValueError(f"rate_fraction must be in (0, 1], got {fraction}")
        ends = {"both": [(a, b), (b, a)], "a_to_b": [(a, b)], "b_to_a": [(b, a)]}.get(direction)
        if ends is None:
            raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        bps = self.link(a, b)["bps"]  # KeyError for a link the model does not have
        for src, dst in ends:
            self.set_rate(src, dst, bps * fraction)
        return ends

    def oversubscription(self) -> float:
        """The most any switch's compute hosts' links can bring in over what its links to other switches carry on
        (2 on the paper's 8-plane fabric at 8 nodes, 4 at 16; 1 on the builders' defaults). A storage plane's
        leaves, many clients on one uplink, are the storage network's own shape and left out."""
        worst = 1.0
        for s in self.switches():
            down = sum(d["bps"] for _, h, d in self.graph.edges(s, data=True)
                       if d["kind"] == "host" and not self.node(h)["role"].startswith("storage"))
            up = sum(d["bps"] for _, _, d in self.graph.edges(s, data=True) if d["kind"] == "fabric")
            if down and up:
                worst = max(worst, down / up)
        return worst

    def is_degraded(self) -> bool:
        return any("egress_bps" in d for _, _, d in self.graph.edges(data=True))

    def egress_rates(self, nodes: list[str]) -> dict[str, float]:
        """Interface -> rate (bit/s) of what every port of `nodes` sends."""
        return {naming.intf_name(n, d["ports"][n]): self.rate(n, peer) for n in nodes
                for peer, d in self.graph[n].items()}

    def copy(self) -> Fabric:
        """A fabric whose links' rates can change without touching this one's."""
        graph = self.graph.copy()
        for _, _, d in graph.edges(data=True):
            if "egress_bps" in d:
                d["egress_bps"] = dict(d["egress_bps"])
        return Fabric(graph)

    def nic_on_plane(self, host: str, plane: int) -> str | None:
        """The leaf of the host's NIC on `plane`, or None."""
        for leaf, d in self.graph[host].items():
            if d["kind"] == "host" and d["plane"] == plane:
                return leaf
        return None

    def nic_ip(self, host: str, plane: int) -> str:
        """The host's address on `plane`."""
        return next(rec["ip"] for rec in self.node(host)["ports"].values() if rec["plane"] == plane)

    def nic_planes(self, host: str) -> set[int]:
        return {d["plane"] for d in self.graph[host].values() if d["kind"] == "host"}

    def host_by_ip(self, ip: str) -> str:
        """Inverse of the address plan, for any interface address of a host."""
        try:
            return self._host_by_ip[ip]
        except KeyError:
            raise KeyError(f"no host has address {ip}") from None

    @cached_property
    def _switch_by_dpid(self) -> dict[int, str]:
        return {self.node(s)["dpid"]: s for s in self.switches()}

    def switch_by_dpid(self, dpid: int) -> str:
        return self._switch_by_dpid[dpid]

    def ip(self, host: str) -> str:
        """The host's identity: the address of its NIC on its own plane (a multi-port GPU has one per plane)."""
        return self.node(host)["ip"]

    # -- views ------------------------------------------------------------------------------------
    def node_gpus(self, nvlink_domain: str) -> list[str]:
        return sorted(self.graph[nvlink_domain], key=lambda h: self.node(h)["gpu"])

    # -- JSON ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        nodes = []
        for name, data in self.graph.nodes(data=True):
            record = {"name": name, **data}
            if "ports" in record:
                record["ports"] = {str(p): rec for p, rec in record["ports"].items()}
            nodes.append(record)
        links = [{"a": a, "b": b, **{k: v for k, v in d.items() if k != "ports"},
                  "port_a": d["ports"][a], "port_b": d["ports"][b]}
                 for a, b, d in self.graph.edges(data=True)]
        return {"format": FORMAT, "graph": dict(self.graph.graph), "nodes": nodes, "links": links}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<model>") -> Fabric:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise UserError(f"not an mpft fabric model (expected format {FORMAT!r})", file=source,
                            field="format")
        try:
            graph = nx.Graph(**data["graph"])
            for record in data["nodes"]:
                attrs = {k: v for k, v in record.items() if k != "name"}
                if "ports" in attrs:
                    attrs["ports"] = {int(p): rec for p, rec in attrs["ports"].items()}
                graph.add_node(record["name"], **attrs)
            for record in data["links"]:
                a, b = record["a"], record["b"]
                attrs = {k: v for k, v in record.items() if k not in ("a", "b", "port_a", "port_b")}
                graph.add_edge(a, b, ports={a: record["port_a"], b: record["port_b"]}, **attrs)
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"malformed model: {exc}", file=source) from None
        return cls(graph)

    def save(self, path: Path) -> None:
        """Replaced whole, so a reader (the controller, after degrade_link) never sees half a model."""
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(self.to_dict()))
        part.replace(path)

    @classmethod
    def load(cls, path: Path) -> Fabric:
        return cls.from_dict(load_json(path, "model"), source=str(path))


def up_neighbours(fabric: Fabric, switch: str) -> list[str]:
    """Switches one tier above `switch` (ripl's up_nodes)."""
    tier = naming.TIERS[fabric.node(switch)["role"]]
    return _neighbours_at(fabric, switch, tier + 1)


def down_neighbours(fabric: Fabric, switch: str) -> list[str]:
    """Switches one tier below, or the hosts of a leaf (ripl's down_nodes)."""
    tier = naming.TIERS[fabric.node(switch)["role"]]
    return _neighbours_at(fabric, switch, tier - 1)



def _neighbours_at(fabric: Fabric, switch: str, tier: int) -> list[str]:
    def node_tier(n: str) -> int:
        d = fabric.node(n)
        return 0 if d["kind"] == "host" else naming.TIERS.get(d["role"], -1)

    return sorted((n for n in fabric.graph[switch] if fabric.node(n)["kind"] != "nvlink"
                   and node_tier(n) == tier), key=lambda n: fabric.port(switch, n))

