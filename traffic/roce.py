"""RoCEv2 framing as scapy layers, so captures of the transport decode in scapy (and Wireshark: RoCEv2 on UDP
4791, where our extension shows as the start of the payload).

scapy.contrib.roce has BTH and AETH; RETH is defined here from the InfiniBand spec (section 9.3.3), and MPFTX is
our extension. The transport itself builds the same bytes with struct (emulator.model.wire). Atomics are not emulated.
cc pull's request (opcode 0xC0) and grant (0xC1), private opcodes from the manufacturer-specific range, are
ACK-shaped (BTH, AETH, MPFTX) and carry their count in MPFTX's sack field. In an ACK, MPFTX's msg_id field
holds the receiver's hold time in ns (from the echoed packet's arrival to the ACK's departure).
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, ByteField, IntField, LongField, XIntField, XLongField, XShortField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from emulator.model import wire


class RETH(Packet):
    """RDMA Extended Transport Header: where a WRITE goes and how long it is."""
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]


class MPFTX(Packet):
    """Our extension: timestamps for RTT and one-way delay, the plane, the message id, selective acks."""
    name = "MPFTX"
    fields_desc = [XShortField("magic", wire.MAGIC), ByteField("flags", 0), ByteField("plane", 0),
                   IntField("msg_id", 0), LongField("tx_ns", 0), LongField("echo_ns", 0),
                   BitField("sack", 0, 64)]


for _op in wire.RETH_OPS:
    bind_layers(BTH, RETH, opcode=_op)
for _op in wire.DATA_OPS - wire.RETH_OPS:
    bind_layers(BTH, MPFTX, opcode=_op)
for _op in (wire.CNP, wire.PULL_REQUEST, wire.PULL_GRANT):  # ACK-shaped: AETH, then MPFTX (sack: the count)
    bind_layers(BTH, AETH, opcode=_op)
bind_layers(AETH, MPFTX)  # scapy binds UDP dport 4791 -> BTH and BTH -> AETH for ACKNOWLEDGE
bind_layers(RETH, MPFTX)


def decode(frame: bytes) -> Packet:
    """An Ethernet frame (as captured on a host interface) as scapy layers."""
    return Ether(frame)


__all__ = ["AETH", "BTH", "IP", "MPFTX", "RETH", "UDP", "decode"]
