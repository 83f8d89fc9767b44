"""Worked example of a controller experiment: each new flow leaving a leaf takes the uplink that is the
least loaded right now (port statistics polled every 100 ms), in the style of Hedera's placement.

    sudo .venv/bin/mpft up --app controllers/examples/least_loaded.py

The decisions live in LeastLoadedValve (testable without a switch); the app adds one event to the shim it
inherits from FabricApp, which does the rest (ECMP routes on spines and for single next hops, failover, sweep,
readiness). At a leaf, traffic for other leaves goes to table 1 (above ECMP's route, which it overrides); a miss
there sends the packet to this app, which pins the flow's 5-tuple to the least-loaded equal-cost uplink (idle
timeout 5 s) and sends the packet on.
"""

from __future__ import annotations

from os_ken.controller import ofp_event
from os_ken.controller.handler import MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import ipv4, packet, tcp, udp

from controllers import openflow
from controllers.base import FabricApp
from controllers.valve import Messages, Valve

FLOW_TABLE = 1
IDLE_TIMEOUT = 5


class LeastLoadedValve(Valve):
    def switch_messages(self, switch: str) -> list:
        routes = self.routes.get(switch, {})
        msgs = openflow.route_messages(self.dp, routes, self.hash_basis(switch))
        if self.fabric.node(switch)["role"] != "leaf":
            return msgs
        parser, ofp = self.dp.ofproto_parser, self.dp.ofproto
        to_controller = parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)
        msgs.append(openflow.flow(self.dp, {}, [to_controller], priority=0, table_id=FLOW_TABLE))
        msgs += [openflow.goto_flow(self.dp, ip, FLOW_TABLE, priority=openflow.ROUTE_PRIORITY + 10)
                 for ip, ports in sorted(routes.items()) if len(ports) > 1]
        return msgs

    def packet_in(self, switch: str, match, data: bytes) -> Messages:
        """A new flow reached us: pin its 5-tuple to the least-loaded equal-cost port and send the packet on."""
        pkt = packet.Packet(data)
        ip = pkt.get_protocol(ipv4.ipv4)
        ports = self.routes.get(switch, {}).get(ip.dst) if ip else None
        if not ports:
            return {}
        port = min(ports, key=lambda p: self.tx_bps.get((switch, p), 0.0))
        parser, ofp = self.dp.ofproto_parser, self.dp.ofproto
        fields = {"eth_type": 0x0800, "ip_proto": ip.proto, "ipv4_src": ip.src, "ipv4_dst": ip.dst}
        l4 = pkt.get_protocol(tcp.tcp) or pkt.get_protocol(udp.udp)
        if l4 is not None:
            kind = "tcp" if isinstance(l4, tcp.tcp) else "udp"
            fields.update({f"{kind}_src": l4.src_port, f"{kind}_dst": l4.dst_port})
        actions = [parser.OFPActionOutput(port)]
        self.tx_bps[(switch, port)] = self.tx_bps.get((switch, port), 0.0) + 1e6  # count it until stats catch up
        return {switch: [
            openflow.flow(self.dp, fields, actions, priority=10, table_id=FLOW_TABLE, idle_timeout=IDLE_TIMEOUT),
            parser.OFPPacketOut(self.dp, buffer_id=ofp.OFP_NO_BUFFER, match=match, actions=actions, data=data)]}


class LeastLoadedApp(FabricApp):
    VALVE = LeastLoadedValve
    POLL_INTERVAL = 0.1

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def _new_flow(self, ev) -> None:
        switch = self.switch_of(ev.msg.datapath)
        if switch is not None:
            self.send(self.valve.packet_in(switch, ev.msg.match, ev.msg.data))
