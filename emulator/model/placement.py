"""Which server runs which part of a fabric. Planes share no switch and no link, so a server owns whole planes:
their switches and every host whose NICs are on them. What crosses between servers is a node's NVLink domain
(PXN): it has a bridge on each server holding some of its GPUs, and those bridges are joined by a tunnel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

from emulator.model.errors import UserError
from emulator.model.fabric import Fabric


@dataclass
class Part:
    """What one server runs."""

    server: int
    planes: list[int]
    switches: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)  # NVLink domains with a bridge here

    @property
    def nodes(self) -> list[str]:
        return self.switches + self.hosts + self.domains


@dataclass(frozen=True)
class Tunnel:
    """An NVLink domain's bridges on servers `a` and `b` joined: one tunnel per domain and server pair, its
    id from the domain's position in the model so both ends agree on it."""

    domain: str
    vni: int
    a: int
    b: int


def place_planes(fabric: Fabric, servers: int, field_name: str = "servers") -> dict[int, int]:
    """Plane -> server: consecutive planes in blocks as even as they go (8 planes on 3 servers: 3, 3, 2)."""
    planes = fabric.planes
    if servers > len(planes):
        raise UserError(f"{servers} servers for {len(planes)} plane{'s' * (len(planes) != 1)}: a server runs "
                        "whole planes, so give at most one server per plane", field=field_name)
    for a, b in fabric.links():
        pa, pb = fabric.node(a).get("plane"), fabric.node(b).get("plane")
        if fabric.node(a)["kind"] == fabric.node(b)["kind"] == "switch" and pa != pb:
            raise UserError(f"switches {a} and {b} link planes {pa} and {pb}: planes that share links "
                            "cannot be split over servers", field=field_name)
    return {plane: i * servers // len(planes) for i, plane in enumerate(planes)}


def partition(fabric: Fabric, placement: dict[int, int], field_name: str = "servers") -> list[Part]:
    """Each server's switches, hosts and NVLink bridges, in server order."""
    parts = {s: Part(s, sorted(p for p, at in placement.items() if at == s)) for s in sorted(set(placement.values()))}
    for switch in fabric.switches():
        parts[placement[fabric.node(switch)["plane"]]].switches.append(switch)
    for host in fabric.hosts():
        owners = {placement[p] for p in fabric.nic_planes(host)}
        if len(owners) != 1:
            raise UserError(f"host {host} has NICs on planes of servers {sorted(owners)}: a multi-port NIC "
                            "cannot be split over servers", field=field_name)
        parts[owners.pop()].hosts.append(host)
    for domain in fabric.nvlink_domains():
        for server in sorted({_server_of(fabric, placement, gpu) for gpu in fabric.node_gpus(domain)}):
            parts[server].domains.append(domain)
    return list(parts.values())


def tunnels(fabric: Fabric, placement: dict[int, int]) -> list[Tunnel]:
    """The tunnels joining each NVLink domain's bridges on different servers."""
    found = []
    for index, domain in enumerate(fabric.nvlink_domains()):
        servers = sorted({_server_of(fabric, placement, gpu) for gpu in fabric.node_gpus(domain)})
        found += [Tunnel(domain, index + 1, a, b) for a, b in combinations(servers, 2)]
    return found


def _server_of(fabric: Fabric, placement: dict[int, int], host: str) -> int:
    return placement[min(fabric.nic_planes(host))]


@dataclass(frozen=True)
class TunnelEnd:
    """One server's end of a tunnel: a VXLAN device `name` in bridge `domain`, from `local` to `remote`."""

    name: str
    domain: str
    vni: int
    local: str
    remote: str


def tunnel_ends(found: list[Tunnel], server: int, addresses: dict[int, str]) -> list[TunnelEnd]:
    """Server `server`'s ends of the tunnels, given each server's address; named after the domain and the
    server at the other end (n3nv-x1), within an interface name's 15 characters for up to 10^4 nodes."""
    ends = []
    for t in found:
        if server in (t.a, t.b):
            peer = t.b if server == t.a else t.a
            ends.append(TunnelEnd(f"{t.domain}-x{peer}", t.domain, t.vni, addresses[server], addresses[peer]))
    return ends


def subfabric(fabric: Fabric, nodes: list[str]) -> Fabric:
    """The part of the model one server builds: its nodes (Part.nodes) and the links between them (an NVLink
    domain keeps only its GPUs here; its tunnels join the rest)."""
    return Fabric(fabric.graph.subgraph(nodes).copy())
