"""Shaping commands and their verification from real-looking `tc` output."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.model import topologies, wire
from emulator.net import shaping
from emulator.net.shaping import (
    Shape,
    class_rates,
    class_show_lines,
    default_class,
    filter_matches,
    leaf_backlogs,
    leaf_classes,
    mismatches,
    shaped_interfaces,
    tc_lines,
)


def test_tc_lines_build_htb_class_and_bfifo():
    lines = tc_lines("p0l0-eth5", Shape(rate_bps=10e6, mtu=4200, queue_bytes=65536))
    assert len(lines) == 3
    root, cls, leaf = (line.split() for line in lines)
    assert root == ["qdisc", "replace", "dev", "p0l0-eth5", "root", "handle", "1:", "htb", "default", "1"]
    assert cls[:8] == ["class", "replace", "dev", "p0l0-eth5", "parent", "1:", "classid", "1:1"]
    assert cls[8] == "htb"
    opts = dict(zip(cls[9::2], cls[10::2], strict=True))
    assert opts["rate"] == opts["ceil"] == "10000000bit"
    burst = 2 * (4200 + 14)  # two full frames, Ethernet header included
    assert int(opts["burst"]) == int(opts["cburst"]) == int(opts["quantum"]) == burst
    assert leaf == ["qdisc", "replace", "dev", "p0l0-eth5", "parent", "1:1", "handle", "10:", "bfifo",
                    "limit", "65536"]


def test_tc_lines_rates_are_whole_bits():
    lines = tc_lines("h1-eth0", Shape(rate_bps=2.5e6 + 0.7, mtu=1500, queue_bytes=3000))
    assert "rate 2500000bit ceil 2500000bit" in lines[1]
    assert "burst 3028 " in lines[1]
    assert lines[2].endswith("bfifo limit 3000")


def _qdisc_json(*entries):
    return json.dumps(list(entries))


def _ours(dev, limit=65536):
    return [
        {"kind": "htb", "handle": "1:", "dev": dev, "root": True, "refcnt": 2,
         "options": {"r2q": 10, "default": "0x1", "direct_packets_stat": 0, "direct_qlen": 1000}},
        {"kind": "bfifo", "handle": "10:", "dev": dev, "parent": "1:1", "options": {"limit": limit}},
    ]


def test_shaped_interfaces_from_tc_json():
    text = _qdisc_json(
        {"kind": "noqueue", "handle": "0:", "dev": "lo", "root": True, "refcnt": 2, "options": {}},
        *_ours("p0l0-eth1"),
        {},  # iproute2 prints an empty object for a device the dump filtered out
        *_ours("p0l0-eth2"),
        # root htb but our leaf missing: ovs-vswitchd reset half of it
        {"kind": "htb", "handle": "1:", "dev": "p0l0-eth3", "root": True, "refcnt": 2, "options": {}},
        # a FIFO under 1:1 but no HTB root
        {"kind": "fq_codel", "handle": "0:", "dev": "p0l0-eth4", "root": True, "refcnt": 2, "options": {}},
        {"kind": "bfifo", "handle": "10:", "dev": "p0l0-eth4", "parent": "1:1", "options": {"limit": 1}},
        # HTB with another handle
        {"kind": "htb", "handle": "2:", "dev": "p0l0-eth5", "root": True, "refcnt": 2, "options": {}},
        {"kind": "bfifo", "handle": "10:", "dev": "p0l0-eth5", "parent": "1:1", "options": {"limit": 1}},
        # HTB root but the FIFO under another class
        {"kind": "htb", "handle": "1:", "dev": "p0l0-eth6", "root": True, "refcnt": 2, "options": {}},
        {"kind": "bfifo", "handle": "10:", "dev": "p0l0-eth6", "parent": "1:2", "options": {"limit": 1}},
        # a veth left with its default qdisc
        {"kind": "noqueue", "handle": "0:", "dev": "h1-eth0", "root": True, "refcnt": 2, "options": {}},
        {},
    )
    assert shaped_interfaces(text) == {"p0l0-eth1", "p0l0-eth2"}


@pytest.mark.parametrize("text", ["", "[]", "[{}, {}]"])
def test_shaped_interfaces_of_empty_output(text):
    assert shaped_interfaces(text) == set()


CLASS_SHOW = """\
class htb 1:1 root leaf 10: prio 0 rate 10Mbit ceil 10Mbit burst 8428b cburst 8428b
class htb 1:1 root leaf 10: prio 0 rate 40Mbit ceil 40Mbit burst 8428b cburst 8428b
class htb 1:1 root leaf 10: prio 0 rate 333328bit ceil 333328bit burst 8428b cburst 8428b
class htb 1:1 root leaf 10: prio 0 rate 3333Kbit ceil 3333Kbit burst 8428b cburst 8428b
class htb 1:1 root leaf 10: prio 0 rate 1Gbit ceil 1Gbit burst 8428b cburst 8428b
"""
INTFS = ["a-eth0", "a-eth1", "a-eth2", "a-eth3", "a-eth4"]


def test_class_show_lines():
    assert class_show_lines(["x-eth0", "y-eth1"]) == ["class show dev x-eth0", "class show dev y-eth1"]


def test_class_rates_parse_every_unit():
    assert class_rates(INTFS, CLASS_SHOW) == {"a-eth0": 10_000_000, "a-eth1": 40_000_000, "a-eth2": 333_328,
                                              "a-eth3": 3_333_000, "a-eth4": 1_000_000_000}


def test_class_rates_ignore_other_classes():
    text = ("class htb 1:10 root prio 0 rate 5Mbit ceil 5Mbit burst 1600b cburst 1600b\n"
            "class htb 1:1 root leaf 10: prio 0 rate 10Mbit ceil 10Mbit burst 8428b cburst 8428b\n"
            "class htb 2:1 root prio 0 rate 7Mbit ceil 7Mbit burst 1600b cburst 1600b\n")
    assert class_rates(["a-eth0"], text) == {"a-eth0": 10_000_000}


def test_class_rates_give_nothing_when_an_interface_lost_its_class():
    # one interface printed nothing (no class): the lines cannot be matched to interfaces any more
    text = "\n".join(CLASS_SHOW.splitlines()[:4])
    assert class_rates(INTFS, text) == {}


def test_mismatches():
    expected = {"a-eth0": 10e6, "a-eth1": 40e6, "a-eth2": 10e6 / 30, "a-eth9": 10e6}
    actual = {"a-eth0": 10_050_000, "a-eth1": 20_000_000, "a-eth2": 333_328}
    problems = mismatches(expected, actual)
    assert len(problems) == 2
    assert problems[0].startswith("a-eth1:") and "20000000" in problems[0] and "40000000" in problems[0]
    assert problems[1] == "a-eth9: class rate not found"
    assert mismatches(expected, actual, tolerance=0.6) == ["a-eth9: class rate not found"]
    assert mismatches({}, actual) == []
    assert mismatches({"a-eth0": 10e6}, {"a-eth0": 10_200_000}) == [
        "a-eth0: 10200000 bit/s instead of 10000000"]


def test_what_tc_lines_set_is_what_class_rates_read_back():
    rate = 10e6 / 30
    line = tc_lines("a-eth0", Shape(rate, 4200, 65536))[1]
    written = int(line.split("rate ")[1].split("bit")[0])
    # iproute2 stores bytes/s and prints bits: 333333 bit/s reads back as 333328bit
    shown = f"class htb 1:1 root leaf 10: prio 0 rate {written // 8 * 8}bit ceil {written // 8 * 8}bit\n"
    readback = class_rates(["a-eth0"], shown)
    assert mismatches({"a-eth0": rate}, readback) == []


def test_netem_leaf_for_delay_and_loss_with_red_under_it_for_ecn():
    shape = Shape(10e6, 9000, 128 * 1024, delay_ms=2.0, loss_pct=0.5, ecn=True)
    assert shape.leaf_kind == "netem"
    lines = tc_lines("p0l0-eth1", shape)
    netem = [line for line in lines if " netem " in line]
    red = [line for line in lines if " red " in line]
    assert len(netem) == 1 and "parent 1:1 handle 10:" in netem[0]
    assert "delay 2.0ms" in netem[0] and "loss 0.5%" in netem[0] and "limit 14" in netem[0]
    assert len(red) == 1 and "parent 10:1" in red[0] and red[0].endswith(" ecn")
    assert not any("bfifo" in line for line in lines)


def test_red_leaf_for_ecn_alone():
    shape = Shape(10e6, 9000, 128 * 1024, ecn=True)
    assert shape.leaf_kind == "red"
    leaf = tc_lines("h0-eth0", shape)[-1]
    assert "parent 1:1 handle 10: red" in leaf and " ecn" in leaf and "bandwidth 10000000bit" in leaf


@pytest.mark.parametrize("mtu", [1500, 4200, 9000])
@pytest.mark.parametrize("queue_kb", [16, 64, 128, 1024])
@pytest.mark.parametrize("thresholds", [None, (20_000, 60_000, 0.2), (9001, 9002, 1.0)])
def test_red_parameters_are_ones_tc_accepts(mtu, queue_kb, thresholds):
    """iproute2's tc_red_eval_ewma refuses a burst with burst + 1 - min / avpkt < 1 (Debian 12's tc refused our
    128 KiB queue at MTU 9000: burst 3 against min 32768); and RED needs min < max <= limit."""
    shape = Shape(10e6, mtu, queue_kb * 1024, ecn=True, ecn_thresholds=thresholds)
    words = tc_lines("h0-eth0", shape)[-1].split()
    red = {key: float(words[words.index(key) + 1]) for key in ("limit", "min", "max", "avpkt", "burst")}
    assert red["burst"] + 1 - red["min"] / red["avpkt"] >= 1
    assert red["min"] < red["max"] <= red["limit"] and red["avpkt"] == mtu


def test_shaped_interfaces_checks_the_expected_leaf():
    text = _qdisc_json(*_ours("h0-eth0"))
    assert shaped_interfaces(text) == {"h0-eth0"}
    assert shaped_interfaces(text, "netem") == set()


# -- queueing modes: one FIFO, one queue per traffic class, one per queue-pair bucket --------------------------
RATE, MTU, QUEUE = 10e6, 9000, 128 * 1024
BURST = 2 * (MTU + 14)
SIZES = f"burst {BURST} cburst {BURST} quantum {BURST}"


def _lines(queueing, intf="p0l0-eth5", **kw):
    return tc_lines(intf, Shape(RATE, MTU, QUEUE, queueing=queueing, **kw))


def test_fifo_lines_are_exactly_the_shared_fifo():
    assert _lines("fifo") == [
        "qdisc replace dev p0l0-eth5 root handle 1: htb default 1",
        f"class replace dev p0l0-eth5 parent 1: classid 1:1 htb rate 10000000bit ceil 10000000bit {SIZES}",
        "qdisc replace dev p0l0-eth5 parent 1:1 handle 10: bfifo limit 131072",
    ]
    assert _lines("fifo") == tc_lines("p0l0-eth5", Shape(RATE, MTU, QUEUE))  # fifo is the default
    netem = _lines("fifo", delay_ms=1.0, ecn=True)
    assert len(netem) == 4
    assert netem[2].startswith("qdisc replace dev p0l0-eth5 parent 1:1 handle 10: netem ")
    assert netem[3].startswith("qdisc replace dev p0l0-eth5 parent 10:1 handle 20: red ")


def test_class_mode_lines():
    expected = [
        "qdisc replace dev p0l0-eth5 root handle 1: htb default 10",
        f"class replace dev p0l0-eth5 parent 1: classid 1:1 htb rate 10000000bit ceil 10000000bit {SIZES}",
    ]
    for c in range(shaping.TCLASSES):
        expected += [f"class replace dev p0l0-eth5 parent 1:1 classid 1:1{c} htb rate 1250000bit "
                     f"ceil 10000000bit {SIZES} prio 0",
                     f"qdisc replace dev p0l0-eth5 parent 1:1{c} handle 1{c}: bfifo limit 131072"]
    expected += [f"filter replace dev p0l0-eth5 parent 1: protocol ip prio 1 handle 800::1{c} u32 "
                 f"match ip tos {c << 5:#x} 0xe0 flowid 1:1{c}" for c in range(shaping.TCLASSES)]
    assert _lines("class") == expected


def test_voq_mode_lines():
    share = int(RATE) // (shaping.VOQ_BUCKETS + 1)  # the buckets and the class for other traffic
    roce = f"match ip protocol 17 0xff match ip dport {wire.ROCE_PORT} 0xffff"
    expected = [
        "qdisc replace dev p0l0-eth5 root handle 1: htb default 30",
        f"class replace dev p0l0-eth5 parent 1: classid 1:1 htb rate 10000000bit ceil 10000000bit {SIZES}",
    ]
    for minor in [f"2{b:x}" for b in range(16)] + ["30"]:
        expected += [f"class replace dev p0l0-eth5 parent 1:1 classid 1:{minor} htb rate {share}bit "
                     f"ceil 10000000bit {SIZES} prio 0",
                     f"qdisc replace dev p0l0-eth5 parent 1:{minor} handle {minor}: bfifo limit 131072"]
    expected += [f"filter replace dev p0l0-eth5 parent 1: protocol ip prio 1 handle 800::2{b:x} u32 "
                 f"{roce} match u8 {b:#x} 0xf at {shaping.QP_OFFSET} flowid 1:2{b:x}" for b in range(16)]
    assert _lines("voq") == expected


def _udp_ip_packet(datagram: bytes) -> bytes:
    """The agents' packets as the switch sees them after Ethernet: a 20-byte IP header (no options), then UDP."""
    return bytes([0x45]) + bytes(wire.IP_UDP - wire.UDP_HDR.size - 1) + datagram


