"""Static: a precomputed, collision-free path for every flow of a known traffic pattern (the paper's third option).

Environment:
- MPFT_PATTERN: path of a JSON pattern file, `{"pairs": [["n0g0", "n5g0"], ...], "balanced": false}`. Each
  pair between two leaves of a two-tier plane is pinned to the spine an edge colouring of the leaf-to-leaf
  demand gives it (controllers/static_paths.py), so no two pairs share a link; a pattern that cannot be
  collision-free is refused, or with "balanced" spread as evenly as an edge colouring allows. Unset or empty,
  the app is plain ECMP, so it can always start.

Every switch holds ECMP's routes; each source leaf also holds one higher-priority flow per pinned pair that
outputs to the assigned spine (for a flow from another plane, the leaf where PXN brings it in). Spines
already route down by destination, so only those leaves need them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from controllers import openflow
from controllers.base import FabricApp
from controllers.routing import Routes
from controllers.static_paths import Assignment, assign_from_file, entry_leaf
from controllers.valve import Valve
from emulator.model.fabric import Fabric

log = logging.getLogger(__name__)

PINNED_PRIORITY = openflow.ROUTE_PRIORITY + 100


def pinned_flow(dp, src_ip: str, dst_ip: str, port: int, priority: int = PINNED_PRIORITY):
    """One source-destination pair out of one port, above the per-destination routes."""
    return openflow.flow(dp, {"eth_type": 0x0800, "ipv4_src": src_ip, "ipv4_dst": dst_ip},
                         [dp.ofproto_parser.OFPActionOutput(port)], priority=priority)


def static_messages(dp, fabric: Fabric, routes: Routes, assignment: Assignment, switch: str, basis: int) -> list:
    """ECMP's messages for `switch`, plus the pinned flows of the pairs whose source leaf it is. A pair whose
    spine is no longer on a shortest path to its destination (a link failed) takes ECMP's route until it is."""
    here = routes.get(switch, {})
    msgs = openflow.route_messages(dp, here, basis, "dp_hash")
    for (src, dst), spine in sorted(assignment.items()):
        port = fabric.port(switch, spine) if entry_leaf(fabric, src, dst) == switch else None
        if port in here.get(fabric.ip(dst), ()):
            msgs.append(pinned_flow(dp, fabric.ip(src), fabric.ip(dst), port))
    return msgs


class StaticValve(Valve):
    def __init__(self, fabric: Fabric, seed: int = 0, assignment: Assignment | None = None) -> None:
        super().__init__(fabric, seed)
        self.assignment: Assignment = assignment or {}

    def switch_messages(self, switch: str) -> list:
        return static_messages(self.dp, self.fabric, self.routes, self.assignment, switch, self.hash_basis(switch))


class StaticApp(FabricApp):
    def make_valve(self) -> StaticValve:
        """The pattern file is read here, in the app, so the valve only ever sees the assignment."""
        path = os.environ.get("MPFT_PATTERN")
        assignment = assign_from_file(self.fabric, Path(path)) if path else {}
        log.info("static: %d pairs pinned to spines", len(assignment))
        return StaticValve(self.fabric, self.settings.seed, assignment)
