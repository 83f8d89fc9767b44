"""The os-ken app every routing scheme runs in: a thin shim that gathers what switches report, asks the
scheme's valve (controllers/valve.py) what to do, and sends the messages it returns. Ryu-style: the same
`set_ev_cls` handlers and `OSKenApp` base as any Ryu app.

A routing scheme is a Valve subclass (its decisions) and a FabricApp subclass naming it in `VALVE`. The shim
sends a switch its full state when it connects, sweeps what the switch holds and the scheme would not install,
learns which ports are down, and on every port change sends the repair the valve returns. Every batch ends in a
barrier; a switch is synced while none of its barriers is outstanding, and the readiness file (JSON, replaced
whole) lists the synced switches and the links the app believes down, so the harness can wait until the app's
view matches the fabric's (a host port that came up after its switch connected is a repair still in flight).
With `POLL_INTERVAL` set, port statistics are polled that often and fed to the valve (`valve.tx_bps`).
controllers/examples/least_loaded.py is a worked example of an app with an event of its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib import hub
from os_ken.ofproto import ofproto_v1_5

from controllers.valve import Messages, Valve
from emulator.model.fabric import Fabric

log = logging.getLogger(__name__)


@dataclass
class Settings:
    """What the harness tells the app (it runs in the harness's process)."""

    fabric_file: Path
    ready_file: Path | None = None
    seed: int = 0


SETTINGS: Settings | None = None


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def _settings() -> Settings:
    if SETTINGS is None:  # started by osken-style tooling: take the fabric from the environment (MPFT_MODEL: old)
        return Settings(fabric_file=Path(os.environ.get("MPFT_FABRIC") or os.environ["MPFT_MODEL"]),
                        ready_file=Path(os.environ["MPFT_READY_FILE"]) if "MPFT_READY_FILE" in os.environ
                        else None, seed=int(os.environ.get("MPFT_SEED", "0")))
    return SETTINGS


class FabricApp(app_manager.OSKenApp):
    """Sends what the scheme's valve decides; set VALVE (or override make_valve) in a subclass."""

    OFP_VERSIONS = [ofproto_v1_5.OFP_VERSION]
    POLL_INTERVAL: float | None = None  # seconds between port-statistics requests; None: no polling
    VALVE: type[Valve]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.settings = _settings()
        self.fabric = Fabric.load(self.settings.fabric_file)
        self.valve = self.make_valve()
        self.datapaths: dict[str, object] = {}
        self._poller = None
        self._sweeping: dict[str, set[str]] = {}  # switch -> the replies ("flows", "groups") its sweep awaits
        self._barriers: dict[str, int] = {}  # switch -> barriers sent and not yet answered

    def make_valve(self) -> Valve:
        """The scheme's decisions for this fabric; override to give the valve more than the model and seed."""
        return self.VALVE(self.fabric, seed=self.settings.seed)

    def switch_of(self, dp, dpid: int | None = None) -> str | None:
        """The model's name for a datapath (by `dpid` where given), or None for one the model does not have (it is
        ignored)."""
        try:
            return self.fabric.switch_by_dpid(dp.id if dpid is None else dpid)
        except KeyError:
            return None

    def send(self, messages: Messages, barrier: bool = False) -> None:
        """Send each switch its messages in order, then (with `barrier`) a barrier, whose reply says they are in
        place (the readiness file)."""
        for switch, msgs in messages.items():
            dp = self.datapaths[switch]
            for msg in msgs:
                dp.send_msg(msg)
            if barrier:
                self._send_barrier(switch)

    def _send_barrier(self, switch: str) -> None:
        dp = self.datapaths[switch]
        self._barriers[switch] = self._barriers.get(switch, 0) + 1
        dp.send_msg(dp.ofproto_parser.OFPBarrierRequest(dp))

    def _write_ready(self) -> None:
        """The synced switches and the links believed down, replaced whole so a reader never sees half."""
        path = self.settings.ready_file
        if path is None:
            return
        state = {"synced": sorted(s for s, n in self._barriers.items() if n == 0),
                 "links_down": sorted(sorted(link) for link in self.valve.failed_links)}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, path)

    # -- OpenFlow events -------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev) -> None:
        """Full sync, then ask what the switch holds (to sweep what an earlier controller left) and, since a
        restarted controller must learn of links that went down while it was away, which ports are down."""
        dp = ev.msg.datapath
        # the id from the message, not dp.id: os-ken's own handler of this event sets dp.id, and the order in which
        # apps see an event is not fixed (under load ours came first, saw None, and the switch never synced)
        switch = self.switch_of(dp, ev.msg.datapath_id)
        if switch is None:
            log.warning("ignoring datapath %016x: not in the model", ev.msg.datapath_id)
            return
        self.datapaths[switch] = dp
        self._barriers[switch] = 0
        self.send(self.valve.switch_connected(switch))
        parser, ofp = dp.ofproto_parser, dp.ofproto
        self._sweeping[switch] = {"flows", "groups"}
        dp.send_msg(parser.OFPFlowDescStatsRequest(dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY))
        # group statistics, not descriptions: os-ken cannot parse OVS's group descriptions in OpenFlow 1.5
        dp.send_msg(parser.OFPGroupStatsRequest(dp, 0, ofp.OFPG_ALL))
        dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0, ofp.OFPP_ANY))
        # after the requests: their replies (and the repairs and sweeps they cause) come before its reply
        self._send_barrier(switch)
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
        if switch is not None:
            self.valve.port_stats(switch, [(stat.port_no, stat.tx_bytes) for stat in ev.msg.body],
                                  time.monotonic())

    def _sweep_reply(self, ev, part: str) -> str | None:
        """The switch whose sweep this reply answers (its last part ends that half of the sweep), else None."""
        switch = self.switch_of(ev.msg.datapath)
        if part not in self._sweeping.get(switch, ()):
            return None
        if not ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            self._sweeping[switch].discard(part)
            if not self._sweeping[switch]:
                del self._sweeping[switch]
        return switch

    @set_ev_cls(ofp_event.EventOFPFlowDescStatsReply, MAIN_DISPATCHER)
    def _flow_desc_reply(self, ev) -> None:
        switch = self._sweep_reply(ev, "flows")
        if switch is not None:
            flows = [(stat.table_id, stat.priority, stat.match) for stat in ev.msg.body]
            self.send(self.valve.sweep(switch, flows=flows), barrier=True)

    @set_ev_cls(ofp_event.EventOFPGroupStatsReply, MAIN_DISPATCHER)
    def _group_stats_reply(self, ev) -> None:
        switch = self._sweep_reply(ev, "groups")
        if switch is not None:
            self.send(self.valve.sweep(switch, groups=[group.group_id for group in ev.msg.body]), barrier=True)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev) -> None:
        switch = self.switch_of(ev.msg.datapath)
        if switch is not None and self._barriers.get(switch):
            self._barriers[switch] -= 1
            if not self._barriers[switch]:
                self._write_ready()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev) -> None:
        """Global repair: a switch next to a failure repairs locally (watched buckets); the others learn of it
        here, and every switch gets routes recomputed around the failed link (in place, no gap)."""
        msg = ev.msg
        ofp = msg.datapath.ofproto
        down = _port_down(ofp, msg.desc) or msg.reason == ofp.OFPPR_DELETE
        self._ports_changed(msg.datapath, [(msg.desc.port_no, down)])

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def _port_desc_reply(self, ev) -> None:
        ofp = ev.msg.datapath.ofproto
        # only failures: the other end of a link may not have noticed yet
        self._ports_changed(ev.msg.datapath, [(port.port_no, True) for port in ev.msg.body if _port_down(ofp, port)])

    def _ports_changed(self, dp, changes: Iterable[tuple[int, bool]]) -> None:
        switch = self.switch_of(dp)
        if switch is None:
            return
        for port_no, down in changes:
            self.send(self.valve.port_status(switch, port_no, down, self.datapaths), barrier=True)
        self._write_ready()  # the links believed down changed even where no switch's routes did

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev) -> None:
        msg = ev.msg
        log.error("switch %016x refused a message: type=%s code=%s", msg.datapath.id, msg.type, msg.code)


def _port_down(ofp, port) -> bool:
    """Whether a port description says the link is down or the port administratively down."""
    return bool(port.state & ofp.OFPPS_LINK_DOWN or port.config & ofp.OFPPC_PORT_DOWN)
