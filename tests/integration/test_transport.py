"""Integration tier: the RDMA-like transport on a small 2-plane MPFT with a storage plane (real agents, real
packets through OVS): every pattern completes with zero lost messages, arrival order is kept under per-QP
entropy and broken by spraying over unequally loaded paths, and a recorded schedule replays to itself."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from emulator.model import schedule, topologies, wire
from emulator.net.emulation import Emulation
from emulator.run.launch import transfer
from traffic import hotpath, patterns, udpprobe
from traffic.contract import HostResult
from traffic.options import TransportOptions

pytestmark = pytest.mark.root

SMALL = {"moe": {"tokens_per_gpu": 4, "hidden": 256, "experts_per_gpu": 2, "node_limit": 2},
         "incast": {"senders": 4, "size": 64 * 1024},
         "flow": {"size": 64 * 1024},
         "permutation": {"size": 64 * 1024},
         "all-to-all": {"size": 16 * 1024, "plane": 1},
         "ring-allreduce": {"size": 128 * 1024, "plane": 0},
         "allgather": {"size": 64 * 1024, "plane": 1},
         "reduce-scatter": {"size": 64 * 1024},
         "storage": {"chunk_bytes": 32 * 1024, "reads": 2, "writes": 1},
         "write-flag": {"size": 32 * 1024, "rounds": 2, "plane": 0}}


@pytest.fixture(scope="module")
def emu():
    fabric = topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2, storage=True, storage_servers=2,
                              storage_leaves=1, storage_spines=1)
    with Emulation(fabric, app="spray", quiet=True) as running:
        yield running


@pytest.mark.parametrize("name", sorted(patterns.PATTERNS))
def test_every_pattern_completes_without_loss(emu, tmp_path, name):
    messages = patterns.generate(name, emu.fabric, **SMALL[name])
    m = transfer(emu, messages, tmp_path, TransportOptions(cc="rtt"), quiet=True)
    assert m.lost_messages == 0, m
    assert m.duplicate_or_unexpected == 0 and m.wrong_size == 0
    assert m.packets.received >= m.packets.data > 0
    assert m.completion_s > 0


def _with_background(emu, tmp_path, entropy: str, seed: int) -> dict:
    """n0g0 -> n2g0 (leaf 0 to leaf 1 of plane 0) while n1g0 -> n3g0 fills one spine's path at line rate with a
    single fixed flow: the two spines' paths have unequal queues."""
    sink = emu.popen("n3g0", udpprobe.argv("sink", "--seconds", "6"), stdout=subprocess.DEVNULL)
    send = udpprobe.argv("send", "--dst", emu.fabric.ip("n3g0"), "--packets", "600", "--size", "8000",
                            "--rate", "160")
    bg = emu.popen("n1g0", send, stdout=subprocess.DEVNULL)
    try:
        message = [schedule.Message(0, 0.3, "n0g0", "n2g0", 1_000_000)]
        # a window of 8: sprayed packets in flight together can overtake each other (the fabric's own window is 1)
        return transfer(emu, message, tmp_path / f"{entropy}-{seed}", TransportOptions(entropy=entropy, window=8),
                        seed=seed, quiet=True)
    finally:
        for proc in (bg, sink):
            proc.terminate()
            proc.wait()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_arrival_order_kept_per_queue_pair_and_broken_by_spraying(emu, tmp_path, seed):
    fixed = _with_background(emu, tmp_path, "fixed", seed)
    sprayed = _with_background(emu, tmp_path, "spray", seed)
    assert fixed.lost_messages == sprayed.lost_messages == 0
    assert fixed.reordering.out_of_order == 0, fixed.reordering
    assert sprayed.reordering.out_of_order > 0, sprayed.reordering
    assert sprayed.reordering.resequence_max > 0


