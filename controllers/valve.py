"""A routing scheme's decisions, kept apart from the I/O (Faucet's valve): given the model and what the switches
report, the OpenFlow messages each switch needs.

Every event method returns `{switch name: [messages]}` and sends nothing; controllers/base.py's os-ken app
gathers the observations and sends what comes back, so the decisions are unit-tested against a fake flow table
(tests/unit/fakeswitch.py). Messages are built with a protocol description, not a live datapath: os-ken
serialises them for whichever datapath sends them.

A scheme subclasses Valve and overrides `switch_messages(switch)`: the whole state a switch should hold, built
from `self.routes` (recomputed around failed links) with the builders in controllers/openflow.py and `self.dp`.
Everything else (full sync, repair, sweep) follows from that one function.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from os_ken.ofproto import ofproto_v1_5
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controllers import openflow
from controllers.openflow import FlowEntry
from controllers.routing import Routes, shortest_path_routes
from emulator.model.fabric import Fabric

log = logging.getLogger(__name__)

Messages = dict[str, list]  # switch name -> the messages to send it, in order


class Valve:
    """Per-switch state computed from the fabric model, and what to send when switches or links change."""

    def __init__(self, fabric: Fabric, seed: int = 0) -> None:
        self.fabric = fabric
        self.seed = seed
        self.dp = ProtocolDesc(ofproto_v1_5.OFP_VERSION)
        self.failed_links: set[frozenset[str]] = set()
        self.routes: Routes = self.compute_routes()
        self.tx_bps: dict[tuple[str, int], float] = {}  # (switch, port) -> recent transmit rate
        self._tx_last: dict[tuple[str, int], tuple[int, float]] = {}

    # -- hooks for subclasses -----------------------------------------------------------------
    def compute_routes(self) -> Routes:
        """Shortest-path next hops around the links known to be down."""
        return shortest_path_routes(self.fabric, frozenset(self.failed_links))

    def switch_messages(self, switch: str) -> list:
        """Everything `switch` should hold (groups before the flows that use them)."""
        raise NotImplementedError

    def hash_basis(self, switch: str) -> int:
        return openflow.hash_basis(switch, self.seed)

    # -- events ---------------------------------------------------------------------------------
    def switch_connected(self, switch: str) -> Messages:
        """A switch (re)connects: its whole state. Idempotent (flows are added over themselves, groups added or
        modified), so a resync of a forwarding switch never opens a gap."""
        return {switch: self.switch_messages(switch)}

    def port_status(self, switch: str, port_no: int, down: bool, connected: Iterable[str]) -> Messages:
        """A port went down or came up. On a change of the link's state, routes are recomputed, and each connected
        switch whose routes change gets its new state in place, then the removal of what only its old state had
        (spray tables and groups of a port set that is gone), so it holds exactly what a full sync would give."""
        try:
            peer = self.fabric.peer(switch, port_no)
        except KeyError:  # the local port, or a port the model does not have
            return {}
        link = frozenset((switch, peer))
        if down == (link in self.failed_links):
            return {}
        (self.failed_links.add if down else self.failed_links.discard)(link)
        log.info("link %s-%s %s: recomputing routes", switch, peer, "down" if down else "up")
        routes = self.compute_routes()
        before = {s: self.switch_messages(s) for s in connected if routes.get(s) != self.routes.get(s)}
        self.routes = routes
        out = {}
        for s, old in before.items():
            new = self.switch_messages(s)
            out[s] = new + _removals(self.dp, new, *openflow.entries(old))
        return out

    def sweep(self, switch: str, flows: Iterable[FlowEntry] = (), groups: Iterable[int] = ()) -> Messages:
        """What a switch reports holding (either part, as its replies arrive) less what this app would install:
        the deletions of what an earlier controller left behind."""
        msgs = _removals(self.dp, self.switch_messages(switch), flows, groups)
        if msgs:
            log.info("%s: removing %d flows and groups this app does not hold", switch, len(msgs))
        return {switch: msgs}

    def port_stats(self, switch: str, tx_bytes: Iterable[tuple[int, int]], now: float) -> None:
        """Record transmit counters (port, bytes) read at time `now`, updating `tx_bps` from the last reading."""
        for port, count in tx_bytes:
            key = (switch, port)
            last = self._tx_last.get(key)
            if last is not None and now > last[1]:
                self.tx_bps[key] = (count - last[0]) * 8 / (now - last[1])
            self._tx_last[key] = (count, now)


def _removals(dp, wanted: list, flows: Iterable[FlowEntry], groups: Iterable[int]) -> list:
    """Deletions of the given flows and groups that `wanted` does not install; flows first, since deleting a
    group deletes the flows that use it."""
    keep_flows, keep_groups = openflow.state_of(wanted)
    msgs = [openflow.delete_flow(dp, table, priority, match) for table, priority, match in flows
            if openflow.flow_key(table, priority, match) not in keep_flows]
    return msgs + [openflow.delete_group(dp, group) for group in groups if group not in keep_groups]
