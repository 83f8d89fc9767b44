"""RoCEv2 framing: what emulator.model.wire packs decodes in scapy (traffic.roce) and in wire.Parsed, field by field;
the sizes match the MTU; 24-bit PSNs unwrap across 2^24."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scapy.packet import Raw

from emulator.model import wire
from traffic.roce import AETH, BTH, IP, MPFTX, RETH, UDP

SPORT = 50_123
QP = 0x123456
MSG = 0xDEADBEEF
TX_NS = 1_234_567_890_123
DATA_OPS = [wire.WRITE_FIRST, wire.WRITE_MIDDLE, wire.WRITE_LAST, wire.WRITE_ONLY, wire.SEND_FIRST,
            wire.SEND_MIDDLE, wire.SEND_LAST, wire.SEND_ONLY]


def _datagram(pack, *args, **kwargs) -> bytes:
    buf = bytearray(9000)
    return bytes(buf[:pack(buf, *args, **kwargs)])


def _ip(datagram: bytes) -> IP:
    """The datagram as the wire carries it (the kernel adds the IP header), re-dissected from bytes."""
    return IP(bytes(IP(src="10.0.0.1", dst="10.0.0.2") / UDP(datagram)))


def _data(opcode: int, psn: int = 77, payload: int = 100, flags: int = 0, dma_len: int = 4096) -> bytes:
    return _datagram(wire.pack_data, SPORT, opcode, QP, psn, MSG, TX_NS, 3, flags, payload, dma_len=dma_len)


@pytest.mark.parametrize("opcode", DATA_OPS)
def test_data_packet_decodes_in_scapy(opcode):
    pkt = _ip(_data(opcode, psn=(1 << 24) + 77, flags=wire.FLAG_RETX))
    assert pkt[UDP].sport == SPORT and pkt[UDP].dport == wire.ROCE_PORT
    assert pkt[UDP].len == len(_data(opcode))
    bth = pkt[BTH]
    assert (bth.opcode, bth.dqpn, bth.psn, bth.ackreq, bth.becn) == (opcode, QP, 77, 1, 0)
    assert (RETH in pkt) == (opcode in wire.RETH_OPS)
    if RETH in pkt:
        assert pkt[RETH].dma_len == 4096
    ext = pkt[MPFTX]
    assert (ext.magic, ext.msg_id, ext.tx_ns, ext.plane, ext.flags) == (wire.MAGIC, MSG, TX_NS, 3, wire.FLAG_RETX)
    assert len(ext[Raw].load) == 100


@pytest.mark.parametrize("opcode", DATA_OPS)
def test_data_packet_round_trips_through_parsed(opcode):
    p = wire.Parsed(_data(opcode, psn=(1 << 24) + 77, payload=1234, flags=wire.FLAG_RETX)[wire.UDP_HDR.size:])
    assert (p.opcode, p.dqpn, p.psn, p.msg_id, p.tx_ns, p.plane, p.flags, p.payload_len) == (
        opcode, QP, 77, MSG, TX_NS, 3, wire.FLAG_RETX, 1234)
    assert p.dma_len == (4096 if opcode in wire.RETH_OPS else 0)


def test_struct_codec_and_scapy_layers_build_the_same_bytes():
    payload = bytes(range(10))
    buf = bytearray(200)
    n = wire.pack_data(buf, SPORT, wire.WRITE_FIRST, QP, 5, MSG, TX_NS, 2, 0, len(payload), dma_len=1000)
    buf[n - 4 - len(payload):n - 4] = payload
    layered = (UDP(sport=SPORT, dport=wire.ROCE_PORT, chksum=0) / BTH(opcode=wire.WRITE_FIRST, dqpn=QP, psn=5,
               ackreq=1, icrc=0) / RETH(rkey=0x1000 + QP, dma_len=1000) / MPFTX(plane=2, msg_id=MSG, tx_ns=TX_NS)
               / Raw(payload))
    assert bytes(layered) == bytes(buf[:n])


def test_ack_with_sack_and_dup_flag_decodes():
    sack = (1 << 63) | (1 << 5) | (1 << 1)
    datagram = _datagram(wire.pack_ack, SPORT, QP, (1 << 24) + 9, 17, 111, 222, sack, wire.FLAG_DUP | wire.FLAG_CE,
                         4)
    assert len(datagram) == wire.ACK_LEN
    pkt = _ip(datagram)
    assert (pkt[BTH].opcode, pkt[BTH].dqpn, pkt[BTH].psn, pkt[BTH].becn) == (wire.ACK, QP, 9, 0)
    assert (pkt[AETH].syndrome, pkt[AETH].msn) == (0, 17)
    ext = pkt[MPFTX]
    assert (ext.sack, ext.echo_ns, ext.tx_ns, ext.plane) == (sack, 111, 222, 4)
    assert ext.flags & wire.FLAG_DUP and ext.flags & wire.FLAG_CE and not ext.flags & wire.FLAG_RETX
    p = wire.Parsed(datagram[wire.UDP_HDR.size:])
    assert (p.opcode, p.dqpn, p.psn, p.sack, p.echo_ns, p.tx_ns, p.flags, p.plane, p.payload_len) == (
        wire.ACK, QP, 9, sack, 111, 222, wire.FLAG_DUP | wire.FLAG_CE, 4, 0)


def test_an_ack_carries_the_receivers_hold_time_where_data_has_its_message_id():
    """Named for what it carries, in scapy and in Parsed; the bytes are where a data packet's message id is."""
    datagram = _datagram(wire.pack_ack, SPORT, QP, 9, 0, 111, 222, 0, 0, 1, wire.ACK, 7_500_000)
    p = wire.Parsed(datagram[wire.UDP_HDR.size:])
    assert _ip(datagram)[MPFTX].hold_ns == p.hold_ns == 7_500_000 and p.msg_id == 0
    assert "msg_id" not in _ip(datagram)[MPFTX].fields and "hold_ns" not in _ip(_data(wire.SEND_ONLY))[MPFTX].fields
    long_hold = _datagram(wire.pack_ack, SPORT, QP, 9, 0, 111, 222, 0, 0, 1, wire.ACK, 10 ** 10)
    assert wire.Parsed(long_hold[wire.UDP_HDR.size:]).hold_ns == 0xFFFFFFFF  # held over 4.3 s: the most it says


