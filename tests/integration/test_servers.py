"""Integration tier: commands on a second server over ssh (tests/integration/second_server.py: its own
namespaces, OVS run directory, clock and sshd on this machine), and nothing left on either side."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scapy.utils import rdpcap

from emulator.model import topologies
from emulator.model.capture import CaptureOptions
from emulator.model.errors import EnvironmentProblem
from emulator.model.schedule import Message
from emulator.model.servers import parse_server
from emulator.net import features
from emulator.net.cluster_run import ClusterEmulation
from emulator.net.controller import free_port
from emulator.net.remote import Connection
from emulator.run.job import run_job
from tests.integration.helpers import REPO, leaks, ping_all, snapshot
from tests.integration.second_server import ADDRESS, LINK, MTU, NETNS, SecondServer, write_recorder
from traffic import patterns
from traffic.contract import HostResult
from traffic.options import TransportOptions

pytestmark = pytest.mark.root

OFFSET_S = 1234  # the second server's CLOCK_MONOTONIC is this far ahead of ours


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The second server, and here an `mn` first on the PATH that records any call: Mininet's cluster mode
    registers its machine-wide clean-up mode as its cleanup, and no command of ours may run it, on either server."""
    before = snapshot()
    shims = tmp_path_factory.mktemp("shims")
    write_recorder(shims / "mn", shims / "mn-calls")
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{shims}:{path}"
    try:
        with SecondServer(clock_offset_s=OFFSET_S) as srv:
            yield srv
            assert srv.mn_calls() == []
    finally:
        os.environ["PATH"] = path
    assert not (shims / "mn-calls").exists()
    assert leaks(before, snapshot()) == {}
    assert not Path(f"/run/netns/{NETNS}").exists()


def test_mininets_cleanup_is_recorded_not_run_on_either_server(server, conn):
    """The recorders the module's checks rely on are in place and record (so "never called" means something).
    They are called with --version, harmless even to a real mn."""
    assert conn.run(["cat", "/usr/bin/mn"]) == (server.dir / "mn").read_text()  # the recorder, bind-mounted
    conn.run(["mn", "--version"])
    assert server.mn_calls() == ["/usr/bin/mn --version"]
    (server.dir / "mn-calls").unlink()
    shims = Path(shutil.which("mn")).parent
    assert (shims / "mn").read_text().startswith("#!/bin/sh\necho")  # first on our PATH: the recorder
    subprocess.run([str(shims / "mn"), "--version"], check=True)
    assert (shims / "mn-calls").read_text() == f"{shims}/mn --version\n"
    (shims / "mn-calls").unlink()


@pytest.fixture
def conn(server, tmp_path):
    with Connection(server.server, tmp_path / "ssh", ssh_config=server.ssh_config) as connection:
        yield connection
    assert not (tmp_path / "ssh").exists()  # the master is gone, and its socket with it


def test_a_command_runs_there_as_an_argument_list(conn):
    assert f"inet {ADDRESS}/30" in conn.run(["ip", "-o", "-4", "addr", "show"])
    # Shell syntax in an argument stays an argument: nothing on the server reads it as a command.
    tricky = "a b; touch /tmp/mpfttest-pwned $(id) `id` 'q\"\n"
    assert conn.run(["printf", "%s", tricky]) == tricky
    assert not Path("/tmp/mpfttest-pwned").exists()
    assert conn.run(["cat"], input_text="rest of stdin\n") == "rest of stdin\n"


def test_a_failing_command_is_one_error_naming_the_server(conn):
    with pytest.raises(EnvironmentProblem, match=rf"^{ADDRESS}: ls failed \(exit 2\): .*/nonexistent"):
        conn.run(["ls", "/nonexistent"])
    with pytest.raises(EnvironmentProblem, match="no-such-tool failed .*No such file"):
        conn.run(["no-such-tool"])


