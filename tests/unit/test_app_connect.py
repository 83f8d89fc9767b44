"""A switch connecting to a routing app (controllers.base): the app names it from the features reply's datapath
id, not from the datapath object, whose id os-ken's own handler of the same event sets, in whichever order the
apps' event threads run."""

from __future__ import annotations

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


def test_a_switch_is_synced_before_os_ken_has_set_its_id(tmp_path):
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2)
    fabric.save(tmp_path / "fabric.json")
    base.configure(base.Settings(model=tmp_path / "fabric.json"))
    try:
        app = EcmpApp()
        switch = fabric.switches()[0]
        dpid = fabric.node(switch)["dpid"]
        dp = Connecting()
        app._switch_features(ofp_event.EventOFPSwitchFeatures(ofproto_v1_5_parser.OFPSwitchFeatures(dp, dpid)))
        assert app.datapaths == {switch: dp}
        kinds = [type(m).__name__ for m in dp.sent]
        assert "OFPFlowMod" in kinds and "OFPBarrierRequest" in kinds  # its routes, then the barrier
    finally:
        base.configure(None)
