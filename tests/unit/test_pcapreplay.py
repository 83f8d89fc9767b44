"""pcap replay planning: the two real pcaps plan with the counts SOURCES.md gives, kept frames match an
independent scapy rewrite (addresses, checksums, timing), odd frames are skipped by reason, and a bad or cut
file is a UserError naming the file and the record, whatever its bytes."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP, UDP, in4_chksum
from scapy.layers.l2 import Dot1Q, Ether
from scapy.utils import checksum, rdpcap

from emulator.model.errors import UserError
from emulator.model.topologies import build
from tests.traces import TRACES
from traffic import pcapreplay
from traffic.pcapreplay import REPLAY_MAC, Plan, plan

ZEEK, TCPREPLAY = TRACES / "zeek_wikipedia.pcap", TRACES / "tcpreplay_test.pcap"
EXPECTED = {  # SOURCES.md section 2: everything but unicast IPv4 is skipped
    ZEEK: (136, 106, {"arp": 6, "ipv6": 5, "802.3 frame": 4,
                      "multicast/broadcast": 15}),  # mDNS 3, LLMNR 4, NBNS broadcast 8
    TCPREPLAY: (179, 146, {"mpls": 16, "ipv6": 10, "arp": 1, "802.3 frame": 1, "loopback": 1,
                           "multicast/broadcast": 4}),  # IGMP 3, EIGRP 1
}
LE_US = b"\xd4\xc3\xb2\xa1"
MAGICS = {LE_US: "<", b"\xa1\xb2\xc3\xd4": ">", b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}
HOST_A, HOST_B = "02:00:00:00:00:0a", "02:00:00:00:00:0b"


def _trace(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} not present (shared trace data)")
    return path


def _write_pcap(path: Path, records, magic: bytes = LE_US, linktype: int = 1) -> Path:
    """records: (seconds, fraction, frame bytes[, wire length]) in the magic's byte order and unit."""
    e = MAGICS[magic]
    out = [magic, struct.pack(e + "HHiIII", 2, 4, 0, 0, 65535, linktype)]
    for sec, frac, frame, *wirelen in records:
        out += [struct.pack(e + "IIII", sec, frac, len(frame), wirelen[0] if wirelen else len(frame)), frame]
    path.write_bytes(b"".join(out))
    return path


def _udp(src="192.0.2.1", dst="192.0.2.2", payload=b"x" * 100, mac_dst=HOST_B) -> bytes:
    return bytes(Ether(src=HOST_A, dst=mac_dst) / IP(src=src, dst=dst) / UDP(sport=1000, dport=2000) / payload)


def _checksums_valid(frame: bytes) -> bool:
    """scapy's checksums over the IPv4 header and over the TCP/UDP segment, stored checksums included, are 0.
    (Summing the bytes, not rebuilding with scapy: a rebuild rewrites malformed headers the fuzz test makes.)"""
    packet, proto = frame[14:], frame[23]
    ihl = (packet[0] & 0x0F) * 4
    if checksum(packet[:ihl]) != 0:
        return False
    segment = packet[ihl:]
    if proto not in (6, 17) or len(segment) < (18 if proto == 6 else 8) or proto == 17 and segment[6:8] == b"\0\0":
        return True
    return in4_chksum(proto, Ether(frame)[IP], segment) == 0


@pytest.fixture(scope="module")
def fabric():
    return build("mpft", planes=2, nodes=16)


def _oracle(path: Path, fabric) -> Counter:
    """Each kept frame as (host, offset ns, bytes), rewritten by scapy from the module docstring's rules."""
    hosts, addresses, expected, t0 = fabric.hosts(plane=0), {}, Counter(), None
    for p in rdpcap(str(path)):
        if Ether not in p or p.type != 0x0800 or int(p.dst[:2], 16) & 1:  # Dot3: 802.3 frames
            continue
        ip = p[IP]
        src, dst = (addresses.setdefault(a, hosts[len(addresses) % len(hosts)]) for a in (ip.src, ip.dst))
        t0 = p.time if t0 is None else t0
        ip.src, ip.dst = fabric.ip(src), fabric.ip(dst)
        del ip.chksum
        if type(ip.payload) in (TCP, UDP) and ip.payload.chksum != 0:
            del ip.payload.chksum
        p[Ether].src, p[Ether].dst = fabric.node(src)["mac"], REPLAY_MAC.hex(":")
        expected[src, int((p.time - t0) * 10**9), bytes(p)[:14 + ip.len]] += 1
    return expected


# -- the real pcaps ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [ZEEK, TCPREPLAY], ids=["zeek", "tcpreplay"])
def test_real_pcap_counts(path, fabric):
    result = plan(_trace(path), fabric)
    read, kept, skipped = EXPECTED[path]
    assert (result.read, result.kept, dict(result.skipped)) == (read, kept, skipped)
    assert result.read == result.kept + sum(result.skipped.values())