def test_the_server_has_its_own_run_directories_and_ovs(conn):
    conn.run(["touch", "/run/mpft-emu/mpfttest-probe"])
    assert not Path("/run/mpft-emu/mpfttest-probe").exists()
    assert conn.run(["ls", "/run/mpft-emu"]).split() == ["mpfttest-probe"]
    conn.run(["rm", "/run/mpft-emu/mpfttest-probe"])
    conn.run(["ovs-vsctl", "add-br", "mpfttestbr0", "--", "set", "bridge", "mpfttestbr0", "datapath_type=netdev"])
    try:
        assert "mpfttestbr0" in conn.run(["ovs-vsctl", "list-br"]).split()
        mine = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True).stdout
        assert "mpfttestbr0" not in mine.split()
    finally:
        conn.run(["ovs-vsctl", "del-br", "mpfttestbr0"])


def test_its_clock_offset_is_measured(conn):
    """Its CLOCK_MONOTONIC is 1234 s ahead; its CLOCK_REALTIME is ours (a time namespace cannot shift it)."""
    offset = conn.clock_offset()
    assert offset.round_trip_ns < 50_000_000
    assert abs(offset.offset_ns - OFFSET_S * 10**9) <= offset.round_trip_ns // 2 + 1_000_000
    assert abs(offset.realtime_ns) <= offset.round_trip_ns // 2 + 1_000_000


def test_a_server_that_does_not_answer_is_one_clear_error(server, tmp_path):
    nobody = parse_server(f"root@{ADDRESS}:2222")  # where nobody listens
    with pytest.raises(EnvironmentProblem, match=rf"^ssh to root@{ADDRESS}:2222 failed: .*refused"):
        Connection(nobody, tmp_path / "ssh", ssh_config=server.ssh_config).open()


def _flags(conn, intf: str) -> set[str]:
    line = conn.run(["ip", "-o", "link", "show", "dev", intf])
    return set(line.split("<", 1)[1].split(">", 1)[0].split(","))


def _remote_leftovers(conn) -> dict[str, str]:
    """What a run could leave on the second server: bridges, interfaces, namespaces, run directories."""
    return {"bridges": conn.run(["ovs-vsctl", "list-br"]).strip(),
            "links": " ".join(sorted(line.split(":")[1].split("@")[0].strip()
                                     for line in conn.run(["ip", "-o", "link"]).splitlines()
                                     if line.split(":")[1].strip() not in ("lo", "mpfttest-s2@if2"))),
            "netns": conn.run(["ip", "netns", "list"]).strip(),
            "runs": " ".join(sorted(set(conn.run(["ls", "/run/mpft-emu"]).split()) - {"lock"}))}


def test_a_cluster_run_over_two_servers_carries_every_pair(server, conn):
    """Plane 0 here, plane 1 there: every GPU reaches every other, across a plane through its node's NVLink
    domain, whose halves a VXLAN tunnel joins; the run knows the server's clock; the controller's queue file has
    both servers' switches; faults on the other server's links are made there; nothing is left on either."""
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
    here, there = snapshot(), _remote_leftovers(conn)
    servers = [parse_server("localhost"), server.server]
    with ClusterEmulation(fabric, servers, server.ssh_config, quiet=True) as emu:
        assert sorted(emu.local_fabric.hosts()) == ["n0g0", "n1g0"]
        assert "p1l0" in conn.run(["ovs-vsctl", "list-br"]).split()  # plane 1's switches are there
        assert ping_all(emu, fabric.hosts()) == []
        offset = emu.cluster.clock(1)
        assert abs(offset.offset_ns - OFFSET_S * 10**9) <= offset.round_trip_ns // 2 + 1_000_000
        spine_port = fabric.intf("p1l0", "p1s0")  # on the other server: its part makes the faults there
        emu.fail_link("p1l0", "p1s0")
        assert "UP" not in _flags(conn, spine_port)
        emu.degrade_link("p1l0", "p1s0", 0.5, "a_to_b")
        assert f"rate {int(fabric.rate('p1l0', 'p1s0') / 2e6)}Mbit" in conn.run(["tc", "class", "show", "dev",
                                                                                       spine_port])
        emu.restore()
        assert "UP" in _flags(conn, spine_port)
        assert f"rate {int(fabric.rate('p1l0', 'p1s0') / 1e6)}Mbit" in conn.run(["tc", "class", "show", "dev",
                                                                                  spine_port])
        deadline = time.monotonic() + 10  # the controller's queue file has the other server's switches too
        queues = emu.directory / "queues.json"
        while not queues.exists() or set(json.loads(queues.read_text())) != set(fabric.switches()):
            assert time.monotonic() < deadline, "queues.json lacks plane 1's switches"
            time.sleep(0.1)
    assert leaks(here, snapshot()) == {}
    assert _remote_leftovers(conn) == there