def test_a_recorded_schedule_replays_to_the_same_schedule(emu, tmp_path):
    messages = patterns.generate("ring-allreduce", emu.fabric, size=64 * 1024, plane=1)
    first = transfer(emu, messages, tmp_path / "first", quiet=True)
    recorded = schedule.read(tmp_path / "first" / "schedule.jsonl", emu.fabric.hosts())
    assert recorded == messages
    second = transfer(emu, recorded, tmp_path / "second", quiet=True)
    assert (tmp_path / "second" / "schedule.jsonl").read_text() == (tmp_path / "first" / "schedule.jsonl").read_text()
    assert first.lost_messages == second.lost_messages == 0


@pytest.mark.parametrize("name", ["incast", "ring-allreduce", "storage"])
def test_tcp_flows_report_the_same_message_metrics(emu, tmp_path, name):
    """Kernel TCP (one connection per queue pair) in the same per-message metrics, twice in one emulation (the
    agents' listening port is free again for the second run)."""
    messages = patterns.generate(name, emu.fabric, **SMALL[name])
    for attempt in ("first", "second"):
        m = transfer(emu, messages, tmp_path / attempt, TransportOptions(transport="tcp", cc="cubic"),
                         quiet=True)
        assert m.lost_messages == 0 and m.wrong_size == 0 and m.duplicate_or_unexpected == 0, m
        assert m.packets.data > 0 and m.packets.received > 0
        assert m.message_completion_s["count"] == len(messages)


def test_write_then_flag_ordering_modes(emu, tmp_path):
    """Under spraying: psn, fence and release never show a flag before its data (the unsafe mode runs through
    the same checker; the ordering study shows it caught), and the fence never lets a flag leave early."""
    messages = patterns.generate("write-flag", emu.fabric, size=64 * 1024, rounds=4, plane=0)
    sends = sum(1 for m in messages if m.op == "send")
    result = {}
    for mode in ("psn", "fence", "release", "none"):
        m = transfer(emu, messages, tmp_path / mode, TransportOptions(entropy="spray", ordering=mode),
                         quiet=True)
        assert m.lost_messages == 0 and m.duplicate_or_unexpected == 0, (mode, m)
        assert m.ordering.sends == sends and m.ordering.mode == mode
        result[mode] = m.ordering
    assert result["psn"].violations == result["fence"].violations == result["release"].violations == 0
    # the fence holds each flag until the write before it is acknowledged (without a fence a flag may leave as
    # soon as the pacer allows, which on an idle 10 Mbit/s path is about when that ACK comes back anyway)
    assert _flags_sent_before_their_data_was_acked(tmp_path / "fence", messages) == 0


def _flags_sent_before_their_data_was_acked(rundir, messages) -> int:
    """From the senders' own records: flags whose first packet left before the write before them was acked."""
    sent = {}
    for host in {m.src for m in messages}:
        sent.update(HostResult.read(rundir / f"{host}.json").sent)
    return sum(1 for m in messages if m.op == "send" and sent[str(m.id)].first_tx_ns < sent[str(m.id - 1)].acked_ns)


@pytest.mark.parametrize("processes", [1, 3, 0])
def test_agents_sharing_processes_deliver_as_one_per_host(emu, tmp_path, processes):
    """Hosts served from shared processes (each host's sockets opened in its own namespace) deliver the same
    messages as one process per host; the CPU is counted once per process."""
    messages = patterns.generate("moe", emu.fabric, **SMALL["moe"])
    hosts = schedule.hosts_of(messages)
    shared = transfer(emu, messages, tmp_path / "shared", TransportOptions(agent_processes=processes), quiet=True)
    alone = transfer(emu, messages, tmp_path / "alone", TransportOptions(agent_processes=len(hosts)), quiet=True)
    assert shared.lost_messages == alone.lost_messages == 0
    assert shared.duplicate_or_unexpected == alone.duplicate_or_unexpected == 0
    assert [r["bytes"] for r in shared.messages] == [r["bytes"] for r in alone.messages]
    pids = {HostResult.read(tmp_path / "shared" / f"{h}.json").pid for h in hosts}
    assert len(pids) == min(len(hosts), processes or os.cpu_count())
    assert len({HostResult.read(tmp_path / "alone" / f"{h}.json").pid for h in hosts}) == len(hosts)
    assert 0 < shared.agents_cpu_s


