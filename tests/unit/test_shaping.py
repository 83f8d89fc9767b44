"""Shaping commands and their verification from real-looking `tc` output."""

from __future__ import annotations

import json

import pytest

from emulator.shaping import Shape, class_rates, class_show_lines, mismatches, shaped_interfaces, tc_lines


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


def test_shaped_interfaces_checks_the_expected_leaf():
    text = _qdisc_json(*_ours("h0-eth0"))
    assert shaped_interfaces(text) == {"h0-eth0"}
    assert shaped_interfaces(text, "netem") == set()