def test_a_job_over_two_servers_times_every_message_by_one_clock(server, conn, tmp_path):
    """An all-to-all over the two servers: each runs its hosts' agents, the results come back into the one run
    directory with the server's 1234 s clock offset taken out (a message's times fall within the run, a one-way
    delay across servers is a few ms), the other server's links join the time series, its captures the run's,
    and the verdict names each server and what the tunnels carried."""
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
    messages = patterns.all_to_all(fabric, size=256 * 1024)
    there = _remote_leftovers(conn)
    m = run_job(fabric, messages, tmp_path, quiet=True, servers=[parse_server("localhost"), server.server],
                ssh_config=server.ssh_config, capture=CaptureOptions(("n0g0", "n1g1", "n0nv")))
    assert m.lost_messages == 0 and m.messages_total == len(messages) == 12
    # the captures of both servers' interfaces are in the one run directory, each with the frames it counted
    assert set(m.captures) == {"n0g0-eth0", "n0g0-eth1", "n1g1-eth0", "n1g1-eth1", "n0nv-eth1", "n0nv-eth2"}
    for intf, counted in m.captures.items():
        frames = rdpcap(str(tmp_path / "pcap" / counted["file"]))
        assert len(frames) == counted["packets"] > 0, intf
    assert sorted(p.name for p in tmp_path.glob("n*.json")) == sorted(f"{h}.json" for h in fabric.hosts())
    for row in m.messages:
        assert 0 <= row["posted_s"] < 0.1 and row["posted_s"] < row["delivered_s"] <= m.completion_s < 30
    remote = HostResult.read(tmp_path / "n1g1.json")
    one_way = [d.one_way_ns for d in remote.received.values()]
    assert one_way and all(0 < ns < 1e9 for ns in one_way)  # n1g1 hears from both servers
    assert set(m.servers) == {"localhost", str(server.server)}
    carried = sum(t["tx_packets"] for s in m.servers.values() for t in s.tunnels.values())
    assert carried > 2 * 256 * 1024 // fabric.mtu  # two messages each way cross between the servers, at least
    with (tmp_path / "timeseries.csv").open() as rows:
        sent = [row for row in csv.DictReader(rows) if row["kind"] == "link_util" and row["name"].startswith("p1")]
    assert sent and all(0 < float(row["t_s"]) < 30 for row in sent)  # plane 1's links, there, by our clock
    assert max(float(row["value"]) for row in sent) > 0.5
    assert "per server: localhost " in m.fidelity.verdict and str(server.server) in m.fidelity.verdict
    # its clock is ours shifted (a time namespace): estimated again after the run, it has not drifted
    moved = m.servers[str(server.server)].clock_drift
    assert abs(moved["moved_ns"]) <= moved["uncertain_ns"] + 1_000_000 and moved["over_s"] > 0
    assert f"{server.server}'s clock moved" in m.fidelity.verdict
    assert _remote_leftovers(conn) == there


