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
from emulator.model.fabric import Fabric

log = logging.getLogger(__name__)

PINNED_PRIORITY = openflow.ROUTE_PRIORITY + 100


def pinned_flow(dp, src_ip: str, dst_ip: str, port: int, priority: int = PINNED_PRIORITY):
    """One source-destination pair out of one port, above the per-destination routes."""
    return openflow.flow(dp, {"eth_type": 0x0800, "ipv4_src": src_ip, "ipv4_dst": dst_ip},
                         [dp.ofproto_parser.OFPActionOutput(port)], priority=priority)


def static_messages(dp, fabric: Fabric, routes: Routes, assignment: Assignment, switch: str, basis: int) -> list:
    """ECMP's messages for `switch`, plus the pinned flows of the pairs whose source leaf it is."""
    msgs = openflow.route_messages(dp, routes.get(switch, {}), basis, "dp_hash")
    msgs += [pinned_flow(dp, fabric.ip(src), fabric.ip(dst), fabric.port(switch, spine))
             for (src, dst), spine in sorted(assignment.items()) if entry_leaf(fabric, src, dst) == switch]
    return msgs


class StaticApp(FabricApp):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        path = os.environ.get("MPFT_PATTERN")
        self.assignment: Assignment = assign_from_file(self.fabric, Path(path)) if path else {}
        log.info("static: %d pairs pinned to spines", len(self.assignment))

    def switch_messages(self, dp, switch: str) -> list:
        return static_messages(dp, self.fabric, self.routes, self.assignment, switch, self.hash_basis(switch))
