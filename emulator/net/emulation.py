"""An emulation's lifecycle: lock, controller, network, readiness, and teardown on every way out.

    with Emulation(fabric, app="ecmp") as emu:
        emu.net["n0g0"].cmd("ping -c1", emu.fabric.ip("n1g1"))

This is a run on this machine; a cluster run's two roles (emulator.net.cluster_run) add to it through the hooks
below, as Mininet's MininetCluster does to Mininet.

Teardown runs on normal exit, exceptions, SIGINT and SIGTERM (turned into an exception so the `with`
unwinds) and removes exactly what the run recorded in its state file.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from tqdm import tqdm

from emulator.model import capture as tap
from emulator.model.errors import EnvironmentProblem, Terminated
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd
from emulator.model.servers import external_target
from emulator.net import capture, features, ledger, monitor, ovs, runstate
from emulator.net.controller import ControllerProcess, wait_connected
from emulator.net.monitor import QueueExporter
from emulator.net.network import FabricNet
from emulator.net.pause import Pauses
from emulator.net.qdiscs import QdiscReader
from emulator.net.switchd import NO_DAEMON_TO_FREEZE, SwitchDaemons, default_mode, netns_path, resolve_mode

if TYPE_CHECKING:
    from emulator.net.cluster import Cluster, RemotePart

log = logging.getLogger(__name__)


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(f"signal {signum}")


def check_root() -> None:
    if os.geteuid() != 0:
        raise EnvironmentProblem("the emulator needs root (Mininet, OVS and tc): run it with sudo")


def check_ovs(switch_daemons: str) -> None:
    """Private daemons need Open vSwitch installed; the machine's own must also be running."""
    if switch_daemons == "shared" and not features.ovs_status()[0]:
        raise EnvironmentProblem("Open vSwitch is not running: run 'sudo make setup' (or start ovs-ctl)")
    if not shutil.which("ovs-vswitchd"):
        raise EnvironmentProblem("Open vSwitch is not installed: run 'sudo make setup'")