def test_mpft_up_over_two_servers_says_where_each_plane_is(server, conn):
    """`mpft up --servers`: the CLI here reaches a GPU on the other server, and EOF tears both parts down."""
    here, there = snapshot(), _remote_leftovers(conn)
    topo = ["--topo", "mpft", "--planes", "2", "--nodes", "2", "--leaves", "1", "--spines", "1"]
    target = topologies.build(planes=2, nodes=2, leaves=1, spines=1).ip("n1g1")
    done = subprocess.run([sys.executable, "-m", "emulator.cli", "up", *topo, "--servers",
                           f"localhost,{server.server}", "--ssh-config", str(server.ssh_config)],
                          input=f"n0g0 ping -c1 -W5 {target}\n", capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout + done.stderr  # Mininet's CLI writes through its logger
    assert "*** localhost: planes 0, 2 hosts (this CLI's)" in out
    assert f"*** {server.server}: planes 1, 2 hosts" in out
    assert "1 received" in out
    assert leaks(here, snapshot()) == {} and _remote_leftovers(conn) == there


def test_every_servers_switches_reach_a_controller_of_the_users(server, conn, tmp_path):
    """--controller with --servers: the other server's switches reach the user's controller through the ssh
    connection, the run waits for every switch, and its traffic (which only the controller's rules carry)
    arrives."""
    model = tmp_path / "fabric.json"
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
    fabric.save(model)
    port = free_port()
    controller = subprocess.Popen([sys.executable, "-m", "emulator.cli", "controller", "--fabric", str(model),
                                   "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
    try:
        done = subprocess.run([sys.executable, "-m", "emulator.cli", "traffic", "all-to-all", "-p", "size=65536",
                               "--fabric", str(model), "--controller", f"tcp:127.0.0.1:{port}", "--servers",
                               f"localhost,{server.server}", "--ssh-config", str(server.ssh_config), "--out",
                               str(tmp_path / "out")], capture_output=True, text=True, cwd=REPO, timeout=300)
    finally:
        controller.terminate()
        controller.communicate(timeout=10)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "out" / "traffic.json").read_text())
    assert metrics["lost_messages"] == 0 and metrics["messages_total"] == 12
    assert set(metrics["servers"]) == {"localhost", str(server.server)}


def test_ecn_marks_on_the_other_server_reach_the_runs_metrics(server, tmp_path):
    """An incast into a GPU on the other server, with ECN: that server's marker marks, its receiver sees the
    marks, and the run's metrics count them from both ends."""
    fabric = topologies.build(planes=2, nodes=4, leaves=1, spines=1, ecn=True, queue_kb=64)
    messages = patterns.incast(fabric, senders=3, receiver="n1g1", size=512 * 1024)
    m = run_job(fabric, messages, tmp_path, quiet=True, options=TransportOptions(cc="ecn"),
                servers=[parse_server("localhost"), server.server], ssh_config=server.ssh_config)
    assert m.lost_messages == 0
    assert m.ecn["ce_received"] > 0
    if features.detect().ecn_marker == "bpf":  # the eBPF marker counts its marks (RED, where there is RED, not)
        assert m.ecn["marked"] >= m.ecn["ce_received"]  # all of them there: n1g1's leaf is on the other server


def test_the_marker_keeps_the_kernels_clock_inside_a_time_namespace():
    """The eBPF program reads the kernel's CLOCK_MONOTONIC, whatever namespace we are in; on a server whose
    clock is shifted (ours here), the marker's drain times and XOFF reports must be moved by the shift."""
    probe = ("import time; from emulator.net.marking import TIMENS_OFFSET_NS, kernel_ns; "
             "print(TIMENS_OFFSET_NS, kernel_ns(), time.monotonic_ns())")
    before = time.monotonic_ns()
    said = subprocess.run(["unshare", "--time", "--monotonic", str(OFFSET_S), "--fork", sys.executable, "-c", probe],
                          capture_output=True, text=True, check=True, cwd=REPO).stdout.split()
    after = time.monotonic_ns()
    offset, kernel, theirs = map(int, said)
    assert offset == OFFSET_S * 10**9 and 0 <= theirs - kernel - offset < 10**7  # read one after the other
    assert before <= kernel <= after


@pytest.mark.skipif(not features.detect().lossless, reason="no eBPF marker or TBF: no lossless links")
def test_a_lossless_incast_on_each_server_pauses_there_and_loses_nothing(server, tmp_path):
    """An incast on each plane, one plane on each server, over lossless links: each server pauses its own
    feeders, nothing is dropped or sent twice, and the run's pauses and pauses.csv hold both servers'."""
    fabric = topologies.build(planes=2, nodes=4, leaves=2, spines=2, queue_kb=128, lossless=True)
    messages = [Message(i, 0.0, f"n{n}g{g}", f"n1g{g}", 512 * 1024)
                for i, (n, g) in enumerate((n, g) for g in (0, 1) for n in (0, 2, 3))]
    m = run_job(fabric, messages, tmp_path, quiet=True,
                options=TransportOptions(cc="none", window=4, min_rto_ms=2000),
                servers=[parse_server("localhost"), server.server], ssh_config=server.ssh_config)
    assert m.lost_messages == 0 and m.queue_drops == 0, m.queue_drops_by_port
    assert m.packets.retransmits == m.packets.timeouts == 0 and m.packets.received == m.packets.data, m.packets
    planes = {fabric.node(gate.partition("-eth")[0])["plane"] for gate in m.pauses["ports"]
              if not gate.startswith("n")}  # a switch's gate names its plane; a GPU's NIC is on its leaf's
    assert planes == {0, 1} and not m.pauses["errors"], m.pauses
    assert 0 < m.pauses["reaction_us"]["p99"] < 1e6  # the other server's reports by its own clock, not ours
    rows = [row.split(",") for row in (tmp_path / "pauses.csv").read_text().splitlines()[1:]]
    assert {row[2][:2] for row in rows if row[2].startswith("p")} == {"p0", "p1"}
    assert all(-1 < float(row[0]) < 60 for row in rows)  # the other server's too, on our time line


STUDY = """
name = "spread"
question = "does spraying finish the all-to-all sooner than ECMP, over two servers?"
seeds = [1]
servers = ["localhost", "{server}"]
ssh_config = "{ssh_config}"
[topology]
planes = 2
nodes = 2
leaves = 1
spines = 2
[[traffic]]
pattern = "all-to-all"
params = {{ size = 65536 }}
[[variants]]
name = "ecmp"
app = "ecmp"
[[variants]]
name = "spray"
app = "spray"
entropy = "spray"
[[faults]]
at_s = 0
action = "degrade_link"
link = ["n1g1", "p1l0"]
rate_fraction = 0.25
"""


def test_a_study_over_two_servers_reports_like_any_other(server, conn, tmp_path):
    """`mpft run` on a scenario that lists the servers: every variant's run is a cluster run, answered and reported,
    and its verdict names both servers; its fault, a NIC on the other server at a quarter of its rate, is made
    there (without it the run would finish at a fraction of the bound that counts it)."""
    scenario = tmp_path / "spread.toml"
    scenario.write_text(STUDY.format(server=server.server, ssh_config=server.ssh_config))
    here, there = snapshot(), _remote_leftovers(conn)
    done = subprocess.run([sys.executable, "-m", "emulator.cli", "run", str(scenario), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    for variant in ("ecmp", "spray"):
        run = json.loads((tmp_path / "out" / f"{variant}-seed1" / "traffic.json").read_text())
        assert run["lost_messages"] == 0 and set(run["servers"]) == {"localhost", str(server.server)}
        assert 0 < run["completion_s"] < 30
        assert [e["action"] for e in run["events"]] == ["degrade_link n1g1 p1l0 0.25 both"]
        assert 0.8 < metrics["variants"][variant]["ratio_to_bound"] < 2
    assert metrics["variants"].keys() == {"ecmp", "spray"}
    assert (tmp_path / "out" / "report.html").exists()
    assert leaks(here, snapshot()) == {} and _remote_leftovers(conn) == there


HOLDER = """
import sys, time
from pathlib import Path
from emulator.model import topologies
from traffic import patterns
from traffic.options import TransportOptions
from emulator.model.servers import parse_servers
from emulator.net import features
from emulator.model.capture import CaptureOptions
from emulator.net.controller import free_port
from emulator.net.cluster_run import ClusterEmulation
fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
with ClusterEmulation(fabric, parse_servers(sys.argv[1]), Path(sys.argv[2]), quiet=True):
    print("up", flush=True)
    time.sleep(120)
"""


def test_after_a_crash_the_other_servers_part_comes_down_by_itself(server, conn):
    """Killed with -9, the run's ssh connection to its part there loses its input with it, and the part, its
    input at an end, tears itself down; here the run's leftovers (its ssh master among them) wait for `mpft
    clean`, as any crashed run's do."""
    here, there = snapshot(), _remote_leftovers(conn)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, f"localhost,{server.server}", str(server.ssh_config)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "up"
    assert "p1l0" in _remote_leftovers(conn)["bridges"]
    holder.kill()
    holder.wait()
    holder.stdout.close()
    deadline = time.monotonic() + 60
    while _remote_leftovers(conn) != there and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _remote_leftovers(conn) == there
    assert any("/ssh1" in cmdline for _, cmdline in leaks(here, snapshot()).get("procs", ()))
    clean = subprocess.run([sys.executable, "-m", "emulator.cli", "clean"], capture_output=True, text=True,
                           cwd=REPO, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert leaks(here, snapshot()) == {}


def test_clean_with_servers_cleans_there_too(server, conn):
    """A part killed there with -9 leaves its switches and tunnels; `mpft clean --servers` here removes them."""
    fabric = topologies.build(planes=2, nodes=2, leaves=1, spines=1)
    here, there = snapshot(), _remote_leftovers(conn)
    servers = [parse_server("localhost"), server.server]
    with ClusterEmulation(fabric, servers, server.ssh_config, quiet=True) as emu:
        (part,) = emu.cluster.remote_parts.values()
        state = json.loads(conn.run(["cat", f"/run/mpft-emu/{part.up['run']}/state.json"]))
        conn.run(["kill", "-9", str(state["pid"])])
        part.proc.wait(timeout=30)
    left = _remote_leftovers(conn)
    assert "p1l0" in left["bridges"] and "n0nv-x0" in left["links"]
    clean = subprocess.run([sys.executable, "-m", "emulator.cli", "clean", "--servers", f"localhost,{server.server}",
                            "--ssh-config", str(server.ssh_config)], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert f"{server.server}: removed {part.up['run']}" in clean.stdout
    assert _remote_leftovers(conn) == there
    assert leaks(here, snapshot()) == {}


def test_a_network_between_servers_too_small_for_the_fabrics_frames_is_refused(server):
    """Our agents' frames cross whole or not at all: a 1500-byte path cannot carry 9000-byte frames in VXLAN.
    The run says so in one line, before building anything, and leaves nothing."""
    before = snapshot()
    subprocess.run(["ip", "link", "set", LINK, "mtu", "1500"], check=True)
    try:
        with pytest.raises(EnvironmentProblem, match=rf"^{ADDRESS}: the network from here carries 1500-byte packets"
                                                     r".* need 9050 .*--mtu 1450$"):
            ClusterEmulation(topologies.build(planes=2, nodes=2, leaves=1, spines=1),
                             [parse_server("localhost"), server.server], server.ssh_config, quiet=True).__enter__()
    finally:
        subprocess.run(["ip", "link", "set", LINK, "mtu", str(MTU)], check=True)
    assert leaks(before, snapshot()) == {}
