"""RoCEv2 bytes for the hot path: struct codecs only (no scapy, so the agents start fast).

Layout of every datagram (UDP to port 4791, the source port carries entropy):
BTH (12 B) | RETH (16 B, on RDMA WRITE FIRST/ONLY) or AETH (4 B, on ACKNOWLEDGE and CNP) | MPFTX (32 B, our
extension: flags, plane, message id, transmit timestamp, echoed timestamp, selective-ack bitmap; an ACK carries
the receiver's hold time where data carries the message id) | payload |
ICRC (4 B, sent as zero: no NIC checks it, and computing it needs the IP header the kernel writes).
traffic.roce describes the same bytes as scapy layers, for decoding captures.
"""

from __future__ import annotations

import struct

ROCE_PORT = 4791
ENTROPY_BASE = 49152  # source ports 49152..65535 carry entropy (RoCEv2 uses the dynamic range)
ENTROPY_SPAN = 16384
MAGIC = 0x4D58  # "MX"

# BTH opcodes of the reliable connection (RC) transport, InfiniBand spec table 35
SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_ONLY = 0x00, 0x01, 0x02, 0x04
WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST, WRITE_ONLY = 0x06, 0x07, 0x08, 0x0A
ACK = 0x11
CNP = 0x81
# cc pull's control packets, in the manufacturer-specific opcode range (0xC0-0xFF): ACK-shaped (BTH, AETH, MPFTX),
# the count (sends wanted, or granted, in all for the queue pair) where an ACK has its selective acks
PULL_REQUEST, PULL_GRANT = 0xC0, 0xC1
PULL_OPS = {PULL_REQUEST, PULL_GRANT}
CONTROL_OPS = {ACK, CNP} | PULL_OPS

FIRST_OPS = {WRITE_FIRST, WRITE_ONLY, SEND_FIRST, SEND_ONLY}
LAST_OPS = {WRITE_LAST, WRITE_ONLY, SEND_LAST, SEND_ONLY}
DATA_OPS = FIRST_OPS | LAST_OPS | {WRITE_MIDDLE, SEND_MIDDLE}
RETH_OPS = {WRITE_FIRST, WRITE_ONLY}

# MPFTX flags
FLAG_RETX = 1  # a retransmission
FLAG_CE = 2  # (ACK) the acknowledged packet arrived ECN-marked
FLAG_DUP = 4  # (ACK) the acknowledged packet was a duplicate: a retransmission was spurious

# -- struct codecs ------------------------------------------------------------------------------------
UDP_HDR = struct.Struct("!HHHH")
BTH_HDR = struct.Struct("!BBHII")  # opcode, se/m/pad/ver, pkey, fecn/becn/resv|dqpn, ackreq|psn
RETH_HDR = struct.Struct("!QII")
AETH_HDR = struct.Struct("!I")  # syndrome << 24 | msn
EXT_HDR = struct.Struct("!HBBIQQQ")
ICRC = b"\x00\x00\x00\x00"
PSN_MASK = 0xFFFFFF

# bytes around the payload of a data packet: IP + UDP + BTH + RETH (first packet) + MPFTX + ICRC
IP_UDP = 20 + UDP_HDR.size
OVERHEAD = IP_UDP + BTH_HDR.size + RETH_HDR.size + EXT_HDR.size + len(ICRC)
ACK_LEN = UDP_HDR.size + BTH_HDR.size + AETH_HDR.size + EXT_HDR.size + len(ICRC)  # UDP datagram bytes
ETH = 14  # what the shaper counts on top of the IP packet


def payload_per_packet(mtu: int) -> int:
    return mtu - OVERHEAD


def data_opcode(op: str, first: bool, last: bool) -> int:
    if op == "send":
        return SEND_ONLY if first and last else SEND_FIRST if first else SEND_LAST if last else SEND_MIDDLE
    return WRITE_ONLY if first and last else WRITE_FIRST if first else WRITE_LAST if last else WRITE_MIDDLE


