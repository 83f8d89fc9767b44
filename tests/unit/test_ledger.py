"""Every packet accounted for (emulator.net.ledger) and the verdict that calls a run unfaithful
(emulator.net.monitor): the arithmetic, the places, the sock_diag parser, without root."""

from __future__ import annotations

import struct

from emulator.analysis.fidelity import LINK_FLOOR, unfaithful, verdict
from emulator.model import topologies
from emulator.net import ledger
from emulator.net.monitor import LinkSampler, netdev_column, packet_time_s, sample_interval
from emulator.net.qdiscs import ATTR, HEADER, NLMSG_DONE


def test_the_ledger_names_each_place_and_leaves_the_rest_unattributed():
    before = {"switch_queue": {"p0l0-eth1": 3}, "switch_input": {"p0s0-eth1": 10}, "host_ip": {"n0g1": 5}}
    after = {"switch_queue": {"p0l0-eth1": 7, "p0l0-eth2": 2}, "switch_input": {"p0s0-eth1": 110},
             "host_ip": {"n0g1": 5}, "after_stop": {"n1g0": 1}}
    acc = ledger.account(before, after, sent=1000, delivered=880)
    assert acc.drops["switch_queue"] == 6 and acc.drops["switch_input"] == 100 and acc.drops["host_ip"] == 0
    assert acc.where["switch_input"] == {"p0s0-eth1": 100}
    assert acc.unattributed == 1000 - 880 - 6 - 100 - 1  # a packet that came after its agent stopped is a sink
    assert acc.lost == 106 and acc.largest() == "switch_input"
    assert "most in switch daemons' port input (100; 100 at p0s0-eth1)" in acc.summary()
    assert acc.summary().endswith("13 unattributed")


def test_a_counter_that_started_again_counts_from_zero():
    acc = ledger.account({"nic_queue": {"n0g0-eth0": 50}}, {"nic_queue": {"n0g0-eth0": 4}}, sent=10, delivered=6)
    assert acc.drops["nic_queue"] == 4 and acc.unattributed == 0


def test_queues_are_placed_by_the_link_their_interface_is_on():
    f = topologies.build("mpft", planes=2, nodes=2, leaves=1, spines=1)
    host = "n0g0"
    nic = f.intf(host, f.nic_links(host)[0][0])
    nvlink = f.intf(host, f.nvlink_peer(host))
    assert ledger.place_of_interface(f, nic) == "nic_queue"
    assert ledger.place_of_interface(f, nvlink) == "nvlink_queue"
    assert ledger.place_of_interface(f, f.intf(f.nvlink_peer(host), host)) == "nvlink_queue"
    assert ledger.place_of_interface(f, f.intf("p0l0", host)) == "switch_queue"


def test_a_switch_loses_what_its_ports_took_in_and_did_not_send():
    """By interface counters, not its qdiscs': OVS sends again from a packet a full queue dropped."""
    rx = {"p0l0-eth1": 100, "p0l0-eth2": 50, "p0s0-eth1": 40, "n0g0-eth0": 7}
    tx = {"p0l0-eth1": 45, "p0l0-eth2": 90, "p0s0-eth1": 40, "n0g0-eth0": 9}
    assert ledger.switch_losses(["p0l0", "p0s0"], rx, tx, {"p0l0-eth1": 5}) == {"p0l0": 10, "p0s0": 0}


def test_snmp_and_interface_tables_are_read_as_the_kernel_writes_them():
    snmp = ledger._snmp("Ip: Forwarding InReceives InDelivers ForwDatagrams\nIp: 1 100 60 38\n"
                        "Udp: InDatagrams NoPorts InErrors\nUdp: 60 2 -0\n")
    assert snmp["Ip.InReceives"] - snmp["Ip.InDelivers"] - snmp["Ip.ForwDatagrams"] == 2
    dev = ("Inter-|   Receive |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|...\n"
           "    lo: 1 1 0 9 0 0 0 0 1 1 0 9 0 0 0 0\n"
           "n0g0-eth0: 10 1 0 3 0 0 0 0 20 2 0 4 0 0 0 0\n")
    drops = {i: netdev_column(dev, "rx", "drops")[i] + n for i, n in netdev_column(dev, "tx", "drops").items()}
    assert drops == {"lo": 18, "n0g0-eth0": 7}


