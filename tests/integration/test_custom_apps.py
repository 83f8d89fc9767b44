"""Integration tier: apps that need a fabric of their own: static paths for a pattern, a user app by path (also
written against the Ryu API), and Ryu's own example apps unchanged."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controllers.static_paths import permutation, save_pattern
from emulator.model import topologies
from emulator.net.emulation import Emulation
from emulator.study.metrics import StudyMetrics
from tests.integration import ryu_examples
from tests.integration.helpers import REPO, delta, probe_cmd
from tests.integration.helpers import send_and_count as _send
from tests.integration.helpers import uplinks as _uplinks
from traffic.udpprobe import argv as probe_argv

pytestmark = pytest.mark.root
WORKED_EXAMPLE = REPO / "controllers" / "examples" / "least_loaded.toml"
# The worked example, quick (`sudo .venv/bin/mpft run controllers/examples/least_loaded.toml --quick --seeds 1,2,3`,
# twice, and this test once): least-loaded / spray 1.07-1.13 in 5 of 7 runs, 1.9-2.0 in 2 (both seed 1: placed
# greedily in the order flows arrive, a late flow can find only paths that carry one); ECMP / least-loaded 0.99-4.18.
PLACED_MARGIN = 1.25


def test_static_paths_are_collision_free_for_a_permutation(tmp_path):
    """The static app pins a shift permutation of plane 0 onto spines so that no two flows share a link."""


    fabric = topologies.build()
    pairs = permutation(fabric, plane=0, shift=4)  # every GPU of a leaf to the next leaf: 4 flows per leaf pair
    pattern = save_pattern(tmp_path / "pattern.json", pairs)
    used = {}
    with Emulation(fabric, app="static", app_env={"MPFT_PATTERN": str(pattern)}, quiet=True) as emu:
        for src, dst in pairs:
            leaf = fabric.nic_links(src)[0][0]
            up = _uplinks(fabric, leaf)
            before = emu.packet_counters(list(up.values()))
            sink = emu.host(dst)
            sink.sendCmd(probe_cmd("sink", "--seconds", "1.5"))
            emu.host(src).cmd("sleep 0.2")
            emu.host(src).cmd(probe_cmd("send", "--dst", fabric.ip(dst), "--flows", "8", "--packets", "5"))
            sink.waitOutput()
            moved = delta(before, emu.packet_counters(list(up.values())))
            [spine] = [s for s, intf in up.items() if moved[intf] >= 40]  # all 8 source ports on one spine
            used[(src, dst)] = (leaf, spine)
    links_up = [(leaf, spine) for leaf, spine in used.values()]
    links_down = [(spine, fabric.nic_links(dst)[0][0]) for (_src, dst), (_leaf, spine) in used.items()]
    assert len(set(links_up)) == len(links_up) == len(pairs)
    assert len(set(links_down)) == len(links_down)


@pytest.mark.parametrize("imports", ["os_ken", "ryu"])
def test_a_user_app_given_by_path_places_new_flows(tmp_path, imports):
    """The worked example loads by path, places each new flow on an uplink itself, and delivers everything; the
    same app written against the Ryu API (`from ryu...`) does the same on os-ken, unchanged otherwise."""
    app = tmp_path / "least_loaded.py"
    app.write_text((REPO / "controllers" / "examples" / "least_loaded.py").read_text()
                   .replace("from os_ken.", f"from {imports}."))
    with Emulation(topologies.build(), app=str(app), quiet=True) as emu:
        up = _uplinks(emu.fabric, "p0l0")
        before = emu.packet_counters(list(up.values()))
        sent, received = _send(emu, 10, flows=16, rate=400)
        used = [s for s, n in delta(before, emu.packet_counters(list(up.values()))).items() if n > 0]
        pinned = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-flows", emu.ofctl_target("p0l0"),
                                 "table=1,udp"], capture_output=True, text=True).stdout
    assert received == sent == 160
    assert len(used) >= 2
    assert pinned.count("udp") >= 16  # one exact-match flow per new flow


def test_adaptive_weights_move_away_from_a_hot_uplink():
    """A competing flow makes one of leaf 0's uplinks hot; within a few 100 ms polls its bucket weight in the
    leaf's select group falls below every idle uplink's."""
    import re

    fabric = topologies.build()
    with Emulation(fabric, app="adaptive", quiet=True) as emu:
        up = _uplinks(fabric, "p0l0")
        emu.host("n13g0").sendCmd(probe_cmd("sink", "--seconds", "8"))
        emu.popen("n1g0", probe_argv("send", "--dst", fabric.ip("n13g0"), "--size", "8000", "--packets", "800",
                                     "--rate", "120"))
        seen = []
        for _ in range(15):
            before = emu.packet_counters(list(up.values()))
            time.sleep(0.3)
            moved = delta(before, emu.packet_counters(list(up.values())))
            groups = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", emu.ofctl_target("p0l0")],
                                    capture_output=True, text=True).stdout
            weights = {int(p): int(w) for w, p in re.findall(r"weight:(\d+),[^,]*?,?actions=output:(\d+)", groups)}
            hot = max(moved, key=moved.get)
            hot_port = fabric.port("p0l0", next(s for s, i in up.items() if i == hot))
            seen.append((moved[hot], weights))
            if moved[hot] > 10 and weights and weights[hot_port] < min(w for p, w in weights.items() if p != hot_port):
                break
        else:
            raise AssertionError(f"weights never moved off the hot uplink: {seen[-3:]}")
        emu.host("n13g0").waitOutput()


@pytest.fixture(scope="module")
def ryu_apps():
    """Ryu 4.34's own example apps, fetched at set-up time (tests/integration/ryu_examples.py)."""
    return ryu_examples.fetch()


