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


def select_group(dp, group_id: int, ports: Iterable[int], basis: int, method: str = "dp_hash",
                 weights: Iterable[int] | None = None):
    """A select group with one bucket per output port, hashing flows onto them."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    ports = list(ports)
    weights = list(weights) if weights is not None else [1] * len(ports)
    buckets = [parser.OFPBucket(
        bucket_id=i, actions=[parser.OFPActionOutput(port)],
        properties=[parser.OFPGroupBucketPropWeight(type_=ofp.OFPGBPT_WEIGHT, weight=weight)])
        for i, (port, weight) in enumerate(zip(ports, weights, strict=True))]
    return parser.OFPGroupMod(dp, command=OFPGC_ADD_OR_MOD, type_=ofp.OFPGT_SELECT, group_id=group_id,
                              buckets=buckets, properties=[selection_method(dp, method, basis)])


def ipv4_flow(dp, ip: str, actions: list, priority: int = ROUTE_PRIORITY, table_id: int = 0):
    parser, ofp = dp.ofproto_parser, dp.ofproto
    match = parser.OFPMatch(eth_type=0x0800, ipv4_dst=ip)
    return parser.OFPFlowMod(dp, cookie=COOKIE, table_id=table_id, command=ofp.OFPFC_ADD, priority=priority,
                             match=match, instructions=[
                                 parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)])


def drop_miss(dp, table_id: int = 0):
    """An explicit lowest-priority drop, so what nothing routes is counted, never flooded or sent to us."""
    parser, ofp = dp.ofproto_parser, dp.ofproto
    return parser.OFPFlowMod(dp, cookie=COOKIE, table_id=table_id, command=ofp.OFPFC_ADD,
                             priority=MISS_PRIORITY, match=parser.OFPMatch(), instructions=[])


def route_messages(dp, routes: dict[str, tuple[int, ...]], basis: int, method: str = "dp_hash") -> list:
    """Groups then flows for one switch: single next hops output directly, several share a select group."""
    parser = dp.ofproto_parser
    groups = port_sets(routes)
    msgs = [select_group(dp, gid, ports, basis, method) for ports, gid in groups.items()]
    for ip in sorted(routes):
        ports = routes[ip]
        action = parser.OFPActionGroup(groups[ports]) if len(ports) > 1 else parser.OFPActionOutput(ports[0])
        msgs.append(ipv4_flow(dp, ip, [action]))
    msgs.append(drop_miss(dp))
    return msgs


def encode(msg, xid: int = 1) -> bytes:
    """Wire bytes of a message (what Datapath.send_msg would send)."""
    msg.set_xid(xid)
    msg.serialize()
    return bytes(msg.buf)
