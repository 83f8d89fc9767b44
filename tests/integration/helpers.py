"""What the integration tests share: machine snapshots for leak checks, counters, and in-host tools."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from emulator.model.fabric import up_neighbours
from emulator.net import marking, ovs
from emulator.net.monitor import counter_delta
from emulator.net.runstate import RUN_ROOT
from traffic.udpprobe import command, last_json

REPO = Path(__file__).resolve().parents[2]


def stock(what: str, present: bool) -> None:
    """A stock-kernel test's feature: skipped with the reason where the kernel lacks it (conftest turns the skip
    into a failure in make vm-check's guest, where every one must be present)."""
    if not present:
        pytest.skip(f"this kernel has no {what} (a stock kernel has: make vm-check)")


OURS = ("mininet:", str(RUN_ROOT), "controllers.harness", "iperf3", "traffic.udpprobe", "traffic.serve",
        "traffic.tcpagent", "traffic.pcapreplay")


def net_namespaces() -> set[str]:
    """Every network namespace a process is in, other than ours: Mininet's are anonymous (no `ip netns` name),
    so a leaked one shows only here."""
    mine = os.readlink("/proc/self/ns/net")
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.add(os.readlink(entry / "ns" / "net"))
            except OSError:
                continue
    return found - {mine}


def snapshot() -> dict[str, set]:
    """What a run could leave behind: OVS bridges, root-namespace links, namespaces, Mininet shells,
    controller processes, private OVS daemons (their files are in the run directory), run directories."""
    bridges = set(subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout.split())
    # ovs-netdev is OVS's own userspace-datapath device: it comes with the first netdev bridge on the machine
    # and OVS removes it lazily after the last one, so it is not ours to count.
    links = set(os.listdir("/sys/class/net")) - {"ovs-netdev", "ovs-system"}
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    procs = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(mark in cmdline for mark in OURS):
                procs.add((entry.name, cmdline))
    runs = {p.name for p in RUN_ROOT.glob("*") if p.is_dir()} if RUN_ROOT.exists() else set()
    rcu = Path("/sys/kernel/rcu_expedited")  # teardown expedites RCU for a while and must put it back
    settings = {f"rcu_expedited={rcu.read_text().strip()}"} if rcu.exists() else set()
    # A shared-daemon run enlarges the machine's vswitchd's send buffer and must put it back.
    settings.add(f"ovs_sndbuf_enlarged={(ovs.set_send_buffer(None) or 0) >= ovs.SEND_BUFFER}")
    settings.add(f"bpffs_mounted={marking.bpffs_mounted()}")  # a run mounts it for the ECN marker if absent
    pins = {p.name for p in marking.PIN_DIR.glob("mpft_ecn_*")}  # and pins the marker's maps there
    return {"bridges": bridges, "links": links, "netns": netns, "procs": procs, "runs": runs, "settings": settings,
            "namespaces": net_namespaces(), "pins": pins}


def leaks(before: dict[str, set], after: dict[str, set]) -> dict[str, set]:
    return {k: after[k] - before[k] for k in before if after[k] - before[k]}


delta = counter_delta
probe_cmd = command


def run_json(host, command_line: str) -> dict:
    return last_json(host.cmd(command_line))


def ping_all(emu, hosts: list[str]) -> list[str]:
    """Every host pings every other once (all sources in parallel); returns the failures."""
    fabric = emu.fabric
    for src in hosts:
        targets = " ".join(fabric.ip(d) for d in hosts if d != src)
        emu.host(src).sendCmd(f"for ip in {targets}; do ping -c1 -W2 -q $ip >/dev/null || echo FAIL $ip; done")
    failures = []
    for src in hosts:
        out = emu.host(src).waitOutput()
        failures += [f"{src}->{fabric.host_by_ip(line.split()[1])}" for line in out.splitlines()
                     if line.startswith("FAIL")]
    return failures


SRC, DST = "n0g0", "n15g0"  # plane 0: leaf 0 -> leaf 3


def send_and_count(emu, packets, flows=1, vary=False, rate=2000):
    """UDP SRC->DST with a sink at DST; returns (sent, received)."""
    sink = emu.host(DST)
    sink.sendCmd(probe_cmd("sink", "--seconds", f"{packets * flows / rate + 30:.1f}",
                           "--expect", str(packets * flows)))
    said, deadline = "", time.monotonic() + 60  # the sender starts once the sink is bound (a slow VM's is slow)
    while '"listening"' not in said:
        assert time.monotonic() < deadline, f"the UDP sink did not start: {said!r}"
        said += sink.monitor(timeoutms=500)
    args = ["send", "--dst", emu.fabric.ip(DST), "--flows", str(flows), "--packets", str(packets),
            "--rate", str(rate), *(["--entropy", "16"] if vary else [])]
    sent = run_json(emu.host(SRC), probe_cmd(*args))["sent"]
    received = last_json(sink.waitOutput())["received"]
    return sent, received


def uplinks(fabric, leaf):
    """Spine -> the leaf's interface toward it."""
    return {spine: fabric.intf(leaf, spine) for spine in up_neighbours(fabric, leaf)}
