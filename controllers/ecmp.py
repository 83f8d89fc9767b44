"""ECMP: every switch hashes each flow's 5-tuple onto its equal-cost next hops.

Select groups carry an explicit selection method (dp_hash over the 5-tuple) and a hash basis that differs
per switch, so the leaf and spine tiers do not make the same choice (polarisation). This is the baseline the
paper says collides for collective traffic: one flow, one path.
"""

from __future__ import annotations

from controllers import openflow
from controllers.base import FabricApp
from controllers.valve import Valve


class EcmpValve(Valve):
    def switch_messages(self, switch: str) -> list:
        return openflow.route_messages(self.dp, self.routes.get(switch, {}), self.hash_basis(switch), "dp_hash")


class EcmpApp(FabricApp):
    VALVE = EcmpValve