def test_qp_offset_is_the_low_byte_of_the_destination_qp():
    buf = bytearray(256)
    for dqpn in (0xABCDE5, 0x1, 0xFFFFF0):
        length = wire.pack_data(buf, wire.ENTROPY_BASE, wire.WRITE_ONLY, dqpn, 7, 1, 0, 0, 0, 16, 16)
        packet = _udp_ip_packet(bytes(buf[:length]))
        assert packet[shaping.QP_OFFSET] == dqpn & 0xFF
        assert wire.Parsed(packet[wire.IP_UDP:]).dqpn == dqpn
        assert int.from_bytes(packet[22:24], "big") == wire.ROCE_PORT  # what `match ip dport` reads
        length = wire.pack_ack(buf, wire.ENTROPY_BASE, dqpn, 3, 0, 0, 0, 0, 0, 0, wire.CNP)  # CNPs and ACKs too
        assert _udp_ip_packet(bytes(buf[:length]))[shaping.QP_OFFSET] == dqpn & 0xFF


def test_class_filters_read_the_agents_tos_whatever_the_ecn_bits():
    for c in range(shaping.TCLASSES):
        for ecn in (0, 1, 2, 3):
            tos = c << 5 | ecn  # traffic.serve tx_socket: DSCP = 8 * tclass, ECT(0) under ecn
            hits = [cls for cls, match in filter_matches("class")
                    if tos & int(match.split()[-1], 16) == int(match.split()[-2], 16)]
            assert hits == [f"1:1{c}"]


