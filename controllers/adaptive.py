"""Adaptive routing: equal-cost next hops weighted away from congestion, re-weighted every 100 ms.

Each switch's select groups get bucket weights from how loaded each next hop is right now: its transmit rate
(OpenFlow port statistics, polled every POLL_INTERVAL) and its egress queue backlog (tc statistics, which
OpenFlow cannot see: the emulator writes them to a file named by MPFT_QUEUES every 100 ms). A group is
re-sent (add-or-modify, in place) only when its weights change, so flows move off a hot link within a few
polling intervals. With per-packet entropy (spray-style senders) the shift is per packet; otherwise per flow.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from os_ken.lib import hub

from controllers import openflow
from controllers.base import FabricApp
from controllers.routing import port_sets
from controllers.valve import Messages, Valve
from emulator.model.fabric import Fabric

WEIGHT_SCALE = 100  # weights are whole numbers; an idle next hop gets this much
MIN_WEIGHT = 5


def next_hop_weights(ports: tuple[int, ...], utilisation: dict[int, float]) -> list[int]:
    """Weights inversely related to load: an idle port gets WEIGHT_SCALE, a saturated one much less."""
    return [max(MIN_WEIGHT, round(WEIGHT_SCALE / (1.0 + 4.0 * utilisation.get(p, 0.0)))) for p in ports]


class AdaptiveValve(Valve):
    """ECMP's state, with bucket weights that follow each next hop's load."""

    def __init__(self, fabric: Fabric, seed: int = 0) -> None:
        super().__init__(fabric, seed)
        self.weights: dict[str, dict[tuple[int, ...], list[int]]] = {}

    def utilisation(self, switch: str, backlog: dict[str, int]) -> dict[int, float]:
        """Per port: transmit rate over capacity plus queue backlog (bytes by port number) over the queue limit."""
        out = {}
        for data in self.fabric.graph[switch].values():
            port = data["ports"][switch]
            rate = self.tx_bps.get((switch, port), 0.0) / data["bps"]
            out[port] = rate + backlog.get(str(port), 0) / self.fabric.queue_bytes
        return out

    def switch_messages(self, switch: str) -> list:
        return openflow.route_messages(self.dp, self.routes.get(switch, {}), self.hash_basis(switch),
                                       weights=self.weights.get(switch))

    def reweight(self, backlog: dict[str, dict[str, int]], connected: Iterable[str]) -> Messages:
        """The select groups whose weights the current load changes (add-or-modify, in place); the rest are left
        alone. `backlog` is every switch port's egress backlog, as the emulator writes it."""
        out = {}
        for switch in connected:
            use = self.utilisation(switch, backlog.get(switch, {}))
            msgs = []
            for ports, gid in port_sets(self.routes.get(switch, {})).items():
                new = next_hop_weights(ports, use)
                if self.weights.setdefault(switch, {}).get(ports) != new:
                    self.weights[switch][ports] = new
                    msgs.append(openflow.select_group(self.dp, gid, ports, self.hash_basis(switch), weights=new))
            if msgs:
                out[switch] = msgs
        return out


class AdaptiveApp(FabricApp):
    VALVE = AdaptiveValve
    POLL_INTERVAL = 0.1

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        queues = os.environ.get("MPFT_QUEUES")
        self.queue_file = Path(queues) if queues else None
        hub.spawn(self._reweight_loop)

    def queue_backlog(self) -> dict[str, dict[str, int]]:
        """Every switch port's egress backlog in bytes, as the emulator last wrote it."""
        if self.queue_file is None:
            return {}
        try:
            return json.loads(self.queue_file.read_text())
        except (OSError, ValueError):
            return {}

    def _reweight_loop(self) -> None:
        while True:
            hub.sleep(self.POLL_INTERVAL)
            self.send(self.valve.reweight(self.queue_backlog(), self.datapaths))