@pytest.mark.parametrize("path", [ZEEK, TCPREPLAY], ids=["zeek", "tcpreplay"])
def test_real_pcap_frames_match_scapy_rewrite(path, fabric):
    result = plan(_trace(path), fabric)
    got = Counter((h, t, f) for h, frames in result.frames.items() for t, f in frames)
    assert got == _oracle(path, fabric)
    assert all(_checksums_valid(f) for _, _, f in got)
    assert all(len(f) == 14 + Ether(f)[IP].len for _, _, f in got)  # e.g. tcpreplay record 12's trailer is cut


@pytest.mark.parametrize("path", [ZEEK, TCPREPLAY], ids=["zeek", "tcpreplay"])
def test_a_pcapng_of_the_same_trace_plans_the_same_replay(path, fabric, tmp_path):
    """Wireshark's format, written by Wireshark's own editcap (not by us): the same frames at the same times."""
    if shutil.which("editcap") is None:
        pytest.skip("editcap (Wireshark) not installed")
    ng = tmp_path / "trace.pcapng"
    subprocess.run(["editcap", "-F", "pcapng", str(_trace(path)), str(ng)], check=True)
    assert ng.read_bytes()[:4] == b"\x0a\x0d\x0d\x0a"
    classic, converted = plan(path, fabric), plan(ng, fabric)
    assert (converted.read, converted.skipped, converted.addresses) == (classic.read, classic.skipped,
                                                                         classic.addresses)
    assert converted.frames == classic.frames


@pytest.mark.parametrize("path", [ZEEK, TCPREPLAY], ids=["zeek", "tcpreplay"])
def test_real_pcap_addresses_and_timing(path, fabric):
    result = plan(_trace(path), fabric)
    hosts = fabric.hosts(plane=0)
    assert list(result.addresses.values()) == hosts[:len(result.addresses)]  # first appearance, no wrap
    owned = {rec["mac"] for h in fabric.hosts() for rec in fabric.node(h)["ports"].values()}
    assert REPLAY_MAC.hex(":") not in owned
    for host, frames in result.frames.items():
        offsets = [t for t, _ in frames]
        assert offsets == sorted(offsets)
        for _, frame in frames:
            pkt = Ether(frame)
            assert (pkt.src, pkt[IP].src, pkt.dst) == (fabric.node(host)["mac"], fabric.ip(host), "02:ff:ff:ff:ff:ff")
            assert pkt[IP].dst in {fabric.ip(h) for h in result.addresses.values()} - {fabric.ip(host)}
    assert min(frames[0][0] for frames in result.frames.values()) == 0
    assert plan(path, fabric) == result
    assert set(plan(path, fabric, plane=1).addresses.values()) <= set(fabric.hosts(plane=1))
    json.dumps(result.to_dict())


def test_more_addresses_than_hosts_wrap_and_same_host_is_skipped():
    small = build("mpft", planes=1, nodes=4)
    result = plan(_trace(ZEEK), small)
    hosts = small.hosts(plane=0)
    assert list(result.addresses.values()) == [hosts[i % 4] for i in range(len(result.addresses))]
    pairs = {frozenset((a, b)) for a in result.addresses for b in result.addresses
             if a != b and result.addresses[a] == result.addresses[b]}
    same = sum(1 for p in rdpcap(str(ZEEK)) if IP in p and frozenset((p[IP].src, p[IP].dst)) in pairs)
    assert same and result.skipped["same host"] == same
    assert result.kept == EXPECTED[ZEEK][1] - same
    assert all(Ether(f)[IP].dst != small.ip(h) for h, frames in result.frames.items() for _, f in frames)


def test_frames_over_the_mtu_are_skipped():
    small = build("mpft", planes=2, nodes=16, mtu=576)
    over = sum(1 for p in rdpcap(str(_trace(ZEEK))) if IP in p and p[IP].len > 576 and p[Ether].dst[:2] != "01")
    result = plan(ZEEK, small)
    assert over and result.skipped["over mtu"] == over
    assert max(len(f) for frames in result.frames.values() for _, f in frames) <= 576 + 14


# -- synthetic frames --------------------------------------------------------------------------------------
@pytest.mark.parametrize("magic", list(MAGICS))
def test_byte_orders_and_nanosecond_timestamps(tmp_path, fabric, magic):
    scale = 1000 if magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d") else 1  # these count ns, not µs
    records = [(10, 999_000 * scale, _udp()), (11, 1_000 * scale, _udp("192.0.2.2", "192.0.2.1"))]
    result = plan(_write_pcap(tmp_path / "t.pcap", records, magic), fabric)
    assert [t for frames in result.frames.values() for t, _ in frames] == [0, 2_000_000]
    assert list(result.addresses) == ["192.0.2.1", "192.0.2.2"]


