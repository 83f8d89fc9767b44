"""Integration tier: the main job, the plain-Mininet adapter with a standalone controller, doctor, the Python API
example, results handed to the sudo user, and captures."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from functools import partial

import pytest
from scapy.utils import rdpcap

from emulator.model import topologies, wire
from emulator.model.capture import MIN_SNAPLEN
from emulator.net.controller import free_port
from tests.integration.helpers import REPO, leaks, snapshot
from traffic import roce

pytestmark = pytest.mark.root
MPFT = [sys.executable, "-m", "emulator.cli"]


def test_tcp_alltoall_prints_goodput_beside_the_best_and_cleans_up(tmp_path):
    """Also: run under sudo, its results belong to the user who ran sudo."""
    before = snapshot()
    out = tmp_path / "out"
    run = subprocess.run([*MPFT, "alltoall", "--seconds", "3", "--out", str(out)], capture_output=True,
                         text=True, cwd=REPO, timeout=300, env={**os.environ, "SUDO_UID": "65534", "SUDO_GID": "65533"})
    assert run.returncode == 0, run.stderr
    assert {(p.stat().st_uid, p.stat().st_gid) for p in [out, *out.rglob("*")]} == {(65534, 65533)}
    assert "aggregate goodput" in run.stdout and "best" in run.stdout and "fidelity:" in run.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_flows"] == 0
    assert 0 < summary["aggregate_goodput_bps"] <= summary["aggregate_best_bps"] * 1.05
    rows = (out / "pairs.csv").read_text().splitlines()
    assert len(rows) == 1 + 32 * 30  # every GPU to every GPU on another node
    assert leaks(before, snapshot()) == {}


def test_plain_mininet_with_the_adapter_and_a_standalone_controller(tmp_path):
    from mininet.net import Mininet
    from mininet.node import OVSSwitch, RemoteController

    from emulator.net.mininet_topo import topos

    params = {"gpus": 2, "nodes": 4, "leaves_per_rail": 2, "spines": 2}
    model = tmp_path / "fabric.json"
    topologies.build("mrft", **params).save(model)
    port = free_port()
    controller = subprocess.Popen([*MPFT, "controller", "--fabric", str(model), "--port", str(port)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    before = snapshot()
    Mininet.inited = True  # keep Mininet from raising machine-wide sysctls
    net = Mininet(topo=topos["mrft"](**params), switch=partial(OVSSwitch, datapath="user"), build=False,
                  controller=partial(RemoteController, ip="127.0.0.1", port=port))
    try:
        deadline = time.monotonic() + 15  # the controller is listening before switches connect
        while True:
            listening = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
            ours = [line for line in listening.splitlines() if f":{port} " in line]
            if ours or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert ours and all("127.0.0.1:" in line for line in ours)  # loopback only
        net.build()
        net.start()
        assert net.waitConnected(timeout=30)
        time.sleep(2)  # flows installed on connect
        for host in net.hosts:  # plain Mininet leaves offloads on; the userspace datapath needs them off
            for intf in host.intfList():
                host.cmd(f"ethtool -K {intf} tx off rx off >/dev/null 2>&1")
        assert net.pingAll(timeout="2") == 0
    finally:
        net.stop()
        for node in net.controllers:  # Mininet's RemoteController.stop leaves its shell running
            node.terminate()
        controller.terminate()
        controller.wait(timeout=10)
    assert leaks(before, snapshot()) == {}


def test_doctor_reports_datapaths_qdiscs_and_what_is_unavailable():
    run = subprocess.run([*MPFT, "doctor", "--json"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["ovs_running"] and report["datapaths"]["user"]
    assert report["qdiscs"]["htb"] and report["uses"]["shaping"]
    assert report["uses"]["datapath"] == ("kernel" if report["datapaths"]["kernel"] else "user")
    # lossless links need the eBPF marker and tbf: listed as unavailable exactly when they are missing
    lossless = report["uses"].get("lossless")
    assert isinstance(lossless, bool)
    assert lossless != any("PFC" in item for item in report["unavailable"])


def test_the_quickstart_example_runs_a_pattern_and_reads_it_with_pandas(tmp_path):
    run = subprocess.run([sys.executable, "-m", "emulator.examples.quickstart", str(tmp_path)], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"completion [\d.]+ s, [\d.]+x the lower bound; 0 retransmissions", run.stdout), run.stdout
    assert "longest message completion (s) by sender:" in run.stdout
    assert len(re.findall(r"^h\d+\s+[\d.]+$", run.stdout, re.M)) == 4  # every sender's last message


def test_a_capture_of_the_hosts_nics_decodes_as_rocev2_and_counts_what_the_agents_sent(tmp_path):
    run = subprocess.run([*MPFT, "traffic", "permutation", "-p", "size=200000", "--topo", "ft2", "--leaves", "2",
                          "--hosts-per-leaf", "2", "--spines", "1", "--capture", "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"capture: \d+ frames on 4 interfaces in pcap/ \(0 the kernel dropped", run.stdout), run.stdout
    metrics = json.loads((tmp_path / "traffic.json").read_text())
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=1)
    sent = 0
    for host in fabric.hosts():
        frames = rdpcap(str(tmp_path / "pcap" / f"{host}-eth0.pcap"))
        assert len(frames) == metrics["captures"][f"{host}-eth0"]["packets"] > 0
        for frame in frames:
            layers = roce.decode(bytes(frame))  # cut to 106 bytes: BTH takes the last 4 as its ICRC, MPFTX whole
            assert len(bytes(frame)) <= MIN_SNAPLEN and layers.haslayer(roce.BTH)
            if layers[roce.BTH].opcode in wire.DATA_OPS and layers[roce.IP].src == fabric.ip(host):
                assert layers[roce.MPFTX].magic == wire.MAGIC
                sent += 1
    assert sent == metrics["packets"]["data"] + metrics["packets"]["retransmits"]  # every data packet, once
    if shutil.which("tshark"):  # Wireshark's own RoCEv2 dissector reads the same files
        fields = subprocess.run(["tshark", "-r", str(tmp_path / "pcap" / "h0-eth0.pcap"), "-T", "fields",
                                 "-e", "infiniband.reth.dmalen"], capture_output=True, text=True, check=True).stdout
        assert "200000" in fields.split()


def test_traffic_over_an_external_controller_started_apart(tmp_path):
    """--controller: no app of ours is started; the run waits until every switch has connected to the user's
    controller (here the standalone ECMP app, as Faucet or ONOS would be), and its traffic arrives."""
    model = tmp_path / "fabric.json"
    fabric = topologies.build("ft2", leaves=2, hosts_per_leaf=2, spines=2)
    fabric.save(model)
    port = free_port()
    controller = subprocess.Popen([*MPFT, "controller", "--fabric", str(model), "--port", str(port)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run = subprocess.run([*MPFT, "traffic", "permutation", "-p", "size=200000", "--fabric", str(model),
                              "--controller", f"tcp:127.0.0.1:{port}", "--out", str(tmp_path / "out")],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    finally:
        controller.terminate()
        log, _ = controller.communicate(timeout=10)
    assert run.returncode == 0, run.stderr[-2000:]
    metrics = json.loads((tmp_path / "out" / "traffic.json").read_text())
    # fail-secure bridges forward nothing but what a controller installs: every message arriving is its doing
    assert metrics["lost_messages"] == 0 and metrics["messages_total"] == len(fabric.hosts())
    assert metrics["app"] == f"external tcp:127.0.0.1:{port}" and "controllers.ecmp on 127.0.0.1" in log
    bad = subprocess.run([*MPFT, "traffic", "permutation", "--controller", "udp:x"], capture_output=True, text=True,
                         cwd=REPO)
    assert bad.returncode == 2 and bad.stderr.strip() == "mpft: error: controller: must be tcp:HOST:PORT, got 'udp:x'"
