"""The base os-ken app every routing scheme builds on: model loading, route helpers, resync, readiness.

A routing scheme subclasses FabricApp and overrides `switch_messages(dp, switch)` to return the OpenFlow
messages a switch should hold; the base class sends them when the switch connects (and again on a resync),
then a barrier, and records the switch as synced once the barrier returns. Ryu-style apps: the same
`set_ev_cls` handlers and `OSKenApp` base as any Ryu app.

What a subclass gets: `self.fabric` (the model), `self.routes` (switch -> destination IP -> equal-cost ports,
recomputed around failed links), `self.datapaths` (switch name -> connected datapath), `self.sync(switch)`,
the builders in controllers/openflow.py, and, with `POLL_INTERVAL` set, port statistics polled that often:
`self.tx_bps[(switch, port)]` is each port's recent transmit rate. controllers/examples/least_loaded.py is a
worked example.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_5

from controllers import openflow
from controllers.routing import Routes, shortest_path_routes
from emulator.model.fabric import Fabric

log = logging.getLogger(__name__)


@dataclass
class Settings:
    """What the harness tells the app (it runs in the harness's process)."""

    model: Path
    ready_file: Path | None = None
    seed: int = 0


SETTINGS: Settings | None = None


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def _settings() -> Settings:
    if SETTINGS is None:  # started by osken-style tooling: take the model from the environment
        return Settings(model=Path(os.environ["MPFT_MODEL"]),
                        ready_file=Path(os.environ["MPFT_READY_FILE"]) if "MPFT_READY_FILE" in os.environ
                        else None, seed=int(os.environ.get("MPFT_SEED", "0")))
    return SETTINGS


class FabricApp(app_manager.OSKenApp):
    """Installs per-switch state computed from the fabric model; override switch_messages."""

    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]
    POLL_INTERVAL: float | None = None  # seconds between port-statistics requests; None: no polling

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings = _settings()
        self.fabric = Fabric.load(self.settings.model)
        self.failed_links: set[frozenset[str]] = set()
        self.routes: Routes = self.compute_routes()
        self.datapaths: dict[str, object] = {}
        self.tx_bps: dict[tuple[str, int], float] = {}
        self._tx_last: dict[tuple[str, int], tuple[int, float]] = {}
        self._poller = None
        # switch -> the flows and groups it should hold, and which of the two replies a sweep still waits for
        self._sweep: dict[str, tuple[set[tuple], set[int], set[str]]] = {}

    # -- hooks for subclasses -----------------------------------------------------------------
    def compute_routes(self) -> Routes:
        """Shortest-path next hops around the links known to be down."""
        return shortest_path_routes(self.fabric, frozenset(self.failed_links))

    def switch_messages(self, dp, switch: str) -> list:
        raise NotImplementedError

    def hash_basis(self, switch: str) -> int:
        return openflow.hash_basis(switch, self.settings.seed)

    def switch_of(self, dp) -> str | None:
        """The model's name for a datapath, or None for one the model does not have (it is ignored)."""
        try:
            return self.fabric.switch_by_dpid(dp.id)
        except KeyError:
            return None

    # -- OpenFlow events -------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev) -> None:
        dp = ev.msg.datapath
        switch = self.switch_of(dp)
        if switch is None:
            log.warning("ignoring datapath %016x: not in the model", dp.id)
            return
        self.datapaths[switch] = dp
        self.sync(switch, sweep=True)
        # a (re)started controller learns of links that went down while it was away
        dp.send_msg(dp.ofproto_parser.OFPPortDescStatsRequest(dp, 0, dp.ofproto.OFPP_ANY))
        if self.POLL_INTERVAL and self._poller is None:
            self._poller = hub.spawn(self._poll_port_stats)

    def _poll_port_stats(self) -> None:
        while True:
            for dp in list(self.datapaths.values()):
                dp.send_msg(dp.ofproto_parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY))
            hub.sleep(self.POLL_INTERVAL)

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def _port_stats_reply(self, ev) -> None:
        switch = self.switch_of(ev.msg.datapath)
        if switch is None:
            return
        now = time.monotonic()
        for stat in ev.msg.body:
            key = (switch, stat.port_no)
            last = self._tx_last.get(key)
            if last is not None and now > last[1]:
                self.tx_bps[key] = (stat.tx_bytes - last[0]) * 8 / (now - last[1])
            self._tx_last[key] = (stat.tx_bytes, now)

    def sync(self, switch: str, sweep: bool = False) -> None:
        """Send a switch its whole state (idempotent: flows are added over themselves, groups added or modified,
        so nothing is ever missing), then a barrier to learn when it is in place. With `sweep` (when a switch
        connects, e.g. to a restarted controller), then ask what the switch holds and remove the rest: flows and
        groups an earlier controller left that this one would not install."""
        dp = self.datapaths[switch]
        msgs = self.switch_messages(dp, switch)
        for msg in msgs:
            dp.send_msg(msg)
        parser, ofp = dp.ofproto_parser, dp.ofproto
        dp.send_msg(parser.OFPBarrierRequest(dp))
        if sweep:
            self._sweep[switch] = (*openflow.state_of(msgs), {"flows", "groups"})
            dp.send_msg(parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY))
            # group statistics, not descriptions: os-ken cannot parse OVS's group descriptions in OpenFlow 1.5
            dp.send_msg(parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL))

    def _sweeping(self, ev, part: str) -> tuple[str, tuple] | None:
        """The switch and its wanted state if this reply answers a sweep (the last part ends it), else None."""
        switch = self.switch_of(ev.msg.datapath)
        if switch not in self._sweep:
            return None
        wanted = self._sweep[switch]
        if not ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            wanted[2].discard(part)
            if not wanted[2]:
                del self._sweep[switch]
        return switch, wanted

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    def _flow_desc_reply(self, ev) -> None:
        sweeping = self._sweeping(ev, "flows")
        if sweeping is None:
            return
        switch, (flows, _, _) = sweeping
        dp = ev.msg.datapath
        parser, ofp = dp.ofproto_parser, dp.ofproto
        for stat in ev.msg.body:
            if openflow.flow_key(stat.table_id, stat.priority, stat.match) not in flows:
                log.info("%s: removing a flow this app does not hold: table %d priority %d %s", switch,
                         stat.table_id, stat.priority, stat.match)
                dp.send_msg(parser.OFPFlowMod(dp, table_id=stat.table_id, command=ofp.OFPFC_DELETE_STRICT,
                                              priority=stat.priority, match=stat.match, out_port=ofp.OFPP_ANY,
                                              out_group=ofp.OFPG_ANY))

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def _group_stats_reply(self, ev) -> None:
        sweeping = self._sweeping(ev, "groups")
        if sweeping is None:
            return
        switch, (_, groups, _) = sweeping
        dp = ev.msg.datapath
        for group in ev.msg.body:
            if group.group_id not in groups:
                log.info("%s: removing group %d, which this app does not use", switch, group.group_id)
                dp.send_msg(dp.ofproto_parser.OFPGroupMod(dp, command=dp.ofproto.OFPGC_DELETE,
                                                          group_id=group.group_id))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev) -> None:
        switch = self.switch_of(ev.msg.datapath)
        if switch is not None and self.settings.ready_file:
            with open(self.settings.ready_file, "a") as out:
                out.write(f"{switch}\n")

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev) -> None:
        """Global repair: a switch next to a failure repairs locally (watched buckets); the others learn of it
        here, and every switch gets routes recomputed around the failed link (in place, no gap)."""
        msg = ev.msg
        ofp = msg.datapath.ofproto
        down = bool(msg.desc.state & ofp.OFPPS_LINK_DOWN or msg.desc.config & ofp.OFPPC_PORT_DOWN) \
            or msg.reason == ofp.OFPPR_DELETE
        self.link_state(self.switch_of(msg.datapath), msg.desc.port_no, down)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def _port_desc_reply(self, ev) -> None:
        ofp = ev.msg.datapath.ofproto
        switch = self.switch_of(ev.msg.datapath)
        for port in ev.msg.body:  # only failures: the other end of a link may not have noticed yet
            if port.state & ofp.OFPPS_LINK_DOWN or port.config & ofp.OFPPC_PORT_DOWN:
                self.link_state(switch, port.port_no, True)

    def link_state(self, switch: str | None, port_no: int, down: bool) -> None:
        """Record a link's state; on a change, recompute routes and resync, in place, the switches they change."""
        try:
            peer = self.fabric.peer(switch, port_no)
        except KeyError:  # an unknown switch or port (the local port, a stranger)
            return
        link = frozenset((switch, peer))
        if down == (link in self.failed_links):
            return
        (self.failed_links.add if down else self.failed_links.discard)(link)
        log.info("link %s-%s %s: recomputing routes", switch, peer, "down" if down else "up")
        old, self.routes = self.routes, self.compute_routes()
        for name in list(self.datapaths):
            if self.routes.get(name) != old.get(name):  # the others would get the same messages again
                self.sync(name)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev) -> None:
        msg = ev.msg
        log.error("switch %016x refused a message: type=%s code=%s", msg.datapath.id, msg.type, msg.code)
