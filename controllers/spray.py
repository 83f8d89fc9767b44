"""Packet spraying: per-packet path diversity from per-packet entropy, the paper's first ask.

OVS picks a select-group bucket by hashing a flow, so a switch cannot spray one flow by itself. Senders vary
the UDP source port per packet (what RoCEv2 and Ultra Ethernet do) and switches map the low bits of it to
next hops with masked matches: a sender that steps its entropy by one per packet is sprayed round-robin
(htsim found round-robin clearly better than hashing a small entropy set). A sender with random entropy is
spread evenly in expectation.

TCP keeps one source port per connection, so TCP flows stay on one path (hashed per flow, as under ECMP):
OVS cannot cut flowlets itself; a sender that changes its port at flowlet gaps gets flowlet switching.
"""

from __future__ import annotations

from controllers import openflow
from controllers.base import FabricApp
from controllers.valve import Valve


class SprayValve(Valve):
    def switch_messages(self, switch: str) -> list:
        return openflow.spray_messages(self.dp, self.routes.get(switch, {}), self.hash_basis(switch))


class SprayApp(FabricApp):
    VALVE = SprayValve
