"""Stock-kernel tier: the paths only a stock kernel has (netem, RED, DCTCP, the kernel datapath's limits), run where
the kernel has them and skipped with the reason where not; `make vm-check` runs them (and the other tests marked
stock_kernel) in a Debian 12 guest, where a skip is a failure. The kernel datapath's routing checks are
tests/integration/test_routing_apps.py's, run on both datapaths; the eBPF marker built for kernels without
bpf_get_netns_cookie in tc programs is tests/integration/test_ecn_marking.py's `loaded`, both ways, and RED's
marks are checked beside the eBPF marker's there."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys

import pytest

from emulator.model import topologies, wire
from emulator.model.errors import EnvironmentProblem, UserError
from emulator.model.schedule import Message
from emulator.net import features
from emulator.net.emulation import Emulation
from emulator.run.job import run_job
from emulator.study import runner, scenario
from tests.integration.helpers import REPO, stock
from traffic.options import TransportOptions

pytestmark = [pytest.mark.root, pytest.mark.stock_kernel]

ONE_PLANE = {"planes": 1, "nodes": 4, "leaves": 2, "spines": 2}
SRC, DST = "n0g0", "n3g0"  # leaf 0 to leaf 1: host, leaf, spine, leaf, host: four links each way


def _ping_ms(emu, dst_ip: str, count: int = 20) -> float:
    """The median round trip of `count` pings, in ms."""
    out = emu.host(SRC).cmd(f"ping -c {count} -i 0.2 -W 5", dst_ip)
    times = [float(t) for t in re.findall(r"time=([\d.]+) ms", out)]
    assert len(times) >= count * 0.9, out
    return statistics.median(times)


def test_netem_delay_adds_two_delays_per_link_to_the_round_trip():
    """With a delay at least 10x the base round trip on every link, the round trip grows by 2 x links x delay
    (within 10 %): each of the four links delays the ping and its reply."""
    stock("netem (link delay)", features.detect().link_delay)
    fabric = topologies.build("mpft", **ONE_PLANE)
    with Emulation(fabric, quiet=True) as emu:
        base = _ping_ms(emu, fabric.ip(DST))
    delay = max(5.0, round(10 * base, 1))
    slow = topologies.build("mpft", **ONE_PLANE, delay_ms=delay)
    with Emulation(slow, quiet=True) as emu:
        delayed = _ping_ms(emu, slow.ip(DST))
    expected = 2 * 4 * delay
    assert abs((delayed - base) - expected) <= 0.10 * expected, (base, delayed, delay)


def test_netem_loss_loses_as_often_as_the_links_should_and_the_transport_resends_it(tmp_path):
    """With loss p on every link, the share of data packets sent (first sends and resends) that never arrived,
    over >= 2,000, is within 30 % of 1 - (1 - p)^4: a packet crosses four lossy links; and every message
    completes. Counted from what was sent and what arrived, not from resends less spurious ones: an emulated
    guest's CPU stalls outlast the model's RTO (measured there, 204 of 463 resends spurious), and a spurious resend
    or its ACK lost on the way is not known to be spurious (a run there came out at 1.30x)."""
    stock("netem (link loss)", features.detect().link_loss)
    p = 0.02
    fabric = topologies.build("mpft", **ONE_PLANE, loss_pct=100 * p, mtu=1500)
    packets = 2500
    messages = [Message(0, 0.0, SRC, DST, packets * wire.payload_per_packet(fabric.mtu))]
    m = run_job(fabric, messages, tmp_path, app="ecmp", quiet=True, options=TransportOptions(min_rto_ms=1000))
    assert m.lost_messages == 0 and m.packets.data >= 2000
    expected = 1 - (1 - p) ** 4
    sent = m.packets.data + m.packets.retransmits
    lost = (sent - m.packets.received) / sent
    assert abs(lost - expected) <= 0.30 * expected, (lost, expected, m.packets)


def test_dctcp_is_among_the_cc_studys_tcp_variants_where_the_kernel_offers_it():
    stock("TCP DCTCP", "dctcp" in features.detect().tcp_congestion)
    study = scenario.load("cc")
    dctcp = [v for v in study.variants if v.options.transport == "tcp" and v.options.cc == "dctcp"]
    assert dctcp and dctcp[0].topology.get("ecn") is True


def test_fail_plane_on_the_kernel_datapath_is_refused_in_one_line(tmp_path):
    """The kernel forwards on the kernel datapath: there is no plane's daemon to freeze. Refused before a study
    starts (on the fault's line) and by the running emulation alike."""
    stock("OVS kernel datapath (openvswitch module)", features.detect().datapath == "kernel")
    text = """name = "t"
[topology]
planes = 2
nodes = 4
leaves = 2
spines = 2
[[traffic]]
pattern = "all-to-all"
[[variants]]
name = "a"
app = "ecmp"
[[faults]]
at_s = 0.1
action = "fail_plane"
plane = 1
"""
    with pytest.raises(UserError) as refused:
        runner.runnable(scenario.parse(text, "t.toml", tmp_path))
    assert refused.value.line == 15 and "fail_switch" in refused.value.message
    with Emulation(topologies.build("mpft", planes=2, nodes=4, leaves=2, spines=2), quiet=True) as emu:
        with pytest.raises(EnvironmentProblem, match="fail_switch instead"):
            emu.fail_plane(1)



def test_the_main_jobs_quick_study_completes_on_the_kernel_datapath(tmp_path):
    """`mpft run routing --quick` (what `sudo make run` runs) on the kernel datapath: every run completes with
    nothing lost, and the report states its answer; where the machine could not keep up (a guest under TCG) the
    verdict says CPU-BOUND rather than letting the runs count. One seed: every variant runs, and under TCG its
    three seeds took 23 of vm-check's 60 minutes."""
    stock("OVS kernel datapath (openvswitch module)", features.detect().datapath == "kernel")
    run = subprocess.run([sys.executable, "-m", "emulator.cli", "run", "routing", "--quick", "--seed", "1",
                          "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=3600)
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert all(v["lost_messages"] == 0 for v in metrics["variants"].values())
    assert "answer:" in run.stdout
    if metrics["fidelity"]["cpu_bound"]:
        assert "CPU-BOUND" in run.stdout
