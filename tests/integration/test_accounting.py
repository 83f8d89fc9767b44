"""Integration tier: every packet accounted for. A run makes a loss at each place the ledger names (this kernel
has no netem or gact: a tiny byte FIFO, a tiny SO_RCVBUF, a blackhole route at a PXN forwarder, an nftables rule
with a counter) and finds each attributed to its place, with nothing left unattributed; a port throttled by tc
below its model rate makes the run UNFAITHFUL."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import time

import pytest

from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.net.emulation import Emulation
from emulator.run.job import run_job
from traffic.options import TransportOptions

pytestmark = pytest.mark.root

FABRIC = {"planes": 2, "nodes": 3, "leaves": 1, "spines": 1}  # nK g0 on plane 0, nK g1 on plane 1


def _in(emu: Emulation, host: str, argv: list[str]) -> None:
    subprocess.run(["nsenter", f"--net={emu.netns(host)}", *argv], check=True, capture_output=True)


def _switch_tc(emu: Emulation, switch: str, argv: list[str]) -> None:
    ns = emu.switch_netns(switch)
    subprocess.run(["tc", *(["-n", ns] if ns else []), *argv], check=True, capture_output=True)


def _agent_pid(emu: Emulation, host: str) -> int:
    return next(pid for label, pid in emu.started.items() if label.startswith(f"{host} pid"))


def _agent_socket_buffer(emu: Emulation, host: str) -> None:
    """Shrink the receive buffer of the socket the host's agent receives on (port 4791) to the kernel's least,
    through pidfd_getfd, and stop the agent for a moment: what arrives meanwhile overflows it."""
    pid = _agent_pid(emu, host)
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            dup = libc.syscall(438, pidfd, int(fd), 0)  # pidfd_getfd
            if dup < 0:
                continue
            try:
                sock = socket.socket(fileno=dup)
            except OSError:
                os.close(dup)
                continue
            with sock:
                if sock.type == socket.SOCK_DGRAM and sock.getsockname()[1] == wire.ROCE_PORT:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)  # the kernel's least
    finally:
        os.close(pidfd)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.3)
    os.kill(pid, signal.SIGCONT)


def test_a_loss_at_every_place_is_attributed_to_it(tmp_path):
    fabric = topologies.build("mpft", **FABRIC)
    far = fabric.ip("n1g1")
    messages = [Message(0, 0.0, "n0g0", "n1g0", 400_000),  # two NICs into n1g0's downlink (tiny FIFOs)
                Message(1, 0.0, "n2g0", "n1g0", 400_000),
                Message(2, 0.0, "n0g1", "n1g0", 400_000),  # PXN: n0g0's NIC carries it beside message 0
                Message(3, 0.0, "n0g0", "n1g1", 400_000),  # PXN through n0g1, whose route to n1g1 is a blackhole
                Message(4, 0.0, "n0g1", "n1g1", 100_000),  # for a while (n0g1's own packets are refused)
                Message(5, 0.0, "n1g0", "n0g0", 400_000),  # into n0g0, whose socket holds one packet
                Message(6, 0.0, "n0g0", "n2g0", 400_000),  # two flows that nothing else slows, each paced at
                Message(7, 0.0, "n0g1", "n2g0", 400_000)]  # n0g0's NIC rate, into its tiny FIFO together
    # and n1g0 drops a tenth of what reaches it by an nftables rule with a counter, until 1.5 s
    nft = ["nft", "-j", "list", "ruleset"]

    tiny = ["parent", "1:1", "handle", "10:", "bfifo", "limit", str(2 * (fabric.mtu + wire.ETH))]

    def break_things(emu: Emulation) -> None:
        _switch_tc(emu, "p0l0", ["qdisc", "change", "dev", fabric.intf("p0l0", "n1g0"), *tiny])
        _in(emu, "n0g0", ["tc", "qdisc", "change", "dev", fabric.intf("n0g0", "p0l0"), *tiny])
        _in(emu, "n0g1", ["ip", "route", "add", "blackhole", f"{far}/32"])
        _in(emu, "n1g0", ["nft", "add", "table", "ip", "mpfttest"])
        _in(emu, "n1g0", ["nft", "add", "chain", "ip", "mpfttest", "in", "{ type filter hook input priority 0 ; }"])
        _in(emu, "n1g0", ["nft", "add", "rule", "ip", "mpfttest", "in", "udp", "dport", str(wire.ROCE_PORT),
                          "numgen", "random", "mod", "10", "==", "0", "counter", "drop"])
        _agent_socket_buffer(emu, "n0g0")

    def mend_route(emu: Emulation) -> None:
        _in(emu, "n0g1", ["ip", "route", "del", "blackhole", f"{far}/32"])
        out = subprocess.run(["nsenter", f"--net={emu.netns('n1g0')}", *nft], check=True, capture_output=True,
                             text=True).stdout
        _in(emu, "n1g0", ["nft", "delete", "table", "ip", "mpfttest"])  # read and gone: its count is final
        counted.extend(item["rule"]["expr"] for item in json.loads(out)["nftables"] if "rule" in item)
    counted: list = []
    m = run_job(fabric, messages, tmp_path, app="ecmp", quiet=True, timeout_s=60,
                options=TransportOptions(cc="none", window=16, agent_processes=len(fabric.hosts())),
                timeline=[(0.05, break_things), (1.5, mend_route)])
    acc = m.accounting
    assert m.lost_messages == 0
    assert acc["drops"]["switch_queue"] > 0 and acc["where"]["switch_queue"] == {"p0l0": acc["drops"]["switch_queue"]}
    assert acc["where"]["nic_queue"] == {"n0g0-eth0": acc["drops"]["nic_queue"]} and acc["drops"]["nic_queue"] > 0
    assert acc["where"]["host_ip"]["n0g1"] > 0  # the forwarder's blackhole
    assert acc["drops"]["refused"] > 0  # n0g1's own packets to n1g1 met the same blackhole
    assert acc["drops"]["socket_buffer"] > 0 and list(acc["where"]["socket_buffer"]) == ["n0g0"]
    assert counted, "the nftables rule's counter was read"
    nft_drops = next(e["counter"]["packets"] for e in counted[0] if "counter" in e)
    assert acc["where"]["host_ip"]["n1g0"] == nft_drops > 0  # the nftables rule's drops, at its host
    assert acc["unattributed"] == 0, (acc, nft_drops)
    assert acc["sent"] == m.packets.datagrams_sent and acc["delivered"] == m.packets.datagrams_received


def test_a_port_throttled_below_its_model_rate_is_unfaithful(tmp_path):
    """tc, not the model, slows a switch's downlink to half: the run sends there below the rate the model says,
    so the run is UNFAITHFUL (the model and the bound do not know of the slowing)."""
    fabric = topologies.build("mpft", **FABRIC)
    intf = fabric.intf("p0l0", "n1g0")
    half = int(fabric.rate("p0l0", "n1g0") / 2)

    def throttle(emu: Emulation) -> None:
        _switch_tc(emu, "p0l0", ["class", "change", "dev", intf, "parent", "1:", "classid", "1:1", "htb",
                                 "rate", f"{half}bit", "ceil", f"{half}bit"])
    m = run_job(fabric, [Message(0, 0.0, "n0g0", "n1g0", 3_000_000)], tmp_path, app="ecmp", quiet=True,
                options=TransportOptions(cc="none", window=8), timeline=[(0, throttle)])
    f = m.fidelity
    assert f.unfaithful and f.link_ratio_worst_intf == intf and f.link_ratio_worst < 0.6
    assert f.verdict.startswith("UNFAITHFUL") and not f.counts


def test_the_16_host_all_to_all_is_faithful_and_every_packet_accounted_for(tmp_path):
    """htsim's 16-host leaf-spine (4 leaves x 4 hosts, 4 spines), sprayed under the default transport: not
    UNFAITHFUL (pull keeps its queues to a few packets, which is no backlog: monitor.LinkSampler.floor), and
    nothing is lost where no counter says."""
    fabric = topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4)
    hosts = fabric.hosts()
    messages = [Message(i, 0.0, s, d, 128 * 1024) for i, (s, d) in
                enumerate((s, d) for s in hosts for d in hosts if s != d)]
    m = run_job(fabric, messages, tmp_path, app="spray", quiet=True, options=TransportOptions(entropy="spray"))
    f = m.fidelity
    assert m.lost_messages == 0 and m.accounting["unattributed"] == 0
    assert not f.unfaithful and f.hidden_delay_s is not None, f.verdict