def test_cnp_sets_becn():
    datagram = _datagram(wire.pack_ack, SPORT, QP, 9, 0, 0, 222, 0, 0, 1, wire.CNP)
    pkt = _ip(datagram)
    assert (pkt[BTH].opcode, pkt[BTH].becn, pkt[BTH].fecn, pkt[BTH].dqpn) == (wire.CNP, 1, 0, QP)
    p = wire.Parsed(datagram[wire.UDP_HDR.size:])
    assert (p.opcode, p.dqpn) == (wire.CNP, QP)
    ack = _ip(_datagram(wire.pack_ack, SPORT, QP, 9, 0, 0, 222, 0, 0, 1))
    assert ack[BTH].becn == 0


@pytest.mark.parametrize("opcode", [wire.PULL_REQUEST, wire.PULL_GRANT])
def test_pull_control_packets_decode_with_their_count(opcode):
    """cc pull's request and grant: ACK-shaped, in the manufacturer-specific opcode range, the count where an ACK has
    its selective acks (the same bytes)."""
    datagram = _datagram(wire.pack_pull, SPORT, QP, 1234, TX_NS, 2, opcode)
    assert datagram == _datagram(wire.pack_ack, SPORT, QP, 0, 0, 0, TX_NS, 1234, 0, 2, opcode)
    pkt = _ip(datagram)
    assert 0xC0 <= pkt[BTH].opcode == opcode <= 0xFF and pkt[BTH].dqpn == QP
    assert AETH in pkt and (pkt[MPFTX].magic, pkt[MPFTX].count, pkt[MPFTX].tx_ns) == (wire.MAGIC, 1234, TX_NS)
    assert "sack" not in pkt[MPFTX].fields
    p = wire.Parsed(datagram[wire.UDP_HDR.size:])
    assert (p.opcode, p.dqpn, p.count, p.sack, p.tx_ns, p.payload_len) == (opcode, QP, 1234, 0, TX_NS, 0)


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_first_packet_of_a_full_payload_fills_the_mtu(mtu):
    payload = wire.payload_per_packet(mtu)
    for op in ("write", "send"):
        first = _ip(_data(wire.data_opcode(op, first=True, last=False), payload=payload))
        middle = _ip(_data(wire.data_opcode(op, first=False, last=False), payload=payload))
        assert len(bytes(first)) <= mtu and len(bytes(middle)) <= mtu
    assert len(bytes(_ip(_data(wire.WRITE_FIRST, payload=payload)))) == mtu
    assert _ip(_data(wire.WRITE_FIRST, payload=payload))[IP].len == mtu


@pytest.mark.parametrize(("op", "first", "last", "opcode"), [
    ("write", True, True, wire.WRITE_ONLY), ("write", True, False, wire.WRITE_FIRST),
    ("write", False, False, wire.WRITE_MIDDLE), ("write", False, True, wire.WRITE_LAST),
    ("send", True, True, wire.SEND_ONLY), ("send", True, False, wire.SEND_FIRST),
    ("send", False, False, wire.SEND_MIDDLE), ("send", False, True, wire.SEND_LAST)])
def test_data_opcode(op, first, last, opcode):
    assert wire.data_opcode(op, first, last) == opcode
    assert (opcode in wire.FIRST_OPS, opcode in wire.LAST_OPS) == (first, last)


def test_parsed_rejects_foreign_datagrams():
    datagram = bytearray(_data(wire.WRITE_MIDDLE)[wire.UDP_HDR.size:])
    datagram[wire.BTH_HDR.size] ^= 0xFF  # the magic
    with pytest.raises(ValueError):
        wire.Parsed(bytes(datagram))


@given(near=st.integers(-1, 1 << 40), delta=st.integers(-(1 << 23), (1 << 23) - 1))
def test_unwrap_psn_recovers_the_full_psn_nearest_to_the_reference(near, delta):
    full = near + delta
    assert wire.unwrap_psn(full & wire.PSN_MASK, near) == full


@given(wire_psn=st.integers(0, wire.PSN_MASK), near=st.integers(-1, 1 << 40))
def test_unwrap_psn_is_consistent_with_the_wire_value(wire_psn, near):
    full = wire.unwrap_psn(wire_psn, near)
    assert full & wire.PSN_MASK == wire_psn
    assert -(1 << 23) <= full - near < 1 << 23


def test_unwrap_psn_across_the_wrap():
    assert wire.unwrap_psn(2, wire.PSN_MASK - 1) == wire.PSN_MASK + 3
    assert wire.unwrap_psn(wire.PSN_MASK, 1 << 24) == (1 << 24) - 1
    assert wire.unwrap_psn(wire.PSN_MASK, -1) == -1
