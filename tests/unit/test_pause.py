"""Lossless links' pure parts: the pause book's XOFF/XON hysteresis, and the thresholds the model gives."""

from __future__ import annotations

import pytest

from emulator.model import topologies
from emulator.model.errors import UserError
from emulator.net import features, pause
from emulator.run.job import late_pauses


def test_a_port_pauses_above_xoff_and_releases_only_at_xon():
    book = pause.PauseBook({"p": pause.PausePoint(xoff=50_000, xon=30_000, feeders=["a", "b"])})
    assert book.observe("p", 50_000) == ([], [])  # at XOFF: not above it
    assert book.observe("p", 50_001) == (["a", "b"], [])
    assert book.observe("p", 60_000) == ([], [])  # paused already
    assert book.observe("p", 30_001) == ([], [])  # between the thresholds: still held
    assert book.paused("a")
    assert book.observe("p", 30_000) == ([], ["a", "b"])
    assert not book.paused("a")
    assert book.observe("p", 40_000) == ([], [])  # below XOFF again: nothing


def test_a_gate_held_by_two_ports_runs_once_both_release():
    book = pause.PauseBook({"p": pause.PausePoint(10, 5, ["a", "shared"]), "q": pause.PausePoint(10, 5, ["shared"])})
    assert book.xoff("p") == ["a", "shared"]
    assert book.xoff("q") == []  # shared is paused already
    assert book.xon("p") == ["a"]
    assert book.paused("shared")
    assert book.xon("q") == ["shared"]


def test_the_headroom_covers_every_feeder_and_xon_is_two_frames_below_xoff():
    f = topologies.build("ft2", leaves=4, spines=4, hosts_per_leaf=4, lossless=True, queue_kb=256)
    frame = 9014
    xoff, xon, headroom = f.pause_thresholds("p0l0", f.hosts()[0])
    feeders = f.feeders("p0l0", f.hosts()[0])
    assert len(feeders) == 7  # three other hosts and four spines
    assert headroom == frame + 7 * (2 * frame + 2750)  # 2 ms at 1.1 x 10 Mbit/s: 2,750 bytes
    assert (xoff, xon) == (256 * 1024 - headroom, 256 * 1024 - headroom - 2 * frame)


FEATURES = features.Features(datapath="user", shaping=True, link_delay=False, link_loss=False, ecn_marking=True,
                             tcp_congestion=[], unavailable=[], ecn_marker="bpf", lossless=True)


def test_a_queue_the_user_gave_too_small_for_the_headroom_is_refused_with_its_field():
    f = topologies.build("ft2", leaves=4, spines=4, hosts_per_leaf=4, lossless=True, queue_kb=128)
    with pytest.raises(UserError) as err:
        features.check_link_options(f, FEATURES)
    assert err.value.field == "queue_kb" and not f.queue_sized


@pytest.mark.parametrize("params", [{"topo": "ft2", "leaves": 4, "spines": 4, "hosts_per_leaf": 4}, {}])
def test_a_lossless_queue_left_to_the_fabric_is_its_busiest_ports_headroom_and_four_frames(params):
    """The default fabric (`mpft traffic incast --lossless` was refused on it) and the lossless study's leaves,
    whose ports have seven feeders: every port's XOFF at least four frames up, said in Fabric.queue_sized."""
    f = topologies.build(**params, lossless=True)
    frame = f.mtu + 14
    headroom, switch, peer = f.largest_headroom()
    assert f.queue_bytes == 1024 * -(-(headroom + 4 * frame) // 1024) > 128 * 1024
    assert f.queue_sized == {"queue_kb": f.queue_bytes // 1024, "headroom_kb": headroom / 1024,
                             "port": f"{switch} to {peer}", "feeders": len(f.feeders(switch, peer)), "frames": 4}
    assert min(f.pause_thresholds(sw, p)[0] for sw in f.switches() for p in f.graph[sw]) >= 4 * frame
    features.check_link_options(f, FEATURES)  # accepted
    assert not topologies.build(**params).queue_sized  # lossy fabrics keep the default queue


@pytest.mark.parametrize(("option", "field"), [({"queueing": "voq"}, "queueing"), ({"lossless": "yes"}, "lossless")])
def test_lossless_options_it_cannot_honour_are_refused(option, field):
    with pytest.raises(UserError) as err:
        topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1, **{"lossless": True, **option})
    assert err.value.field == field


def test_a_tbf_change_request_carries_the_rate_and_burst():
    msg = pause.tbf_change(ifindex=7, rate_bytes=pause.TRICKLE, burst=9014, limit=262144)
    length, kind, *_ = pause.HEADER.unpack_from(msg)
    assert (length, kind) == (len(msg), pause.RTM_NEWQDISC)
    assert b"tbf\0" in msg and (9014).to_bytes(4, "little") in msg


def test_a_class_gate_is_the_tbf_under_its_own_class():
    """Per-class pauses change the gate of one class (qdisc 1N: under class 1:1N), the FIFO's is 10: under 1:1."""
    fifo = pause.tbf_change(7, 8, 9078, 100_000)
    klass = pause.tbf_change(7, 8, 9078, 100_000, tclass=3)
    header = 16  # nlmsghdr, then struct tcmsg: family, ifindex, handle, parent, info
    assert pause.TCMSG.unpack_from(fifo, header)[2:4] == (0x10 << 16, 1 << 16 | 1)
    assert pause.TCMSG.unpack_from(klass, header)[2:4] == (0x13 << 16, 1 << 16 | 0x13)
    assert (pause.queue_name("s-eth1", None), pause.queue_name("s-eth1", 3)) == ("s-eth1", "s-eth1/tc3")
    assert pause.interface_of("s-eth1/tc3") == pause.interface_of("s-eth1") == "s-eth1"


def test_queueing_per_class_adds_two_frames_of_headroom():
    """The program's even share of a port among its classes is up to HTB's quantum (two frames) off its round
    robin, so a class's count may trail its queue by that much more."""
    fifo = topologies.build("ft2", leaves=4, spines=4, hosts_per_leaf=4, lossless=True, queue_kb=256)
    klass = topologies.build("ft2", leaves=4, spines=4, hosts_per_leaf=4, lossless=True, queue_kb=256,
                             queueing="class")
    host = fifo.hosts()[0]
    assert klass.pause_thresholds("p0l0", host)[2] == fifo.pause_thresholds("p0l0", host)[2] + 2 * 9014


def test_the_slowest_reaction_is_summarised_beside_p50_and_p99():
    record = {"ports": {}, "cpu_s": 0.1, "errors": [], "reactions_ns": [100_000] * 99 + [30_000_000], "log": []}
    assert pause.summarise([record])["reaction_us"] == {"p50": 100.0, "p99": 30_000.0, "max": 30_000.0}


def test_a_lossless_fabric_whose_queues_dropped_is_unfaithful_and_says_how_late_its_pauses_were():
    lossless = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2, queue_kb=256, lossless=True)
    pauses = {"reaction_us": {"p50": 80.0, "p99": 900.0, "max": 31_000.0}}
    assert late_pauses(lossless, {}, pauses) == []
    [why] = late_pauses(lossless, {"l0-eth1": 18, "l0-eth3": 2}, pauses)
    assert why == ("20 packets dropped in the queues of a lossless fabric (most at l0-eth1: 18): its pauses took "
                   "up to 31000 us to hold their feeders, where the headroom allows 2000 us")
    lossy = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2, queue_kb=256)
    assert late_pauses(lossy, {"l0-eth1": 18}, {}) == []  # a lossy fabric drops by design