@pytest.mark.parametrize("queueing", topologies.QUEUEING)
def test_unmatched_traffic_goes_to_a_leaf_class(queueing):
    lines = _lines(queueing)
    default = default_class(queueing)
    assert lines[0].endswith(f"htb default {default.split(':')[1]}")
    assert default in leaf_classes(queueing)  # HTB would send traffic for a missing or inner class unshaped
    assert any(f"parent {default} " in line and line.startswith("qdisc") for line in lines)
    assert all(classid in leaf_classes(queueing) for classid, _ in filter_matches(queueing))
    if queueing == "voq":  # TCP, pings and ARP queue apart from every RoCE bucket
        assert default not in {classid for classid, _ in filter_matches(queueing)}


@pytest.mark.parametrize("queueing", ["class", "voq"])
@pytest.mark.parametrize("kw", [{}, {"ecn": True}, {"delay_ms": 1.0}, {"delay_ms": 1.0, "ecn": True}])
def test_every_queue_gets_the_fifo_leaf_kind_with_unique_handles(queueing, kw):
    lines = _lines(queueing, **kw)
    kind = Shape(RATE, MTU, QUEUE, **kw).leaf_kind
    leaves = [line for line in lines if line.startswith("qdisc") and f" {kind} " in line]
    assert [line.split()[5] for line in leaves] == leaf_classes(queueing)  # "parent <class>"
    handles = [line.split()[line.split().index("handle") + 1] for line in lines if line.startswith("qdisc")]
    assert len(handles) == len(set(handles))
    assert sum(f" {kind} " in line for line in _lines("fifo", **kw)) == 1
    rates = [int(line.split(" rate ")[1].split("bit")[0]) for line in lines if "parent 1:1 classid" in line]
    assert sum(rates) <= RATE  # guarantees never add up past the link


