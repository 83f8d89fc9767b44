"""Worked example of a controller experiment: each new flow leaving a leaf takes the equal-cost path whose
busier link (the leaf's uplink, or the spine's link down towards the destination) is the least loaded (the bulk
flows placed on it, then port statistics polled every 100 ms), in the style of Hedera's placement.

    sudo .venv/bin/mpft up --app controllers/examples/least_loaded.py
    sudo .venv/bin/mpft run controllers/examples/least_loaded.toml    # against ECMP and spray, same traffic

The decisions live in LeastLoadedValve (testable without a switch); the app adds one event to the shim it
inherits from FabricApp, which does the rest (ECMP routes on spines and for single next hops, failover, sweep,
readiness). At a leaf, traffic for other leaves goes to table 1 (above ECMP's route, which it overrides); a miss
there sends the packet to this app, which pins the flow's 5-tuple to that uplink (idle timeout 5 s), sends the
packet on and logs the placement (the run directory's controller.log). A path's load is the bulk flows placed on
its busier link (a flow whose first packet is full-sized; an ACK or pull's request is placed but not counted), then
that link's measured rate.
"""

from __future__ import annotations

import logging
from collections import Counter

from os_ken.controller import ofp_event
from os_ken.controller.handler import MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import ipv4, packet, tcp, udp

from controllers import openflow
from controllers.base import FabricApp
from controllers.valve import Messages, Valve

FLOW_TABLE = 1
IDLE_TIMEOUT = 5
BULK_BYTES = 1000  # a flow whose first packet is larger is bulk data; smaller ones (ACKs, control) count for nothing

log = logging.getLogger(__name__)


class LeastLoadedValve(Valve):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.placed: dict[tuple[str, tuple], int] = {}  # (switch, 5-tuple) -> port: packets that beat the flow entry
        # bulk flows placed on each (switch, port): port statistics lag a flow that has only just started, and
        # overwrite any guess within a poll (an example: a long-lived app would subtract expired flows)
        self.bulk_flows: Counter[tuple[str, int]] = Counter()
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

    def path_links(self, switch: str, port: int, dst_ip: str) -> list[tuple[str, int]]:
        """The (switch, port) links a packet for dst_ip leaving `switch` by `port` is sent on: that port, and the
        next switch's single way on (a spine's link down to the destination's leaf), if it has one."""
        links = [(switch, port)]
        nxt = self.fabric.peer(switch, port)
        onward = self.routes.get(nxt, {}).get(dst_ip, ())
        if len(onward) == 1:
            links.append((nxt, onward[0]))
        return links

    def load(self, links: list[tuple[str, int]]) -> tuple[int, float]:
        """A path's load at its busier link: the bulk flows placed on it, then its measured rate."""
        return max(self.bulk_flows[link] for link in links), max(self.tx_bps.get(link, 0.0) for link in links)

    def packet_in(self, switch: str, match, data: bytes) -> Messages:
        """A new flow reached us: pin its 5-tuple to the equal-cost port whose path is least loaded at its busier
        link, and send the packet on."""
        pkt = packet.Packet(data)
        ip = pkt.get_protocol(ipv4.ipv4)
        ports = self.routes.get(switch, {}).get(ip.dst) if ip else None
        if not ports:
            return {}
        parser, ofp = self.dp.ofproto_parser, self.dp.ofproto
        fields = {"eth_type": 0x0800, "ip_proto": ip.proto, "ipv4_src": ip.src, "ipv4_dst": ip.dst}
        l4 = pkt.get_protocol(tcp.tcp) or pkt.get_protocol(udp.udp)
        if l4 is not None:
            kind = "tcp" if isinstance(l4, tcp.tcp) else "udp"
            fields.update({f"{kind}_src": l4.src_port, f"{kind}_dst": l4.dst_port})
        key = (switch, tuple(fields.items()))
        port = self.placed.get(key)
        if port is None:  # a new flow: its path, once (later packets that reached us before its entry follow it)
            paths = {p: self.path_links(switch, p, ip.dst) for p in ports}
            loads = {p: self.load(links) for p, links in paths.items()}
            port = self.placed[key] = min(ports, key=loads.__getitem__)
            log.info("placed %s at %s on port %d (busier link: %d bulk flows, %.1f Mbit/s)",
                     " ".join(f"{k}={v}" for k, v in fields.items() if k != "eth_type"), switch, port,
                     loads[port][0], loads[port][1] / 1e6)
            if len(data) > BULK_BYTES:
                self.bulk_flows.update(paths[port])
        actions = [parser.OFPActionOutput(port)]
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
