"""Integration tier: the run lifecycle — CLI session, signals, a second run, crash and `mpft clean`."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emulator.model import topologies
from emulator.net import features, ovs, priority
from emulator.net.emulation import Emulation
from emulator.net.runstate import RUN_ROOT, RunState
from emulator.net.switchd import Instance, stop_daemons
from tests.integration.helpers import REPO, leaks, snapshot

pytestmark = pytest.mark.root

SMALL = ["--topo", "ft2", "--leaves", "2", "--spines", "2", "--hosts-per-leaf", "2"]
MPFT = [sys.executable, "-m", "emulator.cli"]

# A run that holds its fabric until signalled, then prints how it ended.
HOLDER = textwrap.dedent("""
    import json, sys, time
    from emulator.model import topologies
    from emulator.net.emulation import Emulation
    from emulator.model.errors import Terminated
    from emulator.net import features
    ecn = features.detect().ecn_marker == "bpf"  # the eBPF marker's maps and BPF filesystem are left too
    try:
        topo = dict(topo="ft2", leaves=2, spines=2, hosts_per_leaf=2) if len(sys.argv) < 2 else json.loads(sys.argv[1])
        with Emulation(topologies.build(**topo, ecn=ecn), quiet=True):
            print("up", flush=True)
            time.sleep(120)
    except (KeyboardInterrupt, Terminated) as exc:
        print("ended by", type(exc).__name__, flush=True)
