"""OpenFlow 1.5 message builders: route tables in, os-ken messages out (the Faucet split).

Nothing here talks to a switch. `dp` is anything with `ofproto` and `ofproto_parser` attributes: a live
os-ken Datapath, or `os_ken.ofproto.ofproto_protocol.ProtocolDesc(version)` in tests.

Re-sending the same messages leaves the switch in the same state: groups use Open vSwitch's add-or-modify
command and flows OFPFC_ADD (which replaces a flow with the same match and priority), so a resync after a
controller restart modifies in place and never opens a forwarding gap.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from typing import Any

from controllers.routing import port_sets

COOKIE = 0x6D706674_00000000  # "mpft": every flow we install carries it
COOKIE_MASK = 0xFFFFFFFF_00000000
ROUTE_PRIORITY = 100
MISS_PRIORITY = 0

OFPGC_ADD_OR_MOD = 0x8000  # Open vSwitch extension: add the group, or modify it if it exists
NTR_VENDOR_ID = 0x0000154D  # Netronome: OVS's group selection-method property
NTRT_SELECTION_METHOD = 1
SELECTION_METHODS = ("dp_hash", "hash")


def hash_basis(switch: str, seed: int = 0) -> int:
    """A different, stable hash basis per switch so consecutive tiers do not polarise."""
    return zlib.crc32(f"{seed}:{switch}".encode()) & 0xFFFFFFFF


def selection_method(dp, method: str, param: int):
    """OVS's selection-method group property (an OpenFlow 1.5 experimenter property).

    Without it, OVS's default select group on the userspace datapath ignores L4 ports; `dp_hash` hashes the
    5-tuple in the datapath with `param` as the hash basis.
    """
    if method not in SELECTION_METHODS:
        raise ValueError(f"unknown selection method {method!r}")
    raw = bytes(4) + method.encode().ljust(16, b"\0") + struct.pack("!Q", param)
    words = list(struct.unpack(f"!{len(raw) // 4}I", raw))
    parser, ofp = dp.ofproto_parser, dp.ofproto
    return parser.OFPGroupPropExperimenter(type_=ofp.OFPGPT_EXPERIMENTER, experimenter=NTR_VENDOR_ID,
                                           exp_type=NTRT_SELECTION_METHOD, data=words)


def _watched_bucket(dp, bucket_id: int, port: int, weight: int | None = None):
    """A bucket that outputs to `port` and is live only while that port is up (OVS honours watch_port in
    select groups too), so a switch repairs locally, at once, when one of its links fails."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    props = [parser.OFPGroupBucketPropWatch(type_=ofp.OFPGBPT_WATCH_PORT, watch=port)]
    if weight is not None:
        props.append(parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=weight))
    return parser.OFPBucket(bucket_id=bucket_id, actions=[parser.OFPActionOutput(port)], properties=props)


def select_group(dp, group_id: int, ports: Iterable[int], basis: int, method: str = "dp_hash",
                 weights: Iterable[int] | None = None):
    """A select group with one watched bucket per output port, hashing flows onto the live ones."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    ports = list(ports)
    weights = list(weights) if weights is not None else [1] * len(ports)
    buckets = [_watched_bucket(dp, i, port, weight)
               for i, (port, weight) in enumerate(zip(ports, weights, strict=True))]
    return parser.OFPGroupMod(dp, command=OFPGC_ADD_OR_MOD, type_=ofp.OFPGT_SELECT, group_id=group_id,
                              buckets=buckets, properties=[selection_method(dp, method, basis)])


def failover_group(dp, group_id: int, ports: Iterable[int]):
    """A fast-failover group: the first port that is up, in the given order."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    buckets = [_watched_bucket(dp, i, port) for i, port in enumerate(ports)]
    return parser.OFPGroupMod(dp, command=OFPGC_ADD_OR_MOD, type_=ofp.OFPGT_FF, group_id=group_id,
                              buckets=buckets)


