"""Integration tier: controller faults. Killed mid-run, the controller leaves switches forwarding on their rules
(fail-mode secure, hosts with static neighbours); restarted, it resynchronises in place: the same flows and
groups as before, none duplicated, rules it would not install swept away, not one packet lost across the kill
and the restart, and links that failed meanwhile routed around. A datapath
the model does not know and bytes that are not OpenFlow are logged and ignored."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time

import pytest

from emulator.model import topologies
from emulator.net.emulation import Emulation
from emulator.net.switchd import netns_path
from tests.integration.helpers import send_and_count
from traffic.netns import entered

pytestmark = pytest.mark.root
STATS = re.compile(r"(duration|n_packets|n_bytes|idle_age|hard_age)=[^,\s]+,?\s*")


def _state(emu) -> dict[str, tuple[list[str], list[str]]]:
    """Every switch's flows and groups as OVS prints them, counters removed, sorted."""
    def dump(what: str, switch: str) -> list[str]:
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", what, emu.ofctl_target(switch)], capture_output=True,
                             text=True, check=True).stdout
        return sorted(STATS.sub("", line).strip() for line in out.splitlines()[1:] if line.strip())
    return {s: (dump("dump-flows", s), dump("dump-groups", s)) for s in emu.fabric.switches()}


@pytest.fixture(scope="module")
def emu():
    with Emulation(topologies.build(), app="spray", quiet=True) as running:  # send_and_count's hosts
        yield running


def test_kill_and_restart_lose_nothing_and_leave_the_same_rules(emu):
    before = _state(emu)
    assert all(flows for flows, _ in before.values())
    assert all(before[leaf][1] for leaf in emu.fabric.switches(role="leaf"))  # spraying groups
    outage: dict[str, float] = {}

    def crash_and_recover() -> None:
        time.sleep(0.5)
        emu.kill_controller()
        outage["killed"] = time.monotonic()
        time.sleep(1.0)
        emu.restart_controller()
        outage["synced"] = time.monotonic()

    faults = threading.Thread(target=crash_and_recover)
    faults.start()
    sent, received = send_and_count(emu, 4000, flows=4, vary=True, rate=1000)  # 4 s across the outage
    faults.join()
    assert outage["synced"] > outage["killed"]
    assert received == sent == 4000 * 4
    after = _state(emu)
    assert after == before  # nothing duplicated, nothing stale, nothing missing


def test_a_restarted_controller_sweeps_what_it_would_not_install(emu):
    """Flows and a group left behind (planted while no controller runs) are removed when it comes back; its own
    rules are untouched."""
    before = _state(emu)
    emu.kill_controller()
    for command, switch, rule in (("add-flow", "p0l0", "priority=30000,ip,nw_dst=10.99.0.1,actions=drop"),
                                  ("add-group", "p0l0", "group_id=4000,type=select,bucket=actions=drop"),
                                  ("add-flow", "p0s1", "table=1,priority=5,udp,tp_src=7,actions=drop")):
        subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", command, emu.ofctl_target(switch), rule], check=True)
    assert _state(emu) != before
    emu.restart_controller()
    deadline = time.monotonic() + 10
    while _state(emu) != before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _state(emu) == before


def test_unknown_datapaths_and_garbage_are_ignored(emu):
    """A stranger bridge on plane 0's daemon, and garbage sent from the controller's own namespace."""
    with entered(netns_path(emu.switchd.control_netns)):
        garbage = socket.create_connection((emu.controller.host, emu.controller.port), timeout=5)
    with garbage:
        garbage.sendall(b"\x04\x00\x00\x08\xff\xff\xff\xff" + b"not openflow at all" * 50)
        time.sleep(0.5)
    stranger = "mpftstr0"
    daemon = emu.switchd.instance_of("p0l0")
    daemon.vsctl(["add-br", stranger, "--", "set", "bridge", stranger, "datapath_type=netdev",
                  "other-config:datapath-id=00000000deadbeef", "fail_mode=secure",
                  "--", "set-controller", stranger, emu.controller.target])
    try:
        deadline = time.monotonic() + 15
        while "ignoring datapath" not in emu.controller.log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "ignoring datapath" in emu.controller.log_file.read_text()
    finally:
        daemon.vsctl(["--if-exists", "del-br", stranger])
    assert emu.controller.proc.poll() is None
    sent, received = send_and_count(emu, 500, vary=True)
    assert received == sent == 500


def test_a_restarted_controller_learns_of_a_link_that_failed_while_it_was_away(emu):
    """A spine loses its link to the far leaf while no controller runs: only the controller can steer the other
    leaves away (no local alternative), so the restarted one must ask the switches which ports are down."""
    emu.kill_controller()
    emu.fail_link("p0s0", "p0l3")  # SRC's leaf p0l0 -> DST's leaf p0l3 via spine p0s0 is now a dead end
    try:
        emu.restart_controller()
        time.sleep(0.5)  # the port descriptions arrive after the first sync
        sent, received = send_and_count(emu, 2000, flows=4, vary=True, rate=1000)
        assert received == sent == 2000 * 4
    finally:
        emu.restore()