def _qdisc_json_of(lines):
    """What `tc -j qdisc show` prints after running `lines` (the fields shaped_interfaces reads)."""
    out = []
    for line in lines:
        words = line.split()
        if words[0] != "qdisc":
            continue
        entry = {"dev": words[3], "handle": words[words.index("handle") + 1], "kind": words[words.index("handle") + 2]}
        if words[4] == "root":
            entry["root"] = True
        else:
            entry["parent"] = words[5]
        out.append(entry)
    return json.dumps(out)


@pytest.mark.parametrize("queueing", topologies.QUEUEING)
def test_shaped_interfaces_knows_each_mode(queueing):
    text = _qdisc_json_of(_lines(queueing, intf="a-eth1") + _lines("fifo", intf="a-eth2"))
    for other in topologies.QUEUEING:
        expected = ({"a-eth1"} if other == queueing else set()) | ({"a-eth2"} if other == "fifo" else set())
        assert shaped_interfaces(text, "bfifo", other) == expected
    assert shaped_interfaces(text, "netem", queueing) == set()


@pytest.mark.parametrize("queueing", ["class", "voq"])
def test_a_port_missing_one_queue_is_not_shaped(queueing):
    lines = [line for line in _lines(queueing) if f"parent {leaf_classes(queueing)[3]} " not in line]
    assert shaped_interfaces(_qdisc_json_of(lines), "bfifo", queueing) == set()


