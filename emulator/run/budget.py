"""The machine's forwarding budget: packet-hops per second the switch daemons sustain on the default fabric
(unshaped), one plane's daemon alone and every plane at once, beside what the default fabric's all-to-all would
ask of them.

Measured on the fabric itself, not on a small chain: every wake-up of a forwarding thread polls every port of
its daemon, so the budget shrinks as a daemon's port count grows (measured here with one daemon for every
plane: one saturating flow made 39 k pps over 6 ports, 20 k over 96, 7 k over 384).
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


def _flood(emu: Emulation, pairs: list[tuple[str, str]], seconds: float, pps: float = 0) -> list[float]:
    """UDP from each source to its destination, all at once, at `pps` each (0: at full speed); packets/s each
    delivered."""
    args = ["-u", "-b", f"{pps * DATAGRAM * 8:.0f}", "-l", str(DATAGRAM), "-t", f"{seconds:g}"]
    rates = []
    for out in iperf.clients_output(emu, pairs, args):
        end = json.loads(out[out.index("{"):])["end"]["sum"]
        rates.append((end["packets"] - end["lost_packets"]) / end["seconds"])
    return rates


LOSS_KNEE = 0.02  # the machine's budget is the most it delivers with at most this much lost
SHARES = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0)  # offered load per plane, in equal shares of one plane's flood


def measure_budget(seconds: float = 3.0, switch_daemons: str | None = None, **params) -> dict:
    """Packet-hops/s across leaf-spine-leaf (3 OVS hops) of the unshaped default fabric (or the one `params`
    build), received:
    - one plane alone, one UDP flood at full speed (one switch daemon's budget when each plane has its own);
    - every plane at once (the machine's budget): one flow per plane at a set rate, raised step by step until
      more than 2 % is lost; the most delivered within that loss counts. A flood on every plane would measure
      the senders fighting the switches for the cores instead."""
    fabric = topologies.build(**{**params, "mtu": 1500})
    planes = [p for p in fabric.planes if not fabric.is_storage_plane(p)]
    pairs = [(fabric.hosts(plane=p)[0], fabric.hosts(plane=p)[-1]) for p in planes]  # first and last leaf
    steps = []
    with Emulation(fabric, shape=False, quiet=True, switch_daemons=switch_daemons) as emu:
        alone = _flood(emu, pairs[:1], seconds)[0]
        if len(pairs) > 1:
            for share in SHARES:
                offered = alone / len(pairs) * share
                received = sum(_flood(emu, pairs, seconds, offered))
                steps.append({"offered_pps": offered * len(pairs), "received_pps": received})
                if received < (1 - LOSS_KNEE) * offered * len(pairs):
                    break
        mode = emu.switchd.mode
    within = [s["received_pps"] for s in steps if s["received_pps"] >= (1 - LOSS_KNEE) * s["offered_pps"]]
    machine = max(within, default=steps[0]["received_pps"] if steps else alone)
    hops = 3
    need = demand_hops_per_s(topologies.build(**params))
    return {"switch_daemons": mode, "hops": hops, "datagram": DATAGRAM, "planes": len(pairs),
            "ports": sum(len(fabric.graph[sw]) for sw in fabric.switches()),
            "instance_pps": alone, "instance_hops_per_s": alone * hops,
            "pps": machine, "hops_per_s": machine * hops, "steps": steps,
            "default_need_hops_per_s": need, "default_share": need / (machine * hops)}
