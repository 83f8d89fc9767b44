"""The machine's forwarding budget: packet-hops per second the ovs-vswitchd thread sustains on the default
fabric (unshaped), beside what the default fabric's all-to-all would ask of it.

Measured on the default fabric itself, not on a small chain: every wake-up of the forwarding thread polls
every userspace port, so the budget shrinks as the fabric grows (measured here: one saturating flow made
39 k pps over 6 ports, 20 k over 96, 7 k over 384).
"""

from __future__ import annotations

import json

from controllers.routing import shortest_path_routes
from emulator.analysis import bounds
from emulator.model import topologies
from emulator.model.fabric import Fabric
from emulator.net.emulation import Emulation
from emulator.run import iperf

DATAGRAM = 1400


def demand_hops_per_s(fabric: Fabric) -> float:
    """Packet-hops/s through OVS if every GPU's all-to-all ran at its max-min fair rate with MTU packets."""
    hosts = fabric.gpu_hosts()
    pairs = [(a, b) for a in hosts for b in hosts if a != b]
    rates = bounds.max_min_rates(fabric, pairs)
    routes = shortest_path_routes(fabric)  # once, not once per pair
    switches = set(fabric.switches())
    total = 0.0
    for pair, rate in rates.items():
        hops = sum(frac for (a, _b), frac in bounds.flow_links(fabric, *pair, routes=routes).items()
                   if a in switches)
        total += rate / (8 * fabric.mtu) * hops
    return total


def measure_budget(seconds: float = 3.0, **params) -> dict:
    """UDP at full speed across leaf-spine-leaf (3 OVS hops) of the unshaped default fabric (or the one `params`
    build): received pps x hops."""
    fabric = topologies.build(**{**params, "mtu": 1500})
    src, dst = "n0g0", "n15g0"  # plane 0, first and last leaf
    with Emulation(fabric, shape=False, quiet=True) as emu:
        out = iperf.client_output(emu, src, dst, ["-u", "-b", "0", "-l", str(DATAGRAM), "-t", f"{seconds:g}"])
    end = json.loads(out[out.index("{"):])["end"]["sum"]
    received = end["packets"] - end["lost_packets"]
    pps = received / end["seconds"]
    hops = 3
    need = demand_hops_per_s(topologies.build(**params))
    return {"pps": pps, "hops": hops, "hops_per_s": pps * hops, "datagram": DATAGRAM,
            "ports": sum(len(fabric.graph[sw]) for sw in fabric.switches()),
            "loss": end["lost_percent"] / 100, "default_need_hops_per_s": need,
            "default_share": need / (pps * hops)}