class Emulation:
    """A running fabric with a controller app, on this machine; use as a context manager."""

    cluster: Cluster | None = None  # a ClusterEmulation's servers
    tunnels: tuple[TunnelEnd, ...] = ()  # a part's tunnel ends to the other servers

    def __init__(self, fabric: Fabric, app: str | None = "ecmp", seed: int = 0, datapath: str | None = None,
                 shape: bool = True, quiet: bool = False, app_env: dict[str, str] | None = None,
                 switch_daemons: str | None = None, controller: str | None = None) -> None:
        """`switch_daemons` (emulator.net.switchd): "per-plane" (a private OVS per plane), "per-core" (one per
        core, each for a group of planes), "shared" (the machine's own OVS for every switch) or "auto" (per
        plane while there is a core for each plane, else shared); MPFT_SWITCH_DAEMONS sets the default, auto.
        `controller` (tcp:HOST:PORT): a controller of the user's (Faucet, ONOS, a Ryu elsewhere) instead of
        `app`; the switches are then the machine's own OVS, in its namespace, so they reach that address."""
        self.external = external_target(controller) if controller else None
        self.external_target = controller
        if self.external:
            app, switch_daemons = None, "shared"
        self.fabric = fabric.copy()  # degrade_link changes rates in this run's model, not the caller's
        self.local_fabric = self.fabric  # what this machine builds
        self.app, self.seed, self.shape = app, seed, shape
        self.app_env = app_env or {}
        self.datapath = datapath
        self.switch_daemons = switch_daemons or default_mode()
        self.switchd: SwitchDaemons | None = None
        self.quiet = quiet
        self.lock = runstate.RunLock()
        self.state: runstate.RunState | None = None
        self.controller: ControllerProcess | None = None
        self.net: FabricNet | None = None
        self.ecn_marker = ""  # how switches mark ECN in this run (features.Features.ecn_marker)
        self.exporter: QueueExporter | None = None
        self.timings: dict[str, float] = {}
        self.failed: set[frozenset[str]] = set()
        self.degraded: set[tuple[str, str]] = set()  # (from, to): directions running below their link's rate
        self.frozen: dict[int, list[int]] = {}  # plane -> pids of its stopped switch daemons
        self.started: dict[str, int] = {}  # what popen started in hosts: label -> pid
        self._old_term = None

    @property
    def directory(self) -> Path:
        assert self.state is not None
        return self.state.directory

    def __enter__(self) -> Emulation:
        check_root()
        detected = features.detect()
        self.datapath = self.datapath or detected.datapath
        self.switch_daemons = resolve_mode(self.fabric, self.switch_daemons, self.datapath)
        check_ovs(self.switch_daemons)
        features.check_link_options(self.fabric, detected)
        # a lossless port's queue is a TBF gate, not RED: the eBPF marker keeps it and marks
        self.ecn_marker = ("bpf" if self.fabric.lossless else detected.ecn_marker) if self.fabric.ecn else ""
        self.lock.acquire()
        self._old_term = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            self._remove_crashed_runs()
            self._start()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        self._teardown()

    def _remove_crashed_runs(self) -> None:
        """What a killed run left (its bridges, interfaces, daemons) would collide with ours by name; holding the
        lock, no run of ours is live, so its leftovers go first, as `mpft clean` would remove them."""
        for run_id, counts in runstate.clean_dead_runs():
            log.warning("a run that did not finish left these; %s", runstate.describe_removed(run_id, counts))

    def _start(self) -> None:
        t0 = time.monotonic()
        self.state = runstate.new_run()
        fabric_file = self.directory / "fabric.json"
        self.fabric.save(fabric_file)
        self._connect_servers()
        self.switchd = SwitchDaemons(self.local_fabric, self.state, self.switch_daemons, self.datapath)
        self.switchd.create_namespaces()
        if self.app:
            queues = self.directory / "queues.json"
            self.exporter = QueueExporter(queues, set(self.local_fabric.switches()), self.switch_namespaces(),
                                          elsewhere=self._queues_elsewhere)
            self.controller = ControllerProcess(self.app, fabric_file, self.directory, seed=self.seed,
                                                env={"MPFT_QUEUES": str(queues), **self.app_env},
                                                host=self.switchd.controller_host(), netns=self.switchd.control_netns)
            self.state.add_process("controller", self.controller.start())
            self.state.save()
        self._start_parts()
        self.switchd.start()
        steps = ["hosts", "switches", "links", "open vswitch", "hosts config"] + (["shaping"] if self.shape else [])
        with tqdm(total=len(steps) + 1, desc="bring-up", unit="step", disable=self.quiet, leave=False) as bar:
            def progress(step: str) -> None:
                bar.set_postfix_str(step)
                bar.update(1)

            target = self.controller.target if self.controller else self.external_target
            self.net = FabricNet(self.local_fabric, self.state, self.datapath, target, self.switchd, self.shape,
                                 progress, self.ecn_marker, model=self.fabric, tunnels=self.tunnels)
            self.net.build()
            self.net.start()
            self._wait_parts()
            progress("controller sync")
            if self.controller:
                self.controller.wait_synced(self.fabric.switches())
                self.exporter.start()
            if self.external:
                host, port = self.external
                wait_connected(len(self._connecting_switches()), port, None, 60.0, local=False, host=host)
        self._enlarge_ovs_send_buffer()
        self.timings["up_s"] = time.monotonic() - t0

    # -- what a cluster run adds (ClusterEmulation) -------------------------------------------------------
    def _connect_servers(self) -> None:
        """Reach the other servers and learn this machine's part of the fabric."""

    def _queues_elsewhere(self) -> dict[str, dict[str, int]]:
        """The other servers' switch queues, for the controller (emulator.net.monitor.QueueExporter)."""
        return {}

    def _start_parts(self) -> None:
        """Start the other servers' parts, their switches pointed at this machine's controller."""

    def _wait_parts(self) -> None:
        """Wait for the other servers' parts to be up."""

    def _stop_parts(self) -> None:
        """Take the other servers' parts down."""

    def _connecting_switches(self) -> list[str]:
        """The switches that connect to an external controller (another server's come through ssh)."""
        return self.local_fabric.switches()

    def _elsewhere(self, a: str, b: str) -> RemotePart | None:
        """The part of the server that holds the link a-b, if not this machine (its faults are made there)."""
        return None

    def _first_transmits(self) -> None:
        """vswitchd opens its transmit socket on its first transmit: one ping across each plane, all at once."""
        pings = {}
        for plane in self.local_fabric.planes:
            hosts = self.local_fabric.hosts(plane=plane)
            if len(hosts) > 1:
                pings[hosts[0]] = self.local_fabric.nic_ip(hosts[1], plane)
        for src, dst in pings.items():
            self.host(src).sendCmd(shlex.join(["ping", "-c1", "-W1", dst]))
        for src in pings:
            self.host(src).waitOutput()

    def _enlarge_ovs_send_buffer(self) -> None:
        """Keep vswitchd from dropping outside the modelled queues (ovs.set_send_buffer); the machine's own is
        put back at teardown."""
        if self.controller:
            self._first_transmits()
        if self.switchd.private:
            self.switchd.enlarge_send_buffers()
            return
        previous = ovs.set_send_buffer(None)
        if previous is None or previous >= ovs.SEND_BUFFER:
            return
        self.state.ovs_sndbuf_restore = previous
        self.state.save()
        ovs.set_send_buffer(ovs.SEND_BUFFER)

    def _restore_ovs_send_buffer(self) -> None:
        if self.state is not None and self.state.ovs_sndbuf_restore is not None:
            ovs.set_send_buffer(self.state.ovs_sndbuf_restore)
            self.state.ovs_sndbuf_restore = None
            self.state.save()

    def _teardown(self) -> None:
        """Remove what we made; signals are held off so a second Ctrl-C cannot leave half a fabric."""
        t0 = time.monotonic()
        old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            for step in (self._restore_ovs_send_buffer, self.exporter and self.exporter.stop, self._stop_parts,
                         self.controller and self.controller.stop):
                try:
                    if step:
                        step()
                except Exception:  # never let one step keep the rest from removing what we made
                    log.exception("teardown step failed; going on")
            if self.state is not None:
                with runstate.expedited_rcu(self.state):
                    if self.switchd is not None:
                        try:
                            self.switchd.stop()
                        except Exception:
                            log.exception("stopping the switch daemons failed; removing by state file")
                    if self.net is not None:
                        try:
                            self.net.stop()
                        except Exception:  # fall through to the state-based removal below
                            log.exception("network stop failed; removing by state file")
                runstate.remove_run(self.state)
        finally:
            self.lock.release()
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, self._old_term or signal.SIG_DFL)
            self.timings["down_s"] = time.monotonic() - t0

    # -- faults -------------------------------------------------------------------------------------
    def fail_link(self, a: str, b: str) -> None:
        """Cut the link between two nodes of the model."""
        self.fabric.link(a, b)  # KeyError for a link the model does not have
        part = self._elsewhere(a, b)
        if part:
            part.request({"fault": ["fail_link", a, b]})
        else:
            self.net.set_links([(a, b)], up=False)
        self.failed.add(frozenset((a, b)))

    def fail_switch(self, switch: str) -> None:
        """Cut every link of a switch (the switch itself keeps running, isolated)."""
        links = [(switch, peer) for peer in self.fabric.graph[switch]]
        part = self._elsewhere(*links[0])
        if part:
            part.request({"fault": ["fail_switch", switch]})
        else:
            self.net.set_links(links, up=False)
        self.failed.update(frozenset(link) for link in links)

    def fail_plane(self, plane: str | int) -> None:
        """Freeze one plane's switch daemons (SIGSTOP): its switches forward nothing and answer nobody, while every
        link stays up, as a hung chassis would. It needs private daemons serving that plane alone."""
        assert self.switchd is not None
        plane = int(plane)
        if plane not in self.fabric.planes:
            raise KeyError(f"no plane {plane} in the fabric")
        if self.datapath == "kernel":
            raise EnvironmentProblem(NO_DAEMON_TO_FREEZE)
        pids = [pid for i in self.switchd.plane_daemons(plane) if (pid := i.vswitchd_pid()) is not None]
        if not pids:
            raise EnvironmentProblem(f"fail_plane needs switch daemons of that plane alone; these switches run on "
                                     f"{self.switchd.mode} daemons (MPFT_SWITCH_DAEMONS=per-plane or per-switch)")
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        self.frozen[plane] = pids

    def degrade_link(self, a: str, b: str, fraction: float | str, direction: str = "both") -> None:
        """Run a link at `fraction` of its rate: both ways, or only what `a` sends to `b` ("a_to_b") or `b` to
        `a` ("b_to_a"), as a flapping optic or a lane-degraded port does. The run's model (fabric.json, which the
        controller reads) says so too."""
        ends = self.fabric.degrade(a, b, float(fraction), direction)
        part = self._elsewhere(a, b)
        if part:
            part.request({"fault": ["degrade_link", a, b, float(fraction), direction]})
        self._set_rates([] if part else ends)
        self.degraded.update(ends)

    def _set_rates(self, ends: list[tuple[str, str]]) -> None:
        """The model's rates of `ends` onto this machine's links (a cluster run builds from its own copy of its
        part of the model), and the model saved for the controller."""
        if self.shape and ends:
            if self.local_fabric is not self.fabric:
                for a, b in ends:
                    self.local_fabric.set_rate(a, b, self.fabric.rate(a, b))
            self.net.set_rates(ends)
        self.fabric.save(self.directory / "fabric.json")

    def restore(self) -> None:
        """Repair every link cut so far, put every degraded link back at its rate and thaw every frozen plane."""
        for pid in (pid for pids in self.frozen.values() for pid in pids):
            os.kill(pid, signal.SIGCONT)
        self.frozen.clear()
        links = [tuple(link) for link in self.failed] + sorted(self.degraded)
        for part in {self._elsewhere(*link) for link in links} - {None}:
            part.request({"fault": ["restore"]})  # another server's links: its part repairs its own
        self.net.set_links([link for link in map(tuple, self.failed) if not self._elsewhere(*link)], up=True)
        self.failed.clear()
        if self.degraded:
            for src, dst in self.degraded:
                self.fabric.set_rate(src, dst, None)
            self._set_rates([end for end in sorted(self.degraded) if not self._elsewhere(*end)])
            self.degraded.clear()

    # -- controller faults --------------------------------------------------------------------------
    def kill_controller(self) -> None:
        """Crash the controller (SIGKILL): switches are in fail-mode secure and keep forwarding on their rules."""
        assert self.controller is not None and self.controller.proc is not None
        self.controller.proc.kill()
        self.controller.proc.wait()

    def restart_controller(self) -> None:
        """Start the same app again on the same address; it resynchronises every switch in place."""
        assert self.controller is not None and self.state is not None
        old = self.controller
        self.controller = ControllerProcess(self.app, self.directory / "fabric.json", self.directory, seed=self.seed,
                                            host=old.host, port=old.port, env=old.env, netns=old.netns)
        self.state.add_process("controller", self.controller.start())
        self.state.save()
        switches = self.fabric.switches()
        self.controller.wait_synced(switches, {link for link in self.failed if link & set(switches)})

    # -- conveniences -----------------------------------------------------------------------------
    def host(self, name: str):
        assert self.net is not None
        return self.net[name]

    def netns(self, name: str) -> str | None:
        """The path of a host's or a switch's network namespace (None: the root one), for a process that opens
        sockets in several nodes."""
        if self.fabric.node(name)["kind"] != "host":
            assert self.switchd is not None
            return netns_path(self.switchd.netns_of(name))
        return f"/proc/{self.host(name).pid}/ns/net"

    def switch_namespaces(self) -> list[str | None]:
        """Paths of the namespaces holding switch-side ports (None is the root namespace)."""
        assert self.switchd is not None
        return [netns_path(ns) for ns in self.switchd.namespaces()]

    def ecn_marks(self) -> dict[str, dict[str, int]]:
        """Per switch port, the packets marked CE (emulator.net.network.FabricNet.ecn_marks)."""
        assert self.net is not None
        return self.net.ecn_marks()

    @property
    def marker_resync(self) -> Callable[[dict[str, int], int], dict[str, int]] | None:
        """What brings the eBPF marker's queues to the real ones (marking.Marker.resync), None without it."""
        assert self.net is not None
        return self.net.marker.resync if self.net.marker else None

    @property
    def pauses(self) -> Pauses:
        """What the fabric's pauses measured so far (none on a lossy fabric)."""
        assert self.net is not None
        return Pauses(self.net.pauses)

    def queue_drops(self) -> dict[str, int]:
        """Packets dropped so far by each modelled queue's interface, switch ports and hosts' NICs (on this
        server)."""
        reader = QdiscReader(self.switch_namespaces() + [self.netns(h) for h in self.local_fabric.hosts()])
        try:
            return reader.drops()
        finally:
            reader.close()

    def drop_counters(self) -> ledger.Counters:
        """Every drop counter of this server's part of the run, by place (emulator.net.ledger): its queues, its
        switch daemons' port input, its hosts' IP layers and sockets, its interfaces, the kernel's backlog."""
        assert self.switchd is not None
        hosts = {h: self.netns(h) for h in self.local_fabric.hosts()}
        counters = ledger.host_counters(hosts)
        for intf, n in self.queue_drops().items():
            place = ledger.place_of_interface(self.fabric, intf)
            if place != "switch_queue":  # a switch's are counted whole, below
                counters.setdefault(place, {})[intf] = n
        switch_ns = self.switch_namespaces()
        counters["switch_input"] = ledger.switch_input_counters(switch_ns, self.switch_sockets())[0]
        counters["switch_queue"] = ledger.switch_losses(
            self.local_fabric.switches(), monitor.netdev_counters("rx", "packets", switch_ns),
            monitor.netdev_counters("tx", "packets", switch_ns), counters["switch_input"])
        everywhere = switch_ns + list(hosts.values())
        rx, tx = (monitor.netdev_counters(d, "drops", everywhere) for d in ("rx", "tx"))
        ours = set(self.local_fabric.graph)
        counters["interface"] = {i: n + tx[i] for i, n in rx.items() if i.partition("-eth")[0] in ours}
        counters["kernel_backlog"] = {"machine": ledger.softnet_drops()}
        return counters

    def switch_input_waiting(self, sockets: set[int] | None = None) -> dict[str, int]:
        """Bytes waiting now in each switch port's input socket of its daemon (`sockets`: switch_sockets, found
        once by a caller that asks often)."""
        assert self.switchd is not None
        return ledger.switch_input_counters(self.switch_namespaces(), sockets or self.switch_sockets())[1]

    def switch_sockets(self) -> set[int]:
        """The inodes of the switch daemons' sockets (their ports' input among them)."""
        assert self.switchd is not None
        return ledger.socket_inodes(self.switchd.vswitchd_pids().values())

    def wait_drained(self, timeout_s: float = 3.0) -> bool:
        """Wait until no packet is left in a queue or in a switch daemon's input (so that counters read next
        see every packet of a run where it ended); whether they emptied within `timeout_s`."""
        reader = QdiscReader(self.switch_namespaces() + [self.netns(h) for h in self.local_fabric.hosts()])
        sockets = self.switch_sockets()
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                waiting = self.switch_input_waiting(sockets)
                if not any(reader.backlogs().values()) and not any(waiting.values()):
                    return True
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
        finally:
            reader.close()

    def link_counters(self, direction: str = "tx") -> dict[str, int]:
        """tx (or rx) bytes of every switch-side interface."""
        return monitor.link_counters(direction, self.switch_namespaces())

    def tunnel_counters(self) -> dict[str, dict[str, int]]:
        """What each VXLAN tunnel to another server has carried so far: tx and rx bytes and packets."""
        names = [t.name for t in self.tunnels]
        counts = {(d, w): monitor.netdev_counters(d, w) for d in ("tx", "rx") for w in ("bytes", "packets")}
        return {n: {f"{d}_{w}": c.get(n, 0) for (d, w), c in counts.items()} for n in names}

    def packet_counters(self, intfs: list[str], direction: str = "tx") -> dict[str, int]:
        return monitor.packet_counters(intfs, direction, self.switch_namespaces())

    def queue_reader(self) -> QdiscReader:
        """A reader of every switch-side queue's backlog (not thread-safe: one per thread)."""
        return QdiscReader(self.switch_namespaces())

    def ofctl_target(self, switch: str) -> str:
        """What `ovs-ofctl` takes to reach a switch (its private daemon's management socket)."""
        assert self.switchd is not None
        return self.switchd.instance_of(switch).target(switch)

    def switch_netns(self, switch: str) -> str | None:
        """The name of the namespace holding a switch's ports (for `ip -n`, `tc -n`); None: the root."""
        assert self.switchd is not None
        return self.switchd.netns_of(switch)

    def run_processes(self) -> dict[str, int]:
        """The controller and what this run started in its hosts (label -> pid): what the CPU monitor watches
        beside the switch daemon (the hosts' and switches' idle shells are left out)."""
        running = self.controller and self.controller.proc
        return {**self.started, **({"controller": running.pid} if running else {})}

    def start_capture(self, options: tap.CaptureOptions, directory: Path) -> capture.Capture:
        """tcpdump on the interfaces `options` names, each in its namespace (and over several servers, on its
        server), into directory/<interface>.pcap; returns once every one is listening. Stop it (its stop())
        before the emulation goes down."""
        assert self.state is not None and self.fabric is not None
        directory.mkdir(parents=True, exist_ok=True)
        return self._capture(tap.interfaces(self.fabric, options.ports), options.snaplen, directory)

    def _capture(self, chosen: dict[str, str], snaplen: int, directory: Path) -> capture.Capture:
        """tcpdump on these of this machine's interfaces (interface -> its node), once every one listens."""
        procs, files = {}, {}
        for intf, node in chosen.items():
            files[intf] = directory / f"{intf}.pcap"
            argv = capture.tcpdump_argv(intf, files[intf], snaplen)
            pipes = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True}
            if self.fabric.node(node)["kind"] == "host":
                procs[intf] = self.popen(node, argv, **pipes)
            else:
                netns = self.netns(node)
                procs[intf] = self._record(node, argv, subprocess.Popen(
                    (["nsenter", f"--net={netns}"] if netns else []) + argv, **pipes))
        running = capture.Capture(procs, files)
        try:
            running.wait_listening()
        except BaseException:
            running.stop()
            raise
        return running

    def popen(self, host: str, argv: list[str], **kwargs):
        """Start a process in a host and record it, so teardown and `mpft clean` find it."""
        return self._record(host, argv, self.host(host).popen(argv, **kwargs))

    def _record(self, node: str, argv: list[str], proc: subprocess.Popen) -> subprocess.Popen:
        """A process this run started in a node: in the run's state (teardown, `mpft clean`) and CPU-watched."""
        assert self.state is not None
        self.state.add_process(f"{node}:{argv[0]}:{proc.pid}", proc.pid)
        self.state.save()
        self.started[f"{node} pid {proc.pid}"] = proc.pid
        return proc
