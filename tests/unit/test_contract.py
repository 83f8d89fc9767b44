"""The records processes hand each other survive their trip as JSON whole (the agent's config, a host's result, a
server's report, a variant's options), and nothing in emulator/run or traffic reads one by string key: mypy,
which knows their types, finds no such read."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path

import pytest

from emulator.model import topologies
from emulator.model.records import from_dict
from emulator.run import metrics
from emulator.run.launch import AgentsStart, RunSettings, Stopped, host_table
from emulator.study import scenario
from traffic import contract
from traffic.contract import (
    Acks,
    AgentConfig,
    CpuTimes,
    Datagrams,
    Delivery,
    EcnCounts,
    HostResult,
    OrderingCounts,
    PullCounts,
    Rx,
    Sent,
    Tx,
)
from traffic.options import TransportOptions

ROOT = Path(__file__).resolve().parents[2]


def _trip(record):
    """Through JSON and back, as between two processes."""
    return from_dict(type(record), json.loads(json.dumps(asdict(record))))


def test_the_agents_config_comes_back_whole(tmp_path):
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)  # NVLink peers
    config = AgentConfig(str(tmp_path), str(tmp_path / "schedule.jsonl"), host_table(fabric, fabric.hosts()),
                         TransportOptions(cc="pull", entropy="spray", window=9).for_fabric(fabric), seed=3,
                         deadline_s=12.5, ready_timeout_s=60, mtu=fabric.mtu, queue_bytes=fabric.queue_bytes,
                         ecn=True, netns={h: f"ns-{h}" for h in fabric.hosts()})
    config.write(tmp_path / "agent.json")
    back = AgentConfig.read(tmp_path / "agent.json")
    assert back == config
    host = back.hosts[fabric.hosts()[0]]
    assert host.egress_bps.nvlink and host.ports and isinstance(back.transport, TransportOptions)


def test_a_hosts_result_comes_back_whole(tmp_path):
    result = HostResult("n0g0", 7, sent={"1": Sent(10, 11, 20, 2)}, received={"2": Delivery(30, 25, 900, 5, 28)},
                        expected=1, unexpected=1, wrong_size=1, rtt_us=[1.5, 2.0], rtt_seen=9,
                        timer_lateness_us={"p99": 3.0}, pid=42, cpu_s=0.5, traffic_cpu_s=CpuTimes(0.1, 0.2, 0.3),
                        rx=Rx(5, 1, 2, 1, {"1": 2}, 3), tx=Tx(*range(1, 12)), acks=Acks(4, 5),
                        datagrams=Datagrams(9, 8, 1), ecn=EcnCounts(1, 2, 3), pull=PullCounts(4, 5, 6),
                        ordering=OrderingCounts("fence", 1, 2), cc={"n1g0/1": {"cwnd": 4.0}},
                        scheduling="realtime", code="compiled", wakeups=77)
    assert all(getattr(result, f.name) != getattr(HostResult("x", 0), f.name) for f in fields(HostResult))
    result.write(tmp_path)
    assert HostResult.read(tmp_path / "n0g0.json") == result


def test_a_servers_report_and_the_start_it_answers_come_back_whole():
    summary = metrics.ServerSummary(cpu_bound=True, cpu_idle=0.1, cpu_free=0.4, detail="d",
                                    tunnels={"t": {"tx_packets": 3}}, clock_drift={"ppm": 2.0})
    report = metrics.ServerReport(summary, {"p1l0-eth1": 900}, {"p1l0-eth1": 2}, {"p1l0": {"marked": 1}},
                                  {"log": [[1, "p1l0-eth1", "on", 0]]},
                                  metrics.ServerSamples(5, [[0.5, "link_util", "p1l0-eth1", 0.9]], {"p1l0-eth1": [0.9]},
                                                        {"1": [[0.5, 9.0]]}, [[1.0, 0.5, 0.6, 0.1, 0.2]]))
    stopped = Stopped({"n1g0,n1g1": "died"}, {"n1g0": HostResult("n1g0", 3, rx=Rx(packets=2))}, report)
    assert _trip(stopped) == stopped
    start = AgentsStart(["n1g0"], ["n0g0", "n1g0"], RunSettings(2, TransportOptions(cc="dcqcn"), 30.0), "{}\n")
    assert _trip(start) == start


def test_every_builtin_variants_options_come_back_whole():
    for name in scenario.builtin_names():
        for variant in scenario.load(name).variants:
            assert _trip(variant.options) == variant.options, (name, variant.name)


RECORDS = sorted({cls.__name__ for cls in vars(contract).values() if is_dataclass(cls) and isinstance(cls, type)}
                 | {"ServerReport", "ServerSummary", "ServerSamples", "Stopped", "AgentsStart", "RunSettings",
                    "TransportOptions"})
PROBE = """from traffic.contract import HostResult


def reads(result: HostResult) -> object:
    return result["tx"], result.get("rx"), result.pop("sent")
"""


def test_no_record_is_read_by_string_key_in_the_run_layer_or_the_agents(tmp_path):
    """mypy checks every function body (annotated or not) in emulator/run and traffic: a read of one of these
    records by key is an [index] or [attr-defined] error that names the record. The probe shows it would be."""
    pytest.importorskip("mypy")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    done = subprocess.run([sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
                           "--check-untyped-defs", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
                           "emulator/run", "traffic", str(probe)], cwd=ROOT, capture_output=True, text=True)
    keyed = [line for line in done.stdout.splitlines() if ("[index]" in line or "[attr-defined]" in line)
             and any(f'"{name}"' in line for name in RECORDS)]
    assert sum(str(probe) in line for line in keyed) == 3, done.stdout
    assert [line for line in keyed if str(probe) not in line] == []