def test_coalesced_acks_deliver_everything_with_fewer_acks(emu, tmp_path):
    """ack_every 4 with a window of 2: the held ACKs are flushed by the agents' timer (no retransmission
    timeout waits for them), and fewer ACKs carry the same deliveries. Every such ACK was held for 4 packet
    times, which the receiver echoes and the sender takes off: the round trips stay the fabric's."""
    messages = patterns.generate("permutation", emu.fabric, size=200 * 1024)
    acks, rtt_us = {}, {}
    for every in (1, 4):
        m = transfer(emu, messages, tmp_path / str(every), TransportOptions(window=2, ack_every=every), quiet=True)
        assert m.lost_messages == 0 and m.packets.timeouts == 0, m.packets
        acks[every] = sum(HostResult.read(tmp_path / str(every) / f"{h}.json").acks.sent
                          for h in schedule.hosts_of(messages))
        rtt_us[every] = m.rtt_us["p50"]
        data = m.packets.received
    assert acks[1] >= data and acks[4] < 0.75 * acks[1], acks
    host = messages[0].src
    packet_us = (emu.fabric.mtu + wire.ETH) * 8 / emu.fabric.link(host, emu.fabric.nic_links(host)[0][0])["bps"] * 1e6
    assert rtt_us[4] < rtt_us[1] + packet_us, (rtt_us, packet_us)


def test_compiled_agents_deliver_as_the_source(emu, tmp_path):
    """The mypyc build of the hot path (traffic.hotpath) and its source, through real sockets and OVS: the same
    messages delivered, whole and once, and each run says which code its agents ran."""
    hotpath.current() or hotpath.build()
    messages = patterns.generate("moe", emu.fabric, **SMALL["moe"])
    runs = {code: transfer(emu, messages, tmp_path / code, TransportOptions(agent_code=code), quiet=True)
            for code in ("compiled", "python")}
    for code, m in runs.items():
        assert m.agent_code == code
        assert m.lost_messages == 0 and m.duplicate_or_unexpected == 0 and m.wrong_size == 0
    assert [r["bytes"] for r in runs["compiled"].messages] == [r["bytes"] for r in runs["python"].messages]
    assert all(json.loads((tmp_path / "compiled" / f"{h}.json").read_text())["wakeups"] > 0
               for h in schedule.hosts_of(messages))


def test_pulled_incast_delivers_everything_on_grants(emu, tmp_path):
    """cc pull through real OVS: the receiver grants, the senders ask, and every message arrives once."""
    messages = patterns.generate("incast", emu.fabric, senders=6, size=128 * 1024)
    m = transfer(emu, messages, tmp_path, TransportOptions(cc="pull", entropy="spray"), quiet=True)
    assert m.lost_messages == 0 and m.duplicate_or_unexpected == 0 and m.wrong_size == 0
    agents = {h: HostResult.read(tmp_path / f"{h}.json") for h in schedule.hosts_of(messages)}
    receiver = messages[0].dst
    assert agents[receiver].pull.grants_sent > 0
    assert all(agents[m.src].pull.requests_sent > 0 for m in messages)


def test_agents_past_the_deadline_are_stopped_and_named_with_the_reason(emu, tmp_path):
    """A transfer that cannot finish in its timeout: the agents still sending are stopped and each host is named
    with why, beside the messages they did not deliver (not only a count of lost messages)."""
    messages = patterns.generate("incast", emu.fabric, senders=4, size=4 * 1024 * 1024)  # seconds at 10 Mbit/s
    m = transfer(emu, messages, tmp_path, TransportOptions(), timeout_s=1.0, quiet=True)
    assert m.lost_messages > 0 and m.agents_timed_out
    assert set(m.agents_timed_out) <= {msg.src for msg in messages} | {msg.dst for msg in messages}
    assert all("deadline" in why for why in m.agents_timed_out.values())