def test_class_rates_read_class_1_1_among_its_children():
    text = ("class htb 1:10 parent 1:1 leaf 10: prio 0 rate 1250Kbit ceil 10Mbit burst 18028b cburst 18028b \n"
            "class htb 1:1 root rate 10Mbit ceil 10Mbit burst 18028b cburst 18028b \n"
            "class htb 1:11 parent 1:1 leaf 11: prio 0 rate 1250Kbit ceil 10Mbit burst 18028b cburst 18028b \n"
            "class htb 1:2f parent 1:1 leaf 2f: prio 0 rate 588232bit ceil 20Mbit burst 18028b cburst 18028b \n"
            "class htb 1:1 root rate 20Mbit ceil 20Mbit burst 18028b cburst 18028b \n")
    assert class_rates(["a-eth0", "a-eth1"], text) == {"a-eth0": 10_000_000, "a-eth1": 20_000_000}


def test_leaf_backlogs_by_class_and_summed():
    text = json.dumps([
        {"kind": "htb", "handle": "1:", "dev": "s-eth1", "root": True, "backlog": 0},
        {"kind": "bfifo", "handle": "10:", "dev": "s-eth1", "parent": "1:10", "backlog": 9014},
        {"kind": "bfifo", "handle": "11:", "dev": "s-eth1", "parent": "1:11", "backlog": 100},
        {"kind": "bfifo", "handle": "10:", "dev": "s-eth2", "parent": "1:1", "backlog": 7},
        {"kind": "netem", "handle": "10:", "dev": "s-eth3", "parent": "1:1", "backlog": 5},
        {"kind": "red", "handle": "20:", "dev": "s-eth3", "parent": "10:1", "backlog": 5},  # inside netem's
        {"kind": "fq_codel", "handle": "0:", "dev": "eth0", "parent": ":1", "backlog": 3},
        {},
    ])
    assert leaf_backlogs(text) == {"s-eth1": {"1:10": 9014, "1:11": 100}, "s-eth2": {"1:1": 7},
                                   "s-eth3": {"1:1": 5}}
    assert leaf_backlogs("") == {}


# -- the batches in a real kernel: a throwaway network namespace, on its loopback -------------------------------
SENDER = """\
import json, socket, sys, time
from emulator.model import wire
plan = json.loads(sys.argv[1])
sinks = {}
for _tos, port, _qp, _count in plan:  # listeners, so no port-unreachable ICMP joins the queues
    if port not in sinks:
        sinks[port] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sinks[port].bind(("127.0.0.1", port))
buf = bytearray(256)
for tos, port, qp, count in plan:
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
    n = wire.pack_data(buf, 0, wire.WRITE_MIDDLE, qp, 1, 1, 0, 0, 0, 16)
    for _ in range(count):
        tx.sendto(bytes(buf[wire.UDP_HDR.size:n]), ("127.0.0.1", port))
time.sleep(0.2)
"""
SPLIT = "mpft-test-split"
OTHER_PORT = 9999


