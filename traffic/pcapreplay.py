"""Replay a pcap onto emulated hosts: timing kept, addresses remapped onto the hosts of one fabric plane.

Two halves. `plan()` reads the pcap and rewrites the frames each host will send (pure, no root, unit-tested);
`replay()` runs inside one emulated host and sends that host's frames on schedule through a raw socket:

    python -m traffic.pcapreplay plan --pcap trace.pcap --fabric model.json --out plan.json
    python -m traffic.pcapreplay send --plan plan.json --host n0g0 --ifname n0g0-eth0 --start MONOTONIC_S

Input: classic pcap (either byte order, µs or ns timestamps) or pcapng (Wireshark's default; its blocks read by
scapy's raw reader), link type Ethernet.

What is replayed: unicast IPv4 frames. 802.1Q/802.1ad tags are removed (the fabric has no VLANs and the switches
match untagged IPv4); an Ethernet trailer after the IPv4 packet is cut, since a Linux host would not send one.
Everything else is counted under a skip reason:
  arp, ipv6, mpls, loopback (0x9000), ethertype 0xNNNN   other EtherTypes
  802.3 frame             a length field instead of an EtherType (LLC frames)
  runt frame              shorter than an Ethernet header
  multicast/broadcast     group bit in the destination MAC (all IPv4 multicast and broadcast carries it)
  non-unicast address     an address in 0/8, 127/8, 224/4 or 240/4 in a unicast frame: no host to map it to
  malformed ipv4          bad version or header length, or a total length the capture cannot hold
  ip fragment             a fragment's transport checksum covers the whole datagram, so it cannot be rewritten
  snapped                 captured shorter than on the wire (caplen < wirelen); see `snapped` below
  over mtu                the IPv4 packet exceeds the fabric MTU: a host could not send it
  same host               source and destination addresses map to the same host

Address map: the distinct addresses of replayable packets, in order of first appearance (source before
destination), go to the hosts of one plane in `fabric.hosts(plane=plane)` order (in mpft: n0g0, n1g0, ... on
plane 0), wrapping round when there are more addresses than hosts; the same pcap and fabric give the same map.
One plane, because a raw frame bypasses the kernel's routing: a frame for a GPU on another plane would need
the PXN hop through a same-node GPU, which forwards only packets addressed to its own MAC (see below). To load
every plane, plan the pcap once per plane and replay the plans together.

Rewriting: source MAC and IP become the source host's, destination IP the destination host's, and the IPv4 header
checksum and TCP/UDP checksums are recomputed (a UDP checksum of 0, "none", stays 0). The destination MAC is
REPLAY_MAC, which no host owns: switches forward by IPv4 destination, so the frame crosses the fabric as the
original would, but the receiving kernel marks it PACKET_OTHERHOST and drops it before IP. Replayed packets
therefore never reach a socket and never provoke TCP resets or ICMP errors, yet captures on the fabric see them.

Timing: each frame's offset is its timestamp minus that of the first kept frame, in integer nanoseconds. A
timestamp earlier than the previous kept frame's is raised to it, so every host's schedule is non-decreasing.

Plan file (JSON): `Plan.to_dict()` (source, counts, address map, frames per host) plus "format" and
"frames": {host: [[offset_ns, base64 frame], ...]}.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import statistics
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator.model.errors import UserError, load_json, read_file

if TYPE_CHECKING:  # the sender starts 0.5 s before its first frame: no networkx import for it
    from emulator.model.fabric import Fabric

PLAN_FORMAT = "mpft-pcapreplay/1"
REPLAY_MAC = bytes.fromhex("02ffffffffff")  # locally administered; host MACs are 02:00:<IPv4 address>
SNAPPED = ("skip", "trim", "pad")

_MAGICS = {b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),  # µs timestamps
           b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1)}         # ns timestamps
_PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
_LINKTYPE_ETHERNET = 1
_VLAN_TPIDS = (0x8100, 0x88A8)
_ETHERTYPES = {0x0806: "arp", 0x86DD: "ipv6", 0x8847: "mpls", 0x8848: "mpls", 0x9000: "loopback"}
_CHECKSUM_AT = {6: 16, 17: 6}  # TCP, UDP: offset of the checksum in the transport header


class _Skip(Exception):
    """A frame that is not replayed; the message is the skip reason."""


@dataclass
class Plan:
    """What each source host sends, as (ns after the first kept frame, frame) in time order, and why the rest
    of the pcap is not sent."""

    source: str
    read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    addresses: dict[str, str] = field(default_factory=dict)  # pcap IPv4 address -> host
    frames: dict[str, list[tuple[int, bytes]]] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return sum(len(f) for f in self.frames.values())

    def to_dict(self) -> dict[str, Any]:
        """Summary for JSON reports (no frame bytes)."""
        return {"source": self.source, "read": self.read, "kept": self.kept,
                "skipped": dict(sorted(self.skipped.items())),
                "duration_s": max((f[-1][0] for f in self.frames.values()), default=0) / 1e9,
                "addresses": self.addresses, "hosts": {h: len(f) for h, f in self.frames.items()}}

    def save(self, path: Path) -> None:
        frames = {h: [[t, base64.b64encode(f).decode()] for t, f in fr] for h, fr in self.frames.items()}
        try:
            Path(path).write_text(json.dumps({"format": PLAN_FORMAT, **self.to_dict(), "frames": frames}))
        except OSError as exc:
            raise UserError(f"cannot write the plan: {exc.strerror}", file=str(path)) from None

    @classmethod
    def load(cls, path: Path) -> Plan:
        data = load_json(path, "replay plan")
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise UserError(f"not a pcap replay plan (expected format {PLAN_FORMAT!r})", file=str(path))
        try:
            frames = {h: [(int(t), base64.b64decode(f, validate=True)) for t, f in fr]
                      for h, fr in data["frames"].items()}
            return cls(str(data["source"]), int(data["read"]), Counter(data["skipped"]), dict(data["addresses"]),
                       frames)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"malformed replay plan: {exc}", file=str(path)) from None

    def host_frames(self, host: str) -> list[tuple[int, bytes]]:
        """One host's schedule; a host that sends nothing is an error, since only source hosts run a sender."""
        if host not in self.frames:
            raise UserError(f"{host!r} sends nothing in this plan (senders: {', '.join(self.frames)})",
                            field="host")
        return self.frames[host]


