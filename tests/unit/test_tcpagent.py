"""The TCP agent without root: real agent processes on loopback addresses of this namespace (each listens on its
host's own address, so they share the port), driven through ready/go/done as the runner drives them, summarised
by the runner; the frame reader on arbitrary cuts of a stream; an unknown kernel algorithm refused up front."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from emulator.model import schedule, topologies
from emulator.model.errors import UserError
from emulator.model.schedule import Message
from emulator.net import features
from emulator.run.launch import check_options, summarise
from traffic.contract import AgentConfig, Egress, HostInfo, HostResult
from traffic.options import TransportOptions
from traffic.tcpagent import ACK, DATA, HEADER, Frame, FrameReader, ProtocolError

ROOT = Path(__file__).resolve().parents[2]
IPS = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}


def _run(tmp_path: Path, messages: list[Message], hosts: list[str] | None = None, cc: str = "none",
         deadline_s: float = 10.0) -> tuple[dict[str, HostResult], dict]:
    """Run `messages` with one tcpagent per host, as emulator.run.launch.transfer does; the agents' results and
    the summary."""
    hosts = hosts or schedule.hosts_of(messages)
    options = TransportOptions(transport="tcp", cc=cc)
    schedule.write(tmp_path / "schedule.jsonl", messages)
    table = {h: HostInfo(IPS[h], Egress(1e9), plane=0) for h in IPS}
    AgentConfig(str(tmp_path), str(tmp_path / "schedule.jsonl"), table, options, seed=1, deadline_s=deadline_s,
                ready_timeout_s=10).write(tmp_path / "agent.json")
    procs = {h: subprocess.Popen([sys.executable, "-m", "traffic.tcpagent", "--config", str(tmp_path / "agent.json"),
                                  "--host", h], cwd=ROOT, stderr=subprocess.PIPE) for h in hosts}
    try:
        _wait(tmp_path, hosts, "ready", procs)
        t0 = time.monotonic_ns() + 100_000_000
        (tmp_path / "go.tmp").write_text(str(t0))
        (tmp_path / "go.tmp").rename(tmp_path / "go")
        _wait(tmp_path, hosts, "done", procs, deadline_s + 1)
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
        for p in procs.values():
            # as the runner: a TERM that lands while an agent is already exiting (handlers reset) is fine too
            assert p.wait(timeout=10) in (0, -signal.SIGTERM), p.stderr.read().decode()
            p.stderr.close()
    results = {h: HostResult.read(tmp_path / f"{h}.json") for h in hosts}
    return results, summarise(messages, results, t0, options).to_dict()  # as traffic.json has it


def _wait(tmp_path: Path, hosts: list[str], what: str, procs: dict, timeout_s: float = 10.0) -> None:
    """Until every host has written `<host>.<what>`, an agent has exited (its deadline) or the timeout."""
    give_up = time.monotonic() + timeout_s
    while not all((tmp_path / f"{h}.{what}").exists() for h in hosts) and time.monotonic() < give_up:
        if any(p.poll() is not None for p in procs.values()):
            return
        time.sleep(0.01)


# a -> b (0), then b -> c once b has it (1), then c -> a once c has it (2); a -> c once 0 is acknowledged (3);
# two more a -> b on 0's connection, in order (4, 5); a 3 MB b -> a beside them (6); a -> b on another qp (7)
CHAIN = [Message(0, 0.0, "a", "b", 200_000),
         Message(1, 0.0, "b", "c", 100_000, deps=(0,)),
         Message(2, 0.0, "c", "a", 50_000, tclass=3, deps=(1,)),
         Message(3, 0.0, "a", "c", 1, qp=2, deps=(0,)),
         Message(4, 0.01, "a", "b", 70_000),
         Message(5, 0.01, "a", "b", 1_000),
         Message(6, 0.02, "b", "a", 3_000_000, op="send"),
         Message(7, 0.05, "a", "b", 5_000, qp=7, tag="late")]


def test_every_message_delivered_once_in_dependency_order(tmp_path):
    results, metrics = _run(tmp_path, CHAIN, cc="reno")
    assert metrics["lost_messages"] == metrics["duplicate_or_unexpected"] == metrics["wrong_size"] == 0
    sent = {int(i): s for r in results.values() for i, s in r.sent.items()}
    got = {int(i): d for r in results.values() for i, d in r.received.items()}
    assert sorted(sent) == sorted(got) == [m.id for m in CHAIN]
    t0 = results["a"].t0_ns
    for m in CHAIN:
        s, d = sent[m.id], got[m.id]
        assert d.bytes == m.bytes and results[m.dst].expected == sum(x.dst == m.dst for x in CHAIN)
        assert t0 + m.start_s * 1e9 <= s.posted_ns <= s.first_tx_ns <= d.first_rx_ns <= d.delivered_ns
        assert d.delivered_ns <= s.acked_ns and 0 < d.one_way_ns <= d.delivered_ns - s.posted_ns
    assert sent[1].posted_ns >= got[0].delivered_ns  # b waited for what it received
    assert sent[2].posted_ns >= got[1].delivered_ns
    assert sent[3].posted_ns >= sent[0].acked_ns  # a waited for what it sent
    assert got[4].delivered_ns <= got[5].first_rx_ns  # one connection: in posting order
    assert metrics["packets"]["data"] > 0 and metrics["packets"]["received"] > 0
    assert metrics["rtt_us"]["count"] == len(CHAIN) and metrics["by_tag"]["late"]["messages"] == 1
    assert {c["algorithm"] for r in results.values() for c in r.cc.values()} == {"reno"}
    assert set(results["a"].cc) == {"b/1", "c/2", "b/7"}


def test_cc_none_keeps_the_kernel_default(tmp_path):
    results, metrics = _run(tmp_path, [Message(0, 0.0, "a", "b", 10_000)])
    default = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    assert metrics["lost_messages"] == 0 and results["a"].cc["b/1"]["algorithm"] == default


def test_an_absent_peer_loses_its_messages_and_the_agent_still_reports(tmp_path):
    """c runs no agent: nothing listens on its address, the connection fails, the message counts as lost."""
    results, metrics = _run(tmp_path, [Message(0, 0.0, "a", "b", 1_000), Message(1, 0.0, "a", "c", 1_000)],
                            hosts=["a", "b"], deadline_s=3.0)
    assert metrics["lost_messages"] == 1 and results["a"].tx.send_errors == 1
    assert results["a"].sent["1"].acked_ns == 0 and results["b"].received["0"].bytes == 1_000


def _frames(spec: list[tuple[bool, int, int]]) -> bytes:
    return b"".join(HEADER.pack(DATA if data else ACK, i, size, 7) + bytes(size) for data, i, size in spec)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**40), st.integers(0, 3000)), max_size=8),
       st.lists(st.integers(1, 5000), max_size=20))
def test_frames_survive_any_cut_of_the_stream(spec, cuts):
    stream, reader, frames, at, now = _frames(spec), FrameReader(), [], 0, 0
    for cut in [*cuts, len(stream)]:
        now += 1
        frames += reader.feed(memoryview(stream)[at:at + cut], now)
        at += cut
    assert [(f.magic == DATA, f.id, f.bytes, f.tx_ns) for f in frames] == [(d, i, s, 7) for d, i, s in spec]
    assert all(isinstance(f, Frame) and f.first_rx_ns <= now for f in frames)


def test_a_stream_that_is_not_frames_is_refused():
    with pytest.raises(ProtocolError):
        FrameReader().feed(memoryview(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n"), 1)


def test_a_congestion_control_the_kernel_lacks_is_refused_before_starting(monkeypatch):
    monkeypatch.setattr(features, "tcp_congestion_controls", lambda: ["reno", "cubic"])
    fabric = topologies.build("ft2", leaves=2, spines=1, hosts_per_leaf=1)
    with pytest.raises(UserError, match="no TCP congestion control 'dctcp'.*reno, cubic") as refused:
        check_options(TransportOptions(transport="tcp", cc="dctcp"), fabric)
    assert refused.value.field == "cc"
    for cc in ("reno", "none"):
        check_options(TransportOptions(transport="tcp", cc=cc), fabric)