def test_timestamps_going_back_are_raised_to_the_previous(tmp_path, fabric):
    records = [(5, 0, _udp()), (4, 0, _udp()), (5, 500_000, _udp()), (7, 0, _udp())]
    result = plan(_write_pcap(tmp_path / "t.pcap", records), fabric)
    assert [t for t, _ in result.frames["n0g0"]] == [0, 0, 500_000_000, 2_000_000_000]


def test_udp_checksums(tmp_path, fabric):
    """A computed 0 goes out as 0xFFFF (0 means "none"), and a sender's "none" stays 0."""
    a, b = fabric.hosts(plane=0)[:2]
    word = IP(bytes(IP(src=fabric.ip(a), dst=fabric.ip(b)) / UDP(sport=1000, dport=2000) / b"\0\0"))[UDP].chksum
    nought = bytearray(_udp())
    nought[40:42] = b"\0\0"
    records = [(1, 0, _udp(payload=word.to_bytes(2, "big"))), (1, 1, bytes(nought))]
    result = plan(_write_pcap(tmp_path / "t.pcap", records), fabric)
    assert [Ether(f)[UDP].chksum for _, f in result.frames[a]] == [0xFFFF, 0]


def test_odd_frames_each_have_their_reason(tmp_path, fabric):
    tagged = bytes(Ether(src=HOST_A, dst=HOST_B) / Dot1Q(vlan=7) / IP(src="192.0.2.1", dst="192.0.2.2") / UDP())
    fragment = bytes(Ether(src=HOST_A, dst=HOST_B) / IP(src="192.0.2.1", dst="192.0.2.2", flags="MF") / UDP())
    bad_version = bytearray(_udp())
    bad_version[14] = 0x65
    frames = [tagged, fragment, bytes(bad_version), _udp()[:30], b"\x02" * 10,
              _udp(src="0.0.0.0"), _udp(dst="127.0.0.1"), _udp(mac_dst="ff:ff:ff:ff:ff:ff"),
              bytes(Ether(src=HOST_A, dst=HOST_B, type=0x88CC) / b"lldp"), _udp(), _udp("192.0.2.2", "192.0.2.1")]
    result = plan(_write_pcap(tmp_path / "t.pcap", [(1, i, f) for i, f in enumerate(frames)]), fabric)
    assert dict(result.skipped) == {"ip fragment": 1, "malformed ipv4": 2, "runt frame": 1,
                                    "non-unicast address": 2, "multicast/broadcast": 1, "ethertype 0x88cc": 1}
    assert result.kept == 3
    untagged = result.frames[fabric.hosts(plane=0)[0]][0][1]
    assert Dot1Q not in Ether(untagged) and _checksums_valid(untagged)


@pytest.mark.parametrize("mode", ["skip", "trim", "pad"])
def test_snapped_frames(tmp_path, fabric, mode):
    full = _udp()
    result = plan(_write_pcap(tmp_path / "t.pcap", [(1, 0, full[:72], len(full))]), fabric, snapped=mode)
    if mode == "skip":
        assert (result.kept, dict(result.skipped)) == (0, {"snapped": 1})
        return
    [(_, frame)] = next(iter(result.frames.values()))
    assert _checksums_valid(frame)
    pkt = Ether(frame)
    if mode == "trim":
        assert (len(frame), pkt[IP].len, pkt[UDP].len) == (72, 58, 38)
    else:
        assert (len(frame), bytes(pkt[UDP].payload)) == (len(full), b"x" * 30 + bytes(70))


def test_bad_parameters(fabric):
    with pytest.raises(UserError, match="plane"):
        plan(_trace(ZEEK), fabric, plane=5)
    with pytest.raises(UserError, match="snapped"):
        plan(ZEEK, fabric, snapped="guess")


# -- bad files ---------------------------------------------------------------------------------------------
def _record_offsets(data: bytes) -> list[int]:
    offsets, offset = [], 24
    while offset < len(data):
        offsets.append(offset)
        offset += 16 + struct.unpack_from("<I", data, offset + 8)[0]
    return offsets


@pytest.mark.parametrize("cut, message", [(10, "record 1 at byte 24: truncated record header"),
                                          (4, "record 5 at byte {}: truncated record header"),
                                          (30, "record 5 at byte {}: truncated record \\(")])
def test_cut_pcap_names_file_and_record(tmp_path, fabric, cut, message):
    data = _trace(ZEEK).read_bytes()
    offset = _record_offsets(data)[4]
    path = tmp_path / "cut.pcap"
    path.write_bytes(data[:24 + cut] if cut == 10 else data[:offset + cut])
    with pytest.raises(UserError, match=message.format(offset)) as err:
        plan(path, fabric)
    assert err.value.file == str(path) and str(err.value).startswith(str(path))