def _netns_prefix() -> list[str]:
    """A command prefix for a throwaway network namespace, or a skip saying why there is none."""
    if not all(shutil.which(tool) for tool in ("unshare", "tc", "ip")):
        pytest.skip("needs unshare, tc and ip")
    probe = ("tc qdisc add dev lo root handle 1: htb && "
             "tc filter add dev lo parent 1: protocol ip u32 match u32 0 0 flowid 1:1")
    for prefix in (["unshare", "--net"], ["unshare", "--user", "--map-root-user", "--net"]):
        run = subprocess.run([*prefix, "sh", "-c", probe], capture_output=True, text=True, check=False)
        if run.returncode == 0:
            return prefix
    pytest.skip(f"no network namespace with htb and u32 here: {run.stderr.strip()[:200]}")


def _class_packets(text):
    """{classid: packets} from `tc -s class show`."""
    packets, classid = {}, None
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            classid = words[2]
        elif words[:1] == ["Sent"] and classid:
            packets[classid] = int(words[3])
    return packets


def _filters(text):
    """{flowid: [(off, value, mask)]} from `tc -j filter show`, whose objects repeat the key `match`."""
    def pairs(items):
        out = {}
        for key, value in items:
            if key == "match":
                out.setdefault("matches", []).append(value)
            else:
                out[key] = value
        return out
    return {f["options"]["flowid"]: [(m["off"], int(m["value"], 16), int(m["mask"], 16))
                                    for m in f["options"]["matches"]]
            for f in json.loads(text, object_pairs_hook=pairs) if "flowid" in f.get("options", {})}


def _key(offset, width, value):
    """A u32 match as the kernel keeps it: the aligned 32-bit word, the field shifted into place."""
    shift = (4 - width - offset % 4) * 8
    return offset - offset % 4, value << shift


PLANS = {  # (tos, UDP port, QP, packets) sent, and packets expected per queue
    "fifo": ([(0, wire.ROCE_PORT, 5, 3), (0x20, OTHER_PORT, 0, 2)], {"1:1": 5}),
    "class": ([(c << 5 | (2 if c % 2 else 0), wire.ROCE_PORT, 1, c + 1) for c in range(8)]
              + [(0xE0, OTHER_PORT, 0, 2)],
              {**{f"1:1{c}": c + 1 for c in range(8)}, "1:17": 8 + 2}),
    "voq": ([(0x20, wire.ROCE_PORT, (b + 1) << 12 | 0x50 | b, b + 1) for b in range(16)]
            + [(0, OTHER_PORT, 3, 3)],
            {**{f"1:2{b:x}": b + 1 for b in range(16)}, "1:30": 3}),
}


@pytest.mark.parametrize("queueing", topologies.QUEUEING)
def test_batch_classifies_real_packets_in_a_throwaway_namespace(tmp_path, queueing):
    prefix = _netns_prefix()
    batch = tmp_path / "shape.tc"
    batch.write_text("\n".join(tc_lines("lo", Shape(RATE, MTU, QUEUE, queueing=queueing))) + "\n")
    plan, expected = PLANS[queueing]
    script = (f"set -e; ip link set lo up; tc -batch {shlex.quote(str(batch))}; "
              f"{shlex.quote(sys.executable)} -c {shlex.quote(SENDER)} {shlex.quote(json.dumps(plan))}; "
              f"tc -s class show dev lo; echo {SPLIT}; tc -j filter show dev lo; echo {SPLIT}; tc -j qdisc show")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([*prefix, "sh", "-c", script], capture_output=True, text=True, check=False, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    classes, filters, qdiscs = run.stdout.split(SPLIT + "\n")

    assert class_rates(["lo"], classes) == {"lo": int(RATE)}
    packets = _class_packets(classes)
    queues = leaf_classes(queueing)
    assert {c: packets[c] for c in queues} == {c: expected.get(c, 0) for c in queues}
    assert packets["1:1"] == sum(count for *_, count in plan)
    assert shaped_interfaces(qdiscs, "bfifo", queueing) == {"lo"}

    found = _filters(filters)
    assert set(found) == {classid for classid, _ in filter_matches(queueing)}
    for c in range(8 if queueing == "class" else 0):
        assert found[f"1:1{c}"] == [(*_key(1, 1, c << 5), _key(1, 1, 0xE0)[1])]
    for b in range(16 if queueing == "voq" else 0):
        wanted = [(9, 1, 17, 0xFF), (22, 2, wire.ROCE_PORT, 0xFFFF), (shaping.QP_OFFSET, 1, b, 0xF)]
        assert found[f"1:2{b:x}"] == [(*_key(o, w, v), _key(o, w, m)[1]) for o, w, v, m in wanted]
