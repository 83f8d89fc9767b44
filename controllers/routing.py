"""Route computation from the fabric model: per switch and destination address, the equal-cost next hops.

Pure functions, no OpenFlow: the apps turn these into messages (controllers/openflow.py). Routing stays inside
one plane; hosts never forward inside a plane (crossing planes is the hosts' job, over NVLink).
"""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from emulator.model.fabric import Fabric

# switch -> destination IP -> output ports (sorted, one entry per equal-cost next hop)
Routes = dict[str, dict[str, tuple[int, ...]]]


def shortest_path_routes(fabric: Fabric, failed_links: frozenset[frozenset[str]] = frozenset()) -> Routes:
    """Equal-cost shortest-path next hops from every fabric switch to every host NIC on its plane.

    Distances are computed once per leaf (every host on a leaf shares its routes but the last hop), over the
    plane's switches only, so a host is never a transit hop. `failed_links` (pairs of node names) are left out,
    which is how controllers repair routes globally after a failure.
    """
    routes: Routes = defaultdict(dict)
    for plane in fabric.planes:
        switch_graph = nx.Graph()
        switch_graph.add_nodes_from(fabric.switches(plane=plane))
        switch_graph.add_edges_from(
            (a, b) for a, b in fabric.links("fabric")
            if fabric.link(a, b)["plane"] == plane and frozenset((a, b)) not in failed_links)
        for leaf in fabric.switches(role="leaf", plane=plane):
            nics = [(host, port) for host in fabric.graph[leaf]
                    if fabric.node(host)["kind"] == "host" and frozenset((host, leaf)) not in failed_links
                    for port, rec in fabric.node(host)["ports"].items() if rec["plane"] == plane]
            if not nics:
                continue
            dist = nx.single_source_shortest_path_length(switch_graph, leaf)
            toward_leaf = {switch: tuple(sorted(fabric.port(switch, peer) for peer in switch_graph[switch]
                                                if dist.get(peer) == d - 1))
                           for switch, d in dist.items() if switch != leaf}
            for host, host_port in nics:
                ip = fabric.node(host)["ports"][host_port]["ip"]
                routes[leaf][ip] = (fabric.port(leaf, host),)
                for switch, ports in toward_leaf.items():
                    routes[switch][ip] = ports
    return dict(routes)


def port_sets(routes_of_switch: dict[str, tuple[int, ...]]) -> dict[tuple[int, ...], int]:
    """Group ids for the multi-port next-hop sets of one switch, numbered deterministically from 1."""
    sets = sorted({ports for ports in routes_of_switch.values() if len(ports) > 1})
    return {ports: i + 1 for i, ports in enumerate(sets)}