@pytest.mark.parametrize("data, message", [
    (b"", "not a pcap file \\(magic missing\\)"),
    (b"GIF89a" + bytes(30), "not a pcap file \\(magic 47494638\\)"),
    (b"\x0a\x0d\x0d\x0a" + bytes(40), "packet 1: unreadable pcapng"),
    (LE_US + bytes(10), "truncated pcap file header"),
    (LE_US + struct.pack("<HHiIII", 2, 4, 0, 0, 65535, 101), "link type 101 is not Ethernet"),
])
def test_bad_files(tmp_path, fabric, data, message):
    path = tmp_path / "bad.pcap"
    path.write_bytes(data)
    with pytest.raises(UserError, match=message) as err:
        plan(path, fabric)
    assert err.value.file == str(path)
    with pytest.raises(UserError, match="cannot read pcap"):
        plan(tmp_path / "missing.pcap", fabric)


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "f.pcap"


def _mutated(frame: bytes, edits: list[tuple[int, int]], keep: int) -> bytes:
    """A valid frame with a few bytes overwritten and its end cut off: near misses reach the deep checks."""
    out = bytearray(frame)
    for at, value in edits:
        out[at % len(out)] = value
    return bytes(out[:keep])


_TEMPLATES = [_udp(), bytes(Ether(src=HOST_A, dst=HOST_B) / IP(src="192.0.2.1", dst="192.0.2.9") / TCP() / b"data"),
              bytes(Ether(src=HOST_A, dst=HOST_B) / Dot1Q() / IP(src="192.0.2.7", dst="192.0.2.1", ihl=6,
                                                                  options=b"\x01" * 4) / UDP(chksum=0))]
_frames = st.one_of(st.binary(max_size=80),
                    st.builds(_mutated, st.sampled_from(_TEMPLATES),
                              st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=3),
                              st.integers(0, 200)))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200),
                 st.tuples(st.sampled_from(list(MAGICS)),
                           st.lists(st.tuples(st.integers(0, 2**32 - 1), _frames,
                                              st.one_of(st.just(0), st.integers(0, 200)))),
                           st.one_of(st.just(0), st.integers(0, 40)))))
def test_fuzz_only_user_errors(fuzz_file, fabric, data):
    if isinstance(data, tuple):
        magic, records, cut = data
        _write_pcap(fuzz_file, [(1, frac, f, len(f) + extra) for frac, f, extra in records], magic)
        if cut:
            fuzz_file.write_bytes(fuzz_file.read_bytes()[:-cut])
    else:
        fuzz_file.write_bytes(data)
    for mode in pcapreplay.SNAPPED:
        try:
            result = plan(fuzz_file, fabric, snapped=mode)
        except UserError:
            return
        assert all(_checksums_valid(f) for frames in result.frames.values() for _, f in frames)


# -- the plan file and the CLI -----------------------------------------------------------------------------
def test_plan_file_round_trip(tmp_path, fabric):
    result = plan(_trace(TCPREPLAY), fabric)
    result.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded == result
    assert loaded.host_frames("n0g0") == result.frames["n0g0"]
    with pytest.raises(UserError, match="sends nothing"):
        loaded.host_frames("n15g1")
    (tmp_path / "bad.json").write_text(json.dumps({"format": pcapreplay.PLAN_FORMAT, "frames": {"h": [[0, "!"]]}}))
    with pytest.raises(UserError, match="malformed replay plan"):
        Plan.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(UserError, match="not a pcap replay plan"):
        Plan.load(tmp_path / "other.json")


def test_sender_socket_errors_are_user_errors(monkeypatch):
    """A refused raw socket (no root, no such interface) is one line; faked, so no raw socket is opened here."""
    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(pcapreplay.socket, "socket", refuse)
    with pytest.raises(UserError, match="cannot send on interface 'n0g0-eth0': Operation not permitted"):
        pcapreplay.replay([], "n0g0-eth0", 0.0)


def test_cli_plan(tmp_path, fabric, capsys):
    fabric.save(tmp_path / "model.json")
    args = ["plan", "--pcap", str(_trace(ZEEK)), "--fabric", str(tmp_path / "model.json"), "--out"]
    assert pcapreplay.main([*args, str(tmp_path / "plan.json")]) == 0
    assert json.loads(capsys.readouterr().out)["kept"] == EXPECTED[ZEEK][1]
    assert Plan.load(tmp_path / "plan.json").kept == EXPECTED[ZEEK][1]
    (tmp_path / "bad.pcap").write_bytes(b"nope")
    args[2] = str(tmp_path / "bad.pcap")
    assert pcapreplay.main([*args, str(tmp_path / "plan2.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.pcap: not a pcap file" in err