def flow(dp, match: dict, actions: list | None = None, *, goto: int | None = None,
         priority: int = ROUTE_PRIORITY, table_id: int = 0, **kwargs):
    """One flow (OFPFC_ADD, our cookie) that applies `actions`, or goes on to table `goto`; neither: drop."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    if goto is not None:
        instructions = [parser.OFPInstructionGotoTable(goto)]
    elif actions is not None:
        instructions = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
    else:
        instructions = []
    return parser.OFPFlowMod(dp, cookie=COOKIE, table_id=table_id, command=ofp.OFPFC_ADD, priority=priority,
                             match=parser.OFPMatch(**match), instructions=instructions, **kwargs)


def ipv4_flow(dp, ip: str, actions: list, priority: int = ROUTE_PRIORITY, table_id: int = 0):
    return flow(dp, {"eth_type": 0x0800, "ipv4_dst": ip}, actions, priority=priority, table_id=table_id)


def goto_flow(dp, ip: str, table_id: int, priority: int = ROUTE_PRIORITY):
    """Send traffic for `ip` on to another table (where spraying picks the port)."""
    return flow(dp, {"eth_type": 0x0800, "ipv4_dst": ip}, goto=table_id, priority=priority)


def drop_miss(dp, table_id: int = 0):
    """An explicit lowest-priority drop, so what nothing routes is counted, never flooded or sent to us."""
    return flow(dp, {}, priority=MISS_PRIORITY, table_id=table_id)


def route_messages(dp, routes: dict[str, tuple[int, ...]], basis: int, method: str = "dp_hash",
                   weights: dict[tuple[int, ...], list[int]] | None = None) -> list:
    """Groups then flows for one switch: single next hops output directly, several share a select group
    (weighted where `weights` gives a port set its bucket weights)."""
    parser = dp.ofproto_parser
    groups = port_sets(routes)
    weights = weights or {}
    msgs = [select_group(dp, gid, ports, basis, method, weights.get(ports)) for ports, gid in groups.items()]
    for ip in sorted(routes):
        ports = routes[ip]
        action = parser.OFPActionGroup(groups[ports]) if len(ports) > 1 else parser.OFPActionOutput(ports[0])
        msgs.append(ipv4_flow(dp, ip, [action]))
    msgs.append(drop_miss(dp))
    return msgs


SPRAY_GROUP_BASE = 0x10000  # fast-failover groups of the spray tables are numbered from here


def spray_bits(n_ports: int) -> int:
    """Source-port bits a spray table matches: enough values for an even round robin over `n_ports`
    (a power of two divides exactly; otherwise four values per port keep the imbalance small)."""
    bits = max(1, (n_ports - 1).bit_length())
    return bits if n_ports & (n_ports - 1) == 0 else bits + 2


def slot_group(table: int, value: int) -> int:
    """The fast-failover group of one source-port value of a spray table."""
    return SPRAY_GROUP_BASE + table * 1024 + value


def slot_failover(dp, table: int, value: int, ports: tuple[int, ...], port: int):
    """A value's fast-failover group: its next hop `port` first, then the others in turn, so a dead link is
    skipped at once."""
    i = ports.index(port)
    return failover_group(dp, slot_group(table, value), ports[i:] + ports[:i])


def spray_table(dp, table: int, ports: tuple[int, ...], slots: list[int]) -> list:
    """Table `table`: UDP packets pick their next hop by the low bits of the source port (value v goes to
    `slots[v]`, through its fast-failover group; len(slots) is a power of two); anything else takes select group
    `table` (sent separately)."""
    parser = dp.ofproto_parser
    mask = len(slots) - 1
    msgs = [slot_failover(dp, table, value, ports, port) for value, port in enumerate(slots)]
    msgs += [flow(dp, {"eth_type": 0x0800, "ip_proto": 17, "udp_src": (value, mask)},
                  [parser.OFPActionGroup(slot_group(table, value))], table_id=table) for value in range(len(slots))]
    return msgs + [flow(dp, {}, [parser.OFPActionGroup(table)], table_id=table, priority=MISS_PRIORITY)]


def spray_messages(dp, routes: dict[str, tuple[int, ...]], basis: int) -> list:
    """Per-packet spraying: UDP packets pick their next hop from the low bits of the source port.

    A sender that steps its source port per packet (RoCEv2 entropy) is spread round-robin over the equal-cost
    ports, deterministically; hashing a small entropy set is visibly uneven. Each port-set gets a table
    (1, 2, ...); each source-port value goes to a fast-failover group starting at its port, so a dead link is
    skipped at once. Other traffic (TCP) is hashed per flow as in ECMP.
    """
    parser = dp.ofproto_parser
    groups = port_sets(routes)
    msgs = [select_group(dp, gid, ports, basis) for ports, gid in groups.items()]
    for ports, gid in groups.items():
        msgs += spray_table(dp, gid, ports, [ports[v % len(ports)] for v in range(1 << spray_bits(len(ports)))])
    for ip in sorted(routes):
        ports = routes[ip]
        if len(ports) > 1:
            msgs.append(goto_flow(dp, ip, groups[ports]))
        else:
            msgs.append(ipv4_flow(dp, ip, [parser.OFPActionOutput(ports[0])]))
    msgs.append(drop_miss(dp))
    return msgs


def encode(msg, xid: int = 1) -> bytes:
    """Wire bytes of a message (what Datapath.send_msg would send)."""
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)


def flow_key(table_id: int, priority: int, match) -> tuple:
    """What identifies a flow in a table (OpenFlow's strict match): table, priority and the match fields."""
    return table_id, priority, tuple(sorted(match.items()))


FlowEntry = tuple[int, int, Any]  # a flow as a switch reports it: table id, priority, OFPMatch


def entries(msgs: list) -> tuple[list[FlowEntry], list[int]]:
    """The flows (table, priority, match) and group ids `msgs` install, in the form a switch reports its own."""
    flows = [(m.table_id, m.priority, m.match) for m in msgs if m.__class__.__name__ == "OFPFlowMod"]
    groups = [m.group_id for m in msgs if m.__class__.__name__ == "OFPGroupMod"]
    return flows, groups


def state_of(msgs: list) -> tuple[set[tuple], set[int]]:
    """The flows and groups a switch should hold after `msgs` (what a sweep keeps)."""
    flows, groups = entries(msgs)
    return {flow_key(*entry) for entry in flows}, set(groups)


def delete_flow(dp, table_id: int, priority: int, match):
    """Remove exactly one flow (strict: same table, priority and match), whatever it outputs to."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    return parser.OFPFlowMod(dp, table_id=table_id, command=ofp.OFPFC_DELETE_STRICT, priority=priority,
                             match=match, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)


def delete_group(dp, group_id: int):
    """Remove a group (the switch also removes the flows that use it)."""
    return dp.ofproto_parser.OFPGroupMod(dp, command=dp.ofproto.OFPGC_DELETE, group_id=group_id)