def pack_data(buf: bytearray, sport: int, opcode_: int, dqpn: int, psn: int, msg_id: int, tx_ns: int,
              plane: int, flags: int, payload_len: int, dma_len: int = 0) -> int:
    """Write one data packet's UDP datagram into `buf` (whose payload bytes are already zero); return its length."""
    off = UDP_HDR.size
    BTH_HDR.pack_into(buf, off, opcode_, 0, 0xFFFF, dqpn, (1 << 31) | (psn & PSN_MASK))
    off += BTH_HDR.size
    if opcode_ in RETH_OPS:
        RETH_HDR.pack_into(buf, off, 0, 0x1000 + dqpn, dma_len)  # virtual address 0: one region per QP
        off += RETH_HDR.size
    EXT_HDR.pack_into(buf, off, MAGIC, flags, plane, msg_id, tx_ns, 0, 0)
    length = off + EXT_HDR.size + payload_len + len(ICRC)
    buf[length - 4:length] = ICRC
    UDP_HDR.pack_into(buf, 0, sport, ROCE_PORT, length, 0)
    return length


def pack_ack(buf: bytearray, sport: int, dqpn: int, cum_psn: int, msn: int, echo_ns: int, tx_ns: int,
             sack: int, flags: int, plane: int, opcode_: int = ACK, hold_ns: int = 0) -> int:
    """An ACK (or a CNP): cumulative PSN in the BTH, selective acks of the 64 PSNs after it in MPFTX, and in
    MPFTX's hold_ns (where a data packet has its message id) how long the receiver held the echoed packet before
    this ACK left (ns, at most 2^32 - 1): the sender takes it off the round trip, which then is the fabric's alone."""
    off = UDP_HDR.size
    BTH_HDR.pack_into(buf, off, opcode_, 0, 0xFFFF, (1 << 30 if opcode_ == CNP else 0) | dqpn, cum_psn & PSN_MASK)
    off += BTH_HDR.size
    AETH_HDR.pack_into(buf, off, msn & PSN_MASK)
    off += AETH_HDR.size
    EXT_HDR.pack_into(buf, off, MAGIC, flags, plane, min(hold_ns, 0xFFFFFFFF), tx_ns, echo_ns, sack)
    length = off + EXT_HDR.size + len(ICRC)
    buf[length - 4:length] = ICRC
    UDP_HDR.pack_into(buf, 0, sport, ROCE_PORT, length, 0)
    return length


def pack_pull(buf: bytearray, sport: int, dqpn: int, count: int, tx_ns: int, plane: int, opcode_: int) -> int:
    """A pull request or grant (opcode_ in PULL_OPS): an ACK's shape, `count` where an ACK has its selective acks."""
    return pack_ack(buf, sport, dqpn, 0, 0, 0, tx_ns, count, 0, plane, opcode_)


class Parsed:
    """The fields the transport needs from one received UDP payload (the datagram without its UDP header). MPFTX's
    two wide fields carry what the opcode says: a data packet's message id, an ACK's hold time (`hold_ns`); an
    ACK's selective acks (`sack`), a pull packet's count (`count`); the others are 0."""
    __slots__ = ("opcode", "dqpn", "psn", "msg_id", "hold_ns", "tx_ns", "echo_ns", "sack", "count", "flags", "plane",
                 "payload_len", "dma_len")

    def __init__(self, data: bytes | memoryview) -> None:
        self.opcode, _, _, word, psn_word = BTH_HDR.unpack_from(data, 0)
        self.dqpn = word & 0xFFFFFF
        self.psn = psn_word & PSN_MASK
        off = BTH_HDR.size
        self.dma_len = 0
        control = False
        if self.opcode in RETH_OPS:
            _, _, self.dma_len = RETH_HDR.unpack_from(data, off)
            off += RETH_HDR.size
        elif self.opcode in CONTROL_OPS:
            off += AETH_HDR.size
            control = True
        magic, self.flags, self.plane, word, self.tx_ns, self.echo_ns, bits = EXT_HDR.unpack_from(data, off)
        if control:  # the opcode was looked up once, above: a data packet (most of them) pays nothing more
            self.msg_id, self.hold_ns = 0, word
            self.sack, self.count = (0, bits) if self.opcode in PULL_OPS else (bits, 0)
        else:
            self.msg_id, self.hold_ns, self.sack, self.count = word, 0, bits, 0
        if magic != MAGIC:
            raise ValueError("not an mpft-emu RoCE packet")
        self.payload_len = len(data) - off - EXT_HDR.size - len(ICRC)


def unwrap_psn(wire: int, near: int) -> int:
    """The full PSN for a 24-bit wire PSN, taking the one closest to `near` (PSNs wrap at 2^24)."""
    delta = (wire - near) & PSN_MASK
    if delta >= 1 << 23:
        delta -= 1 << 24
    return near + delta
