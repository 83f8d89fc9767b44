"""RoCEv2 framing as scapy layers, so captures of the transport decode in scapy (and Wireshark: RoCEv2 on UDP
4791, where our extension shows as the start of the payload).

scapy.contrib.roce has BTH and AETH; RETH is defined here from the InfiniBand spec (section 9.3.3), and MPFTX is
our extension. The transport itself builds the same bytes with struct (emulator.model.wire). Atomics are not emulated.
cc pull's request (opcode 0xC0) and grant (0xC1), private opcodes from the manufacturer-specific range, are
ACK-shaped (BTH, AETH, MPFTX). MPFTX's two wide fields are named for what they carry, by the BTH opcode (the bytes
are the same): a data packet's `msg_id`, an ACK-shaped packet's `hold_ns` (the receiver's hold time: from the
echoed packet's arrival to the ACK's departure); an ACK's `sack`, a pull request's or grant's `count`.
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, ByteField, ConditionalField, IntField, LongField, XIntField, XLongField, XShortField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, bind_layers

from emulator.model import wire


class RETH(Packet):
    """RDMA Extended Transport Header: where a WRITE goes and how long it is."""
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_len", 0)]


def _opcode(ext: Packet) -> int | None:
    """The BTH opcode above MPFTX (past a RETH or AETH), None if it is alone."""
    layer = ext.underlayer
    while layer is not None and not isinstance(layer, BTH):
        layer = layer.underlayer
    return None if layer is None else layer.opcode


class MPFTX(Packet):
    """Our extension: timestamps for RTT and one-way delay, the plane, the message id or an ACK's hold time,
    selective acks or pull's count."""
    name = "MPFTX"
    fields_desc = [XShortField("magic", wire.MAGIC), ByteField("flags", 0), ByteField("plane", 0),
                   ConditionalField(IntField("msg_id", 0), lambda p: _opcode(p) not in wire.CONTROL_OPS),
                   ConditionalField(IntField("hold_ns", 0), lambda p: _opcode(p) in wire.CONTROL_OPS),
                   LongField("tx_ns", 0), LongField("echo_ns", 0),
                   ConditionalField(BitField("sack", 0, 64), lambda p: _opcode(p) not in wire.PULL_OPS),
                   ConditionalField(BitField("count", 0, 64), lambda p: _opcode(p) in wire.PULL_OPS)]


for _op in wire.RETH_OPS:
    bind_layers(BTH, RETH, opcode=_op)
for _op in wire.DATA_OPS - wire.RETH_OPS:
    bind_layers(BTH, MPFTX, opcode=_op)
for _op in {wire.CNP} | wire.PULL_OPS:  # ACK-shaped: AETH, then MPFTX
    bind_layers(BTH, AETH, opcode=_op)
bind_layers(AETH, MPFTX)  # scapy binds UDP dport 4791 -> BTH and BTH -> AETH for ACKNOWLEDGE
bind_layers(RETH, MPFTX)


def decode(frame: bytes) -> Packet:
    """An Ethernet frame (as captured on a host interface) as scapy layers."""
    return Ether(frame)


__all__ = ["AETH", "BTH", "IP", "MPFTX", "RETH", "UDP", "decode"]