def test_ryus_simple_switch_13_runs_unchanged_on_a_loop_free_fabric(ryu_apps):
    """Not a FabricApp: ready once every switch has connected; it learns MACs from packet-ins and pings go."""
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=1)
    with Emulation(fabric, app=str(ryu_apps / "simple_switch_13.py"), quiet=True) as emu:
        assert emu.net.pingAll(timeout=2) == 0.0
        log = (emu.directory / "controller.log").read_text()
    assert "instantiating app" in log and "of SimpleSwitch13" in log and "packet in" in log


def test_ryus_spanning_tree_switch_runs_unchanged_on_a_looped_fabric(ryu_apps):
    """simple_switch_stp_13 imports ryu.app.simple_switch_13 (found beside it) and ryu.lib.stplib, whose port
    timers need Ryu's hub (eventlet): the leaves' two spines make loops, and once spanning tree has blocked them
    (its default timers: 30-50 s) every host reaches every other."""
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2)
    with Emulation(fabric, app=str(ryu_apps / "simple_switch_stp_13.py"), quiet=True) as emu:
        deadline = time.monotonic() + 120
        while (loss := emu.net.pingAll(timeout=1)) != 0.0 and time.monotonic() < deadline:
            time.sleep(3)
        log = (emu.directory / "controller.log").read_text()
    assert loss == 0.0, log[-2000:]
    assert "FORWARD" in log and "BLOCK" in log  # it forwards on a tree and blocks the rest


def _worked_example(out: Path) -> StudyMetrics:
    run = subprocess.run([sys.executable, "-m", "emulator.cli", "run", str(WORKED_EXAMPLE), "--quick", "--seed", "1",
                          "--out", str(out)], capture_output=True, text=True, cwd=REPO, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    return StudyMetrics.from_dict(json.loads((out / "metrics.json").read_text()))


def test_the_worked_example_compares_your_app_with_ecmp_and_spray_on_the_same_traffic(tmp_path):
    """controllers/README.md's scenario, run as a user would: the app placed every flow of the permutation that
    leaves a leaf (its controller.log, in the run directory), every run can be believed, and ECMP, whose hashes
    collide, is not sooner than the app's placement. A study the verdict rejected a run of is asked once more, as
    test_studies does, and the second must hold: in one CI run the spray run's switch daemons held packets 1.7
    packet times (0.4-0.55 in three runs here on a quiet machine)."""
    out = tmp_path / "study"
    m = _worked_example(out)
    if any(r.fidelity.cpu_bound or r.fidelity.unfaithful for _, r in m.runs()):
        out = tmp_path / "again"
        m = _worked_example(out)
    [placed_run] = [r for name, r in m.runs() if name == "least-loaded"]
    schedule = [json.loads(line) for line in (out / placed_run.dir / "schedule.jsonl").read_text().splitlines()]
    fabric = topologies.build("ft2", leaves=4, spines=4, hosts_per_leaf=4)
    leaf = {h: fabric.nic_links(h)[0][0] for h in fabric.hosts()}
    crossing = {(fabric.ip(msg["src"]), fabric.ip(msg["dst"])) for msg in schedule
                if leaf[msg["src"]] != leaf[msg["dst"]]}
    log = (out / placed_run.dir / "controller.log").read_text()
    placed = set(re.findall(r"placed ip_proto=17 ipv4_src=(\S+) ipv4_dst=(\S+) ", log))
    assert crossing and crossing <= set(placed), sorted(crossing - set(placed))
    for name, r in m.runs():
        assert not (r.fidelity.cpu_bound or r.fidelity.unfaithful), (name, r.fidelity.verdict)
    v = m.variants
    assert v["ecmp"].completion_s * PLACED_MARGIN >= v["least-loaded"].completion_s, m.comparisons
