"""Integration tier: the real traces in ../shared/traces replay on a small 2-plane MPFT (8 GPU hosts): HPCC's
flow.txt, ASTRA-sim's Chakra all-reduce workloads, and both pcaps (timing kept, no replies provoked); a Chakra
trace with process groups; and `mpft traffic` / `mpft replay` work end to end from the command line."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from emulator.model import topologies
from emulator.net.emulation import Emulation
from emulator.run.launch import transfer
from emulator.run.pcap import replay_pcap
from tests.chakra_proto import TP, tp_then_world, write_ranks
from tests.integration.helpers import REPO
from tests.traces import TRACES, needs_traces
from traffic import pcapreplay, traces
from traffic.options import TransportOptions

pytestmark = pytest.mark.root

SMALL = {"planes": 2, "nodes": 4, "leaves": 2, "spines": 2}



def test_cli_traffic_then_replay_of_its_recorded_schedule(tmp_path):
    """By the command line, on its own fabric: first in this module, before the module's emulation holds the
    run lock."""
    topo = ["--planes", "2", "--nodes", "4", "--leaves", "2", "--spines", "2"]
    first = subprocess.run([sys.executable, "-m", "emulator.cli", "traffic", "incast", "-p", "senders=3",
                            "-p", "size=65536", "--out", str(tmp_path / "a"), *topo],
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert "lost messages 0" in first.stdout
    second = subprocess.run([sys.executable, "-m", "emulator.cli", "replay", str(tmp_path / "a" / "schedule.jsonl"),
                             "--cc", "rtt", "--out", str(tmp_path / "b"), *topo],
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "b" / "schedule.jsonl").read_text() == (tmp_path / "a" / "schedule.jsonl").read_text()
    assert json.loads((tmp_path / "b" / "traffic.json").read_text())["lost_messages"] == 0


@needs_traces
def test_the_replay_recipe_in_the_readme_runs_as_written(tmp_path):
    """traffic/README.md's recipe, its commands, scenario and pandas lines taken from the text (so the text cannot go
    stale), in a directory holding the trace: the run, the study and the DataFrame of its runs."""
    text = (REPO / "traffic" / "README.md").read_text().split("## Replaying a trace, end to end")[1].split("\n## ")[0]
    commands = [shlex.split(line) for line in re.findall(r"^    sudo \.venv/bin/(mpft .+)$", text, re.M)]
    [toml] = re.findall(r"```toml\n(.*?)```", text, re.S)
    [python] = re.findall(r"```python\n(.*?)```", text, re.S)
    for rank in TRACES.glob("astrasim_custom_allreduce_8npus_1MB.*.et"):
        (tmp_path / rank.name).symlink_to(rank)
    (tmp_path / "replay.toml").write_text(toml)
    assert [c[:2] for c in commands] == [["mpft", "replay"], ["mpft", "run"]]
    for argv in commands:
        done = subprocess.run([sys.executable, "-m", "emulator.cli", *argv[1:]], capture_output=True, text=True,
                              cwd=tmp_path, timeout=600)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert json.loads((tmp_path / "results/replay/traffic.json").read_text())["lost_messages"] == 0
    shown = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert {"ecmp", "spray", "ratio_to_bound"} <= set(shown.stdout.split())


@pytest.fixture(scope="module")
def emu():
    with Emulation(topologies.build("mpft", **SMALL), app="ecmp", quiet=True) as running:
        yield running


@needs_traces
@pytest.mark.parametrize("trace, scale", [("hpcc_mix_flow.txt", 1e-4),
                                          ("astrasim_all_reduce_4npus_1MB.0.et", 0.25),
                                          ("astrasim_custom_allreduce_8npus_1MB.0.et", 0.25)])
def test_message_traces_replay_without_loss(emu, tmp_path, trace, scale):
    messages, summary = traces.load_messages(TRACES / trace, emu.fabric, scale=scale)
    m = transfer(emu, messages, tmp_path, TransportOptions(cc="rtt"), quiet=True)
    assert m.lost_messages == 0 and m.duplicate_or_unexpected == 0, (summary, m)
    assert m.messages_total == len(messages) > 0


def test_a_chakra_trace_with_process_groups_replays_within_its_groups(emu, tmp_path):
    """Two tensor-parallel groups' all-reduces, then an all-to-all over the world, on the fabric's 8 GPUs."""
    write_ranks(tmp_path, [tp_then_world(r, with_metadata=False) for r in range(8)])
    (tmp_path / "groups.json").write_text(json.dumps(TP))
    messages, summary = traces.load_messages(tmp_path / "pg", emu.fabric, scale=4, comm_groups=tmp_path / "groups.json")
    assert "1 (ranks 0-3), 2 (ranks 4-7)" in summary
    m = transfer(emu, messages, tmp_path / "run", TransportOptions(), quiet=True)
    assert m.lost_messages == 0 and m.duplicate_or_unexpected == 0 and m.messages_total == len(messages) == 104


def _tcp_icmp_out(emu, host: str) -> tuple[int, int]:
    """The host stack's TCP resets and ICMP errors sent so far (/proc/net/snmp inside its namespace)."""
    lines = emu.host(host).cmd("cat /proc/net/snmp").splitlines()
    table = {}
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        proto = names.split(":")[0]
        table[proto] = dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=False))
    return table["Tcp"]["OutRsts"], table["Icmp"]["OutMsgs"]


@needs_traces
@pytest.mark.parametrize("pcap", ["zeek_wikipedia.pcap", "tcpreplay_test.pcap"])
def test_pcaps_replay_with_timing_and_no_replies(emu, tmp_path, pcap):
    plan = pcapreplay.plan(TRACES / pcap, emu.fabric)
    hosts = sorted(set(plan.addresses.values()))
    before = {h: _tcp_icmp_out(emu, h) for h in hosts}
    m = replay_pcap(emu, plan, tmp_path)
    assert m["sent"] == m["kept"] > 0 and m["send_failed"] == 0
    assert m["delivered"] == m["expected_delivered"] == m["kept"]
    assert m["replies"] == 0
    assert {h: _tcp_icmp_out(emu, h) for h in hosts} == before  # no reset, no ICMP error from any stack
    assert m["lag_max_s"] < 0.5 and m["duration_s"] > 1.0  # the pcap's seconds, not a burst