def _pcapng_records(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(timestamp ns, original length, captured bytes) of each packet of a pcapng file."""
    from scapy.error import Scapy_Exception
    from scapy.utils import RawPcapNgReader

    number = 0
    try:
        with RawPcapNgReader(str(path)) as reader:
            for body, meta in reader:
                number += 1
                if meta.linktype != _LINKTYPE_ETHERNET:
                    raise UserError(f"packet {number}: link type {meta.linktype} is not Ethernet "
                                    f"({_LINKTYPE_ETHERNET})", file=str(path))
                ticks = (meta.tshigh << 32) | meta.tslow
                yield ticks * 1_000_000_000 // meta.tsresol, meta.wirelen or len(body), body
    except (Scapy_Exception, EOFError, struct.error, OSError) as exc:
        raise UserError(f"packet {number + 1}: unreadable pcapng ({exc or type(exc).__name__})",
                        file=str(path)) from None


def _records(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """(timestamp ns, original length, captured bytes) of each record of a classic pcap or pcapng file."""
    data = read_file(path, "pcap", binary=True)
    magic = data[:4]
    if magic == _PCAPNG_MAGIC:
        yield from _pcapng_records(path)
        return
    if magic not in _MAGICS:
        raise UserError(f"not a pcap file (magic {magic.hex() or 'missing'})", file=str(path))
    if len(data) < 24:
        raise UserError(f"truncated pcap file header ({len(data)} of 24 bytes)", file=str(path))
    endian, ns_per_tick = _MAGICS[magic]
    linktype = struct.unpack_from(endian + "I", data, 20)[0]
    if linktype != _LINKTYPE_ETHERNET:
        raise UserError(f"link type {linktype} is not Ethernet ({_LINKTYPE_ETHERNET})", file=str(path))
    header = struct.Struct(endian + "IIII")
    offset, number = 24, 0
    while offset < len(data):
        number += 1
        where = f"record {number} at byte {offset}"
        if offset + header.size > len(data):
            raise UserError(f"{where}: truncated record header ({len(data) - offset} of 16 bytes)", file=str(path))
        sec, frac, caplen, wirelen = header.unpack_from(data, offset)
        offset += header.size
        body = data[offset:offset + caplen]
        if len(body) < caplen:
            raise UserError(f"{where}: truncated record ({len(body)} of {caplen} captured bytes)", file=str(path))
        offset += caplen
        yield sec * 1_000_000_000 + frac * ns_per_tick, wirelen, body


def _unicast(address: bytes) -> bool:
    return address[0] not in (0, 127) and address[0] < 224


def _ipv4(frame: bytes, wirelen: int, snapped: str, mtu: int) -> bytearray:
    """The unicast IPv4 packet in an Ethernet frame, tags and trailer removed; raises _Skip with the reason."""
    if len(frame) < 14:
        raise _Skip("runt frame")
    offset = 12
    ethertype = int.from_bytes(frame[12:14], "big")
    while ethertype in _VLAN_TPIDS and len(frame) >= offset + 6:
        offset += 4
        ethertype = int.from_bytes(frame[offset:offset + 2], "big")
    if ethertype < 0x0600:
        raise _Skip("802.3 frame")
    if ethertype != 0x0800:
        raise _Skip(_ETHERTYPES.get(ethertype, f"ethertype 0x{ethertype:04x}"))
    if frame[0] & 1:
        raise _Skip("multicast/broadcast")
    packet = bytearray(frame[offset + 2:])
    cut = len(frame) < wirelen
    if cut and snapped == "skip":
        raise _Skip("snapped")
    if len(packet) < 20 or packet[0] >> 4 != 4 or not 20 <= (ihl := (packet[0] & 0x0F) * 4) <= len(packet):
        raise _Skip("snapped" if cut else "malformed ipv4")
    total = int.from_bytes(packet[2:4], "big")
    if total < ihl or (total > len(packet) and not cut):
        raise _Skip("malformed ipv4")
    if not _unicast(packet[12:16]) or not _unicast(packet[16:20]):
        raise _Skip("non-unicast address")
    if packet[6] & 0x20 or (packet[6] & 0x1F) or packet[7]:
        raise _Skip("ip fragment")
    if snapped == "trim":
        total = min(total, len(packet))
    if total > mtu:
        raise _Skip("over mtu")
    del packet[total:]
    packet.extend(bytes(total - len(packet)))  # snapped == "pad": zeros where the capture stopped
    packet[2:4] = total.to_bytes(2, "big")
    return packet


def _checksum(data: bytes | bytearray) -> int:
    """Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data = bytes(data) + b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _rewrite(packet: bytearray, src_ip: bytes, dst_ip: bytes) -> None:
    """Put the hosts' addresses into an IPv4 packet and make its header and TCP/UDP checksums valid again."""
    ihl = (packet[0] & 0x0F) * 4
    packet[12:16], packet[16:20] = src_ip, dst_ip
    packet[10:12] = b"\0\0"
    packet[10:12] = _checksum(packet[:ihl]).to_bytes(2, "big")
    proto, segment = packet[9], len(packet) - ihl
    at = _CHECKSUM_AT.get(proto)
    if at is None or segment < at + 2:
        return
    if proto == 17:
        if segment >= 8:
            packet[ihl + 4:ihl + 6] = segment.to_bytes(2, "big")  # "trim" may have shortened the datagram
        if packet[ihl + 6:ihl + 8] == b"\0\0":
            return
    at += ihl
    packet[at:at + 2] = b"\0\0"
    value = _checksum(bytes(packet[12:20]) + bytes((0, proto)) + segment.to_bytes(2, "big") + packet[ihl:])
    if proto == 17 and value == 0:
        value = 0xFFFF  # a computed 0 is sent as 0xFFFF in UDP, where 0 means "no checksum"
    packet[at:at + 2] = value.to_bytes(2, "big")


def plan(path: Path, fabric: Fabric, plane: int = 0, snapped: str = "skip") -> Plan:
    """Read a pcap and plan its replay onto the hosts of one plane of `fabric` (the module docstring says what
    is kept and how it is mapped).

    `snapped` says what to do with frames captured shorter than they were sent: "skip" them, "trim" the packet
    to what was captured (fixing the lengths and checksums), or "pad" it back to its length with zeros, which
    keeps the bytes on the wire of header-only traces.
    """
    if snapped not in SNAPPED:
        raise UserError(f"must be one of {', '.join(SNAPPED)}, got {snapped!r}", field="snapped")
    hosts = fabric.hosts(plane=plane)
    if not hosts:
        raise UserError(f"no hosts on plane {plane} (planes: {fabric.planes})", field="plane")
    result = Plan(source=str(path))

    def host_of(address: bytearray) -> str:
        return result.addresses.setdefault(socket.inet_ntoa(address), hosts[len(result.addresses) % len(hosts)])

    first, offset = None, 0
    for ts, wirelen, frame in _records(path):
        result.read += 1
        try:
            packet = _ipv4(frame, wirelen, snapped, fabric.mtu)
            src, dst = host_of(packet[12:16]), host_of(packet[16:20])
            if src == dst:
                raise _Skip("same host")
        except _Skip as skip:
            result.skipped[str(skip)] += 1
            continue
        first = ts if first is None else first
        offset = max(ts - first, offset)
        _rewrite(packet, socket.inet_aton(fabric.ip(src)), socket.inet_aton(fabric.ip(dst)))
        mac = bytes.fromhex(fabric.node(src)["mac"].replace(":", ""))
        result.frames.setdefault(src, []).append((offset, REPLAY_MAC + mac + b"\x08\x00" + bytes(packet)))
    return result


def replay(frames: list[tuple[int, bytes]], ifname: str, t0: float) -> dict[str, Any]:
    """Send each frame at t0 + its offset (time.monotonic() seconds, shared by all hosts of the machine) through
    an AF_PACKET socket on `ifname`; report how late the sends were.

    Plain sleeps, no spinning: the CPU is better left to ovs-vswitchd, and the lag stats show what that costs.
    A send the kernel refuses (a full interface queue) is counted and the schedule goes on.
    """
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)  # protocol 0: send only, receives nothing
        sock.bind((ifname, 0))
    except OSError as exc:
        raise UserError(f"cannot send on interface {ifname!r}: {exc.strerror}", field="ifname") from None
    lags, failed = [], 0
    with sock:
        for offset_ns, frame in frames:
            due = t0 + offset_ns / 1e9
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            lags.append(max(0.0, time.monotonic() - due))
            try:
                sock.send(frame)
            except OSError:
                failed += 1
    return {"sent": len(frames) - failed, "failed": failed,
            "lag_median_s": statistics.median(lags) if lags else 0.0, "lag_max_s": max(lags, default=0.0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m traffic.pcapreplay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("plan", help="read a pcap and write the replay plan")
    p.add_argument("--pcap", type=Path, required=True)
    p.add_argument("--fabric", type=Path, required=True, help="fabric model JSON (mpft topo --save)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--plane", type=int, default=0, help="plane whose hosts the addresses map onto")
    p.add_argument("--snapped", choices=SNAPPED, default="skip", help="frames captured shorter than sent")
    p = sub.add_parser("send", help="send one host's frames (inside the emulated host)")
    p.add_argument("--plan", type=Path, required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--ifname", required=True)
    p.add_argument("--start", type=float, required=True, help="shared start, a time.monotonic() value")
    args = parser.parse_args(argv)
    try:
        if args.mode == "plan":
            from emulator.model.fabric import Fabric

            result = plan(args.pcap, Fabric.load(args.fabric), args.plane, args.snapped)
            result.save(args.out)
            print(json.dumps(result.to_dict()))
        else:
            frames = Plan.load(args.plan).host_frames(args.host)
            print(json.dumps(replay(frames, args.ifname, args.start)))
    except UserError as exc:
        print(f"pcapreplay: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
