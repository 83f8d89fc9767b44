"""The machine's forwarding budget: packet-hops per second one ovs-vswitchd thread sustains, measured on a
small unshaped chain, beside what the default fabric's all-to-all would ask of it."""

from __future__ import annotations

import json

from emulator import topologies
from emulator.emulation import Emulation
from emulator.model import Fabric
from traffic import bounds

DATAGRAM = 1400


def demand_hops_per_s(fabric: Fabric) -> float:
    """Packet-hops/s through OVS if every GPU's all-to-all ran at its max-min fair rate with MTU packets."""
    hosts = fabric.hosts(role="gpu") or fabric.hosts()
    pairs = [(a, b) for a in hosts for b in hosts if a != b]
    rates = bounds.max_min_rates(fabric, pairs)
    switches = set(fabric.switches())
    total = 0.0
    for pair, rate in rates.items():
        hops = sum(frac for (a, _b), frac in bounds.flow_links(fabric, *pair).items() if a in switches)
        total += rate / (8 * fabric.mtu) * hops
    return total


def measure_budget(seconds: float = 3.0) -> dict:
    """UDP at full speed across leaf-spine-leaf (3 OVS hops), unshaped: received pps x hops."""
    chain = topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, mtu=1500)
    with Emulation(chain, shape=False, quiet=True) as emu:
        server = emu.popen("h1", ["iperf3", "-s", "-1", "-p", "5201"])
        emu.host("h0").cmd("sleep 0.3")
        out = emu.host("h0").cmd(f"iperf3 -c {chain.ip('h1')} -p 5201 -u -b 0 -l {DATAGRAM} "
                                 f"-t {seconds:g} -J")
        server.wait(timeout=10)
    end = json.loads(out[out.index("{"):])["end"]["sum"]
    received = end["packets"] - end["lost_packets"]
    pps = received / end["seconds"]
    hops = 3
    need = demand_hops_per_s(topologies.build())
    return {"pps": pps, "hops": hops, "hops_per_s": pps * hops, "datagram": DATAGRAM,
            "loss": end["lost_percent"] / 100, "default_need_hops_per_s": need,
            "default_share": need / (pps * hops)}