def _diag_message(inode: int, ifindex: int, queued: int, drops: int) -> bytes:
    info = struct.pack("=IIIIII", ifindex, 0, 0, 0, 0, 0)
    meminfo = struct.pack("=9I", queued, 0, 0, 0, 0, 0, 0, 0, drops)
    attrs = (ATTR.pack(4 + len(info), ledger.PACKET_DIAG_INFO) + info
             + ATTR.pack(4 + len(meminfo), ledger.PACKET_DIAG_MEMINFO) + meminfo)
    body = ledger.PACKET_DIAG_MSG.pack(17, 3, 0, inode) + attrs
    return HEADER.pack(HEADER.size + len(body), ledger.SOCK_DIAG_BY_FAMILY, 2, 1, 0) + body


def test_packet_socket_drops_are_read_from_a_sock_diag_dump():
    done = HEADER.pack(HEADER.size + 4, NLMSG_DONE, 2, 1, 0) + b"\0" * 4
    found, ended = ledger.parse_packet_diag(_diag_message(77, 5, 4096, 12) + _diag_message(78, 6, 0, 0) + done)
    assert ended and found == [(77, 5, 4096, 12), (78, 6, 0, 0)]


def test_a_run_is_unfaithful_for_a_slow_backlogged_link_or_packets_nothing_counts():
    assert unfaithful(("p0l0-eth5", 0.95), 0, 10_000) == []
    assert unfaithful(("p0l0-eth5", 0.95), 10, 10_000) == []  # 0.1 % is the ceiling
    slow = unfaithful(("p0l0-eth5", LINK_FLOOR - 0.01), None, 0)
    assert slow and "p0l0-eth5 sent at 89% of its rate" in slow[0]
    assert "11 of 10000 packets lost where no counter says" in unfaithful(None, 11, 10_000)[0]
    assert "12 of 10000 packets lost where the model has no queue" in unfaithful(None, 0, 10_000, unmodelled=12)[0]
    said = verdict([], 0.5, unfaithful_in=["run1 (why)"], rate_ratio=0.99)
    assert said.startswith("UNFAITHFUL in run1 (why): results are not the fabric's")
    assert verdict(["run1"], 0.05, unfaithful_in=["run1 (why)"]).startswith(
        "CPU-BOUND in run1: results understate the fabric; UNFAITHFUL in run1 (why)")


def test_one_slow_link_is_seen_where_one_median_over_every_link_hides_it():
    f = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2)
    sampler = LinkSampler(f)
    sampler.backlogged = {f"p0l0-eth{i}": [1.0, 0.99, 1.01] for i in range(1, 6)}
    sampler.backlogged["p0l0-eth6"] = [0.6, 0.7, 0.65]
    sampler.backlogged["p0s0-eth1"] = [0.1, 0.2]  # backlogged in too few intervals to judge
    assert sampler.rate_ratio() == 0.995  # the one median over every link calls it fine
    assert sampler.worst_link() == ("p0l0-eth6", 0.65)


def test_a_link_sample_spans_enough_packets_at_low_rates():
    assert sample_interval(topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2)) == 0.2
    slow = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2, link_mbps=1)
    assert abs(sample_interval(slow) - 20 * 9014 * 8 / 1e6) < 1e-9


def test_packets_held_in_the_switch_daemons_input_for_more_than_a_packet_time_make_a_run_unfaithful():
    f = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2)
    sampler = LinkSampler(f)
    assert sampler.hidden_delay() is None  # not sampled
    sampler.hidden = [(500_000, 500_000, 0.5), (500_000, 600_000, 0.5)]
    assert sampler.hidden_delay() is None  # too few samples to judge: a short run's start
    sampler.hidden = [(10_000, 500_000, 0.5), (20_000, 600_000, 0.5), (0, 400_000, 0.5)]
    assert sampler.hidden_delay() == 10_000 / 1_000_000  # Little's law: the median held over bytes per second
    packet = packet_time_s(f)
    assert packet == 9014 * 8 / 10e6
    assert unfaithful(None, 0, 10_000, hidden=(0.9 * packet, packet)) == []
    said = unfaithful(None, 0, 10_000, hidden=(1.5 * packet, packet))[0]
    assert "held what they forwarded 10.8 ms on average, 1.5 packet times" in said


def test_queue_depths_are_read_between_link_samples_except_beside_a_pause_thread():
    """A lossless fabric's pause thread shares the sampler's process, and a read holds the interpreter."""
    assert LinkSampler(topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2)).depth_interval < 0.01
    lossless = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2, lossless=True)
    assert LinkSampler(lossless).depth_interval == float("inf")


def test_a_backlog_is_a_quarter_of_the_queue_at_least_two_frames():
    """Receiver-paced queues of a few packets drain and refill between two samples: not a backlog."""
    assert LinkSampler(topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2)).floor == 128 * 1024 // 4
    small = LinkSampler(topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2, queue_kb=32))
    assert small.floor == 2 * (9000 + 14)