""")


def _start_holder(*topo: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, *topo], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_up_runs_cli_commands_from_stdin_and_tears_down_on_eof():
    before = snapshot()
    run = subprocess.run([*MPFT, "up", *SMALL], input="pingall\n", capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "Results: 0% dropped" in run.stderr  # Mininet logs to stderr
    assert "torn down" in run.stdout
    assert leaks(before, snapshot()) == {}


@pytest.mark.parametrize("sig, name", [(signal.SIGTERM, "Terminated"), (signal.SIGINT, "KeyboardInterrupt")])
def test_a_signal_tears_the_fabric_down(sig, name):
    before = snapshot()
    proc = _start_holder()
    assert snapshot()["netns"] - before["netns"]  # the fabric is really up: its planes' namespaces exist
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=60)
    assert f"ended by {name}" in out
    assert leaks(before, snapshot()) == {}


def test_a_second_run_fails_fast_and_leaves_the_first_alone():
    fabric = topologies.build("ft2", leaves=2, spines=2, hosts_per_leaf=2)
    with Emulation(fabric, quiet=True) as emu:
        started = time.monotonic()
        second = subprocess.run([*MPFT, "up", *SMALL], input="", capture_output=True, text=True, cwd=REPO,
                                timeout=60)
        assert time.monotonic() - started < 15
        assert second.returncode == 2
        assert "another mpft run is active" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        out = emu.host("h0").cmd("ping -c1 -W2", fabric.ip("h3"))
        assert " 0% packet loss" in out


@pytest.mark.parametrize("daemons", ["per-plane", "shared"])
def test_clean_after_kill_removes_exactly_our_leftovers(daemons, tmp_path, monkeypatch):
    """Killed with -9, a run leaves its switch daemons, namespaces and run state (or its bridges on the
    machine's OVS); `mpft clean` removes those and nothing else: a foreign bridge, a foreign namespace and a
    private OVS instance that is not ours (with a bridge in it) all survive."""
    monkeypatch.setenv("MPFT_SWITCH_DAEMONS", daemons)
    foreign_ns = "mpfttest-foreign"
    subprocess.run(["ovs-vsctl", "add-br", "foreignbr0"], check=True)
    subprocess.run(["ip", "netns", "add", foreign_ns], check=True)
    decoy_state = RunState("decoy", 0, 0.0)
    decoy = Instance("decoy", tmp_path / "decoy-ovs", foreign_ns)
    try:
        decoy.start(decoy_state)
        decoy.vsctl(["add-br", "decoybr0", "--", "set", "bridge", "decoybr0", "datapath_type=netdev"])
        before = snapshot()
        holder = _start_holder()
        holder.kill()
        holder.wait()
        left = leaks(before, snapshot())
        assert left.get("runs")  # a crash leaves its run state, and its switches:
        assert (left.get("netns") and left.get("procs")) if daemons == "per-plane" else left.get("bridges")
        assert left.get("pins") or features.detect().ecn_marker != "bpf"
        clean = subprocess.run([*MPFT, "clean"], capture_output=True, text=True, cwd=REPO, timeout=120)
        assert clean.returncode == 0, clean.stderr
        assert "removed" in clean.stdout
        assert leaks(before, snapshot()) == {}
        assert "foreignbr0" in snapshot()["bridges"]
        assert foreign_ns in snapshot()["netns"]
        assert all(Path(f"/proc/{pid}").exists() for pid, _ in decoy_state.processes.values())
        assert "decoybr0" in decoy.vsctl(["list-br"]).split()
    finally:
        stop_daemons(decoy_state)
        subprocess.run(["ip", "netns", "del", foreign_ns], check=False)
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "foreignbr0"], check=False)


def test_the_next_run_removes_a_killed_runs_leftovers_first(caplog):
    """Without `mpft clean`, a run after a crash comes up (the killed run's NVLink bridges and switches would
    collide with its own by name), says what it removed, and leaves nothing of either behind."""
    small_mpft = dict(topo="mpft", planes=2, nodes=2, leaves=1, spines=1)
    before = snapshot()
    holder = _start_holder(json.dumps(small_mpft))
    holder.kill()
    holder.wait()
    assert leaks(before, snapshot()).get("runs")
    fabric = topologies.build(**small_mpft)
    with Emulation(fabric, quiet=True) as emu:
        first, *_, last = fabric.hosts()
        assert " 0% packet loss" in emu.host(first).cmd("ping -c1 -W2", fabric.ip(last))
    assert "a run that did not finish left these; removed" in caplog.text
    assert leaks(before, snapshot()) == {}


def test_clean_finds_a_runs_daemons_and_namespaces_without_its_state_file():
    """A run killed before its state file was complete (here: the file removed) is still cleaned: its private
    daemons and its controller are found by the files of its run directory they were started with, its
    namespaces by their names."""
    before = snapshot()
    holder = _start_holder()
    holder.kill()
    holder.wait()
    (run,) = snapshot()["runs"] - before["runs"]
    (RUN_ROOT / run / "state.json").unlink()
    left = leaks(before, snapshot())
    assert left.get("netns") and left.get("procs")
    clean = subprocess.run([*MPFT, "clean"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert "untracked processes and namespaces" in clean.stdout
    shutil.rmtree(RUN_ROOT / run)  # the directory of a run without a state file is not clean's to judge
    assert leaks(before, snapshot()) == {}


SENTINELS = {"net.core.wmem_max": "1234567", "net.core.rmem_max": "1234568", "net.core.netdev_max_backlog": "1003",
             "net.ipv4.neigh.default.gc_thresh3": "2047", "kernel.pty.max": "4099"}


def test_a_run_leaves_the_machines_sysctls_as_they_were():
    """Mininet's init raises these machine-wide and never restores them: set values it would change, bring a
    fabric up and down in a fresh process (where Mininet has not been initialised), and find them unchanged."""
    def read(key: str) -> str:
        return Path(f"/proc/sys/{key.replace('.', '/')}").read_text().strip()

    saved = {key: read(key) for key in SENTINELS}
    try:
        for key, value in SENTINELS.items():
            Path(f"/proc/sys/{key.replace('.', '/')}").write_text(value)
        code = ("from emulator.model import topologies\nfrom emulator.net.emulation import Emulation\n"
                "with Emulation(topologies.build('ft2', leaves=2, hosts_per_leaf=1, spines=1), quiet=True):\n"
                "    pass\n")
        run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert {key: read(key) for key in SENTINELS} == SENTINELS
    finally:
        for key, value in saved.items():
            Path(f"/proc/sys/{key.replace('.', '/')}").write_text(value)


def test_the_network_outranks_other_work_while_it_runs_and_the_machines_vswitchd_is_put_back():
    """Where the kernel groups sessions, a nice only ranks a process against other sessions through its group's:
    the controller's and the switch daemon's groups are at NETWORK_NICE during a run, and the machine's own
    ovs-vswitchd (shared daemons) goes back to its group's nice afterwards."""
    pid = ovs.read_pid()
    saved = priority.group_nice(pid) if pid else None
    if saved is None:
        pytest.skip("the machine's ovs-vswitchd runs in no session group (autogroup off, or no daemon)")
    try:
        priority.set_group_nice(pid, 0)
        with Emulation(topologies.build("ft2", leaves=2, hosts_per_leaf=1, spines=1), quiet=True,
                       switch_daemons="shared") as emu:
            assert priority.group_nice(pid) == priority.NETWORK_NICE
            assert emu.controller is not None and emu.controller.proc is not None
            assert priority.group_nice(emu.controller.proc.pid) == priority.NETWORK_NICE
        assert priority.group_nice(pid) == 0
    finally:
        priority.set_group_nice(pid, saved)


def test_a_host_line_the_kernel_refuses_is_our_bug_said_in_one_line_and_nothing_is_left(monkeypatch):
    """A refused tc line (Debian 12's tc refused our RED burst) is mpft-emu's mistake, not the user's: InternalError
    (exit 1 from the CLI) naming the host and tc's words, and the half-built fabric torn down."""
    from emulator.model.errors import InternalError
    from emulator.net.network import FabricNet
    real = FabricNet._tc_lines_of
    monkeypatch.setattr(FabricNet, "_tc_lines_of", lambda self, node: [*real(self, node), "qdisc frobnicate"])
    before = snapshot()
    with pytest.raises(InternalError) as refused:
        with Emulation(topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2), quiet=True):
            pass
    assert "host configuration refused: n" in str(refused.value) and "\n" not in str(refused.value)
    assert "frobnicate" in str(refused.value)
    assert leaks(before, snapshot()) == {}
