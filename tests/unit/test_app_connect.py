"""A switch connecting to a routing app (controllers.base): the app names it from the features reply's datapath
id, not from the datapath object, whose id os-ken's own handler of the same event sets, in whichever order the
apps' event threads run; and it is synced only once every barrier it was sent has returned, with the links the
app believes down in the readiness file beside it."""

from __future__ import annotations

import json

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_5, ofproto_v1_5_parser

from controllers import base
from controllers.ecmp import EcmpApp
from emulator.model import topologies


class Connecting:
    """What the app uses of os-ken's Datapath while a switch connects: its protocol modules and send_msg; `id`
    is still None (os-ken's handler has not run yet)."""

    ofproto, ofproto_parser = ofproto_v1_5, ofproto_v1_5_parser

    def __init__(self) -> None:
        self.id = None
        self.sent: list = []

    def send_msg(self, msg) -> None:
        self.sent.append(msg)


def _connected(tmp_path, ready_file=None):
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2)
    fabric.save(tmp_path / "fabric.json")
    base.configure(base.Settings(fabric_file=tmp_path / "fabric.json", ready_file=ready_file))
    app = EcmpApp()
    switch = fabric.switches()[0]
    dp = Connecting()
    app._switch_features(ofp_event.EventOFPSwitchFeatures(
        ofproto_v1_5_parser.OFPSwitchFeatures(dp, fabric.node(switch)["dpid"])))
    dp.id = fabric.node(switch)["dpid"]  # os-ken's own handler has run by the time replies arrive
    return fabric, app, switch, dp


def test_a_host_port_that_comes_up_after_its_switch_connected_is_waited_for(tmp_path):
    ready = tmp_path / "controller.ready"
    try:
        fabric, app, leaf, dp = _connected(tmp_path, ready)
        host = next(n for n in fabric.graph[leaf] if fabric.node(n)["kind"] == "host")
        port_no = fabric.port(leaf, host)
        ofp, parser = ofproto_v1_5, ofproto_v1_5_parser
        barrier = ofp_event.EventOFPBarrierReply(parser.OFPBarrierReply(dp))

        def readiness():
            state = json.loads(ready.read_text())
            return state["synced"], state["links_down"]

        assert not ready.exists()  # its state and requests are out, the barrier behind them has not returned
        desc = parser.OFPPortDescStatsReply(dp, body=[parser.OFPPort(port_no=port_no, config=0,
                                                                      state=ofp.OFPPS_LINK_DOWN)])
        app._port_desc_reply(ofp_event.EventOFPPortDescStatsReply(desc))
        assert readiness() == ([], [sorted((leaf, host))])  # the repair's barrier is out as well
        app._barrier_reply(barrier)
        assert readiness() == ([], [sorted((leaf, host))])
        app._barrier_reply(barrier)
        assert readiness() == ([leaf], [sorted((leaf, host))])

        up = parser.OFPPortStatus(dp, ofp.OFPPR_MODIFY, parser.OFPPort(port_no=port_no, config=0, state=0))
        app._port_status(ofp_event.EventOFPPortStatus(up))
        assert readiness() == ([], [])  # the repair is in flight
        app._barrier_reply(barrier)
        assert readiness() == ([leaf], [])
    finally:
        base.configure(None)


def test_a_switch_is_synced_before_os_ken_has_set_its_id(tmp_path):
    try:
        _, app, switch, dp = _connected(tmp_path)
        assert app.datapaths == {switch: dp}
        kinds = [type(m).__name__ for m in dp.sent]
        assert "OFPFlowMod" in kinds and kinds[-1] == "OFPBarrierRequest"  # its routes, then the barrier
    finally:
        base.configure(None)
