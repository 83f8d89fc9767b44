"""The fabric model as a running Mininet network, built in batches.

Plain Mininet makes every veth, address and bridge with its own command round trip; here the hosts are
ordinary Mininet hosts (so the Mininet CLI and `host.cmd` work as people know them), but interfaces are
made in one `ip -batch`, all OVS bridges in one ovsdb transaction, switch-side shaping in one `tc -batch`,
and each host configures itself with one command, all hosts in parallel.

Switch ports live where their switch daemon runs (emulator.net.switchd): in their plane's namespace, or in
the root namespace when the machine's own OVS forwards them. NVLink domains are Linux bridges in the root
namespace: kernel forwarding keeps intra-node traffic off the switch daemons, as NVLink is off the scale-out
network.
"""

from __future__ import annotations

import logging
import resource
import shlex
import socket
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mininet.link import Intf, Link
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch, Switch

from emulator.model import hostconfig, naming, wire
from emulator.model.errors import EnvironmentProblem, InternalError
from emulator.model.fabric import Fabric
from emulator.model.placement import TunnelEnd
from emulator.net import marking, ovs, pause, shaping
from emulator.net.commands import in_netns, in_netns_with_our_mounts, run_tool
from emulator.net.offloads import offloads_off
from emulator.net.qdiscs import QdiscReader
from emulator.net.runstate import BPFFS_NOTE, RunState, delete_links, netns_inode
from emulator.net.switchd import Instance, SwitchDaemons, netns_path
from traffic.netns import entered

log = logging.getLogger(__name__)

VXLAN_PORT = 4789  # IANA's, on the servers' own addresses
SHOW_SPLIT = "mpft-show-split"  # separates the two tc outputs of one host command


class PreparedIntf(Intf):
    """An interface already made and configured in a batch: registering it runs no command."""

    def config(self, **_params):  # noqa: D102 - Mininet hook
        return {}


class PreparedLink(Link):
    """A Mininet link over a veth pair made beforehand by FabricNet."""

    def makeIntfPair(self, *_args, **_kwargs):  # noqa: N802 - Mininet's name
        return None


class FabricSwitch(OVSSwitch):
    """An OVS bridge whose ovsdb configuration is done for all bridges at once by FabricNet."""

    @classmethod
    def setup(cls):  # noqa: D102 - Mininet's check asks the machine's OVS, which a private daemon does not need
        return None

    def start(self, controllers):  # noqa: D102 - configured in FabricNet.start
        return None

    def stop(self, deleteIntfs=True):  # noqa: N803, D102 - removed in FabricNet.stop
        self.terminate()


class KernelBridge(Switch):
    """A Linux bridge (an NVLink domain); made and removed in FabricNet's batches."""

    def start(self, controllers):  # noqa: D102
        return None

    def stop(self, deleteIntfs=True):  # noqa: N803, D102
        self.terminate()

    def connected(self):  # noqa: D102 - a learning bridge needs no controller
        return True


def _disable_ipv6(intf: str) -> None:
    """No router solicitations or MLD reports from switch-side ports into the fabric."""
    path = Path(f"/proc/sys/net/ipv6/conf/{intf}/disable_ipv6")
    if path.exists():
        path.write_text("1")


class FabricNet(Mininet):
    """A Mininet network built from a Fabric. Call build(), start(), and stop() exactly once each."""

    def __init__(self, fabric: Fabric, state: RunState, datapath: str, controller: str | None,
                 switchd: SwitchDaemons, shape: bool = True, progress: Callable[[str], None] | None = None,
                 ecn_marker: str = "", model: Fabric | None = None, tunnels: tuple[TunnelEnd, ...] = ()) -> None:
        """`fabric` is what this machine builds; `model`, if that is a part of a cluster run
        (emulator.model.placement), the whole, which hosts' routes and neighbours come from, and `tunnels` the
        VXLAN ends joining this part's NVLink bridges to their other halves."""
        # Mininet.init() raises machine-wide sysctls (buffer sizes, backlog, neighbour tables) and never puts
        # them back; Mininet.__init__ calls it by its own class's name, so only Mininet's flag keeps it away
        # (a flag on this subclass, as here before, was never read: every run raised them)
        Mininet.inited = True
        super().__init__(topo=None, build=False, controller=None, link=PreparedLink, intf=PreparedIntf)
        self.fabric = fabric
        self.model = model or fabric
        self.tunnels = tunnels
        self.switchd = switchd
        self.state = state
        self.datapath = datapath
        self.controller_target = controller
        self.shape = shape
        self.progress = progress or (lambda _step: None)
        self.ecn_marker = ecn_marker  # "red" (a RED leaf queue), "bpf" (emulator.net.marking) or "" (no ECN)
        self.marker: marking.Marker | None = None
        self.pauses: pause.PauseController | None = None  # lossless fabrics
        self.host_dir = state.directory / "hosts"
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))  # one pty per node

    # -- build ---------------------------------------------------------------------------------
    def build(self) -> None:
        f = self.fabric
        for name in f.hosts() + f.switches() + f.nvlink_domains():
            naming.check_name(name)
        self.progress("hosts")
        for host in f.hosts():
            node = self.addHost(host, cls=Host)
            self.state.add_process(host, node.pid)
            self.state.netns.append(netns_inode(node.pid) or 0)
        self.state.save()
        self.progress("switches")
        for sw in f.switches():
            node = self.addSwitch(sw, cls=FabricSwitch, dpid=f"{f.node(sw)['dpid']:016x}",
                                  datapath=self.datapath, protocols=ovs.PROTOCOLS, failMode="secure")
            self.state.add_process(sw, node.pid)
        for domain in f.nvlink_domains():
            dpid = naming.dpid("nvlink", 0, f.node(domain)["node"])
            node = self.addSwitch(domain, cls=KernelBridge, dpid=f"{dpid:016x}")
            self.state.add_process(domain, node.pid)
        self.progress("links")
        self._make_links()
        self.built = True

    def _ends(self):
        """(root-namespace end, other end) of every link: hosts' ends live in their namespaces."""
        f = self.fabric
        for a, b, data in f.graph.edges(data=True):
            if f.node(a)["kind"] == "host":
                a, b = b, a
            yield a, b, data

    def _by_netns(self, items: list[tuple[str, str]]) -> dict[str | None, list[str]]:
        """Items (node, item) grouped by the namespace their node's ports live in."""
        grouped: dict[str | None, list[str]] = {}
        for node, item in items:
            grouped.setdefault(self.switchd.netns_of(node), []).append(item)
        return grouped

    def _netns_arg(self, node: str) -> str:
        """`ip link add`'s words placing an interface of `node` in its namespace (none for the root)."""
        netns = self.switchd.netns_of(node)
        return f" netns {netns}" if netns else ""

    def _make_links(self) -> None:
        f = self.fabric
        lines, switch_side = [], []
        group = self.state.link_group
        for a, b, data in self._ends():
            ia, ib = naming.intf_name(a, data["ports"][a]), naming.intf_name(b, data["ports"][b])
            peer = f"peer name {ib} mtu {f.mtu}"
            if f.node(b)["kind"] == "host":
                mac = f.node(b)["ports"][data["ports"][b]]["mac"]
                peer += f" address {mac} netns {self[b].pid}"
            else:
                switch_side.append((b, ib))
                peer += self._netns_arg(b)
            lines.append(f"link add name {ia}{self._netns_arg(a)} mtu {f.mtu} group {group} type veth {peer}")
            switch_side.append((a, ia))
        by_netns = self._by_netns(switch_side)
        root_up = by_netns.pop(None, [])
        self.state.root_intfs = list(root_up) + [t.name for t in self.tunnels]
        self.state.kernel_bridges = f.nvlink_domains()
        self.state.save()
        for domain in f.nvlink_domains():
            lines.append(f"link add name {domain} group {group} type bridge forward_delay 0 stp_state 0 "
                         "mcast_snooping 0")
        lines += [f"link add name {t.name} mtu {f.mtu} group {group} type vxlan id {t.vni} local {t.local} "
                  f"remote {t.remote} dstport {VXLAN_PORT}" for t in self.tunnels]
        run_tool(["ip", "-batch", "-"], "\n".join(lines) + "\n")
        up = []
        for a, b, data in self._ends():
            ia, ib = naming.intf_name(a, data["ports"][a]), naming.intf_name(b, data["ports"][b])
            addr = f.node(b)["ports"][data["ports"][b]] if f.node(b)["kind"] == "host" else {}
            self.addLink(a, b, port1=data["ports"][a], port2=data["ports"][b], intfName1=ia, intfName2=ib,
                         addr1=None, addr2=addr.get("mac"))
            if addr:
                intf = self[b].intfs[data["ports"][b]]
                intf.ip, intf.prefixLen = addr["ip"], (hostconfig.NVLINK_PREFIX if addr["plane"] is None
                                                       else hostconfig.NIC_PREFIX)
            if f.node(a)["kind"] == "nvlink":
                up.append(f"link set {ia} master {a}")
        root_up += f.nvlink_domains() + [t.name for t in self.tunnels]
        for name in root_up:  # the planes' namespaces have IPv6 off by default
            _disable_ipv6(name)
        up += [f"link set {t.name} master {t.domain}" for t in self.tunnels]
        up += [f"link set {name} up" for name in root_up]
        run_tool(["ip", "-batch", "-"], "\n".join(up) + "\n")
        for netns, intfs in by_netns.items():
            run_tool(in_netns("ip", netns) + ["-batch", "-"], "".join(f"link set {name} up\n" for name in intfs))

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> None:
        f = self.fabric
        # Hosts' ends up before the switches connect to the controller: a port that comes up after its switch
        # connected is a repair the app computes routes for (512 GPUs: 512 of them, 38 s).
        self.progress("hosts config")
        self._configure_hosts()
        self.progress("open vswitch")
        specs = [ovs.BridgeSpec(sw, f.node(sw)["dpid"], tuple(
            (naming.intf_name(sw, d["ports"][sw]), d["ports"][sw]) for _, d in f.graph[sw].items()))
            for sw in f.switches()]
        if not self.switchd.private:  # private daemons take their bridges with them
            self.state.bridges = [s.name for s in specs]
            self.state.save()
        datapath_type = "system" if self.datapath == "kernel" else "netdev"
        by_instance: dict[Instance, list[ovs.BridgeSpec]] = {}
        for spec in specs:
            by_instance.setdefault(self.switchd.instance_of(spec.name), []).append(spec)
        with ThreadPoolExecutor(len(by_instance)) as pool:  # one transaction per daemon, all at once
            done = [pool.submit(instance.vsctl,
                                ovs.add_bridges_args(group, self.state.run_id, datapath_type, self.controller_target))
                    for instance, group in by_instance.items()]
            for transaction in done:
                transaction.result()
        if self.shape:
            self.progress("shaping")
            self.apply_root_shaping()
            problems = self.verify_shaping()
            if problems:
                raise EnvironmentProblem(f"link shaping not in place: {'; '.join(problems[:5])}")
        if self.ecn_marker == "bpf" or self.fabric.lossless:
            self.apply_marking()
        if self.fabric.lossless:
            self.pauses = pause.PauseController(self.marker, *self._pause_plan()).start()

    def _host_command(self, host: str) -> str:
        setup = hostconfig.host_setup(self.model, host)
        self.host_dir.mkdir(exist_ok=True)
        ip_file = self.host_dir / f"{host}.ip"
        ip_file.write_text("\n".join(setup.ip_lines) + "\n")
        # sysctls by the shell's own printf: no process per host for them
        steps = [f"printf %s {shlex.quote(v)} > {shlex.quote('/proc/sys/' + k.replace('.', '/'))}"
                 for k, v in setup.sysctls.items()]
        steps.append(shlex.join(["ip", "-batch", str(ip_file)]))
        if self.shape:
            tc_file = self.host_dir / f"{host}.tc"
            tc_file.write_text("\n".join(self._tc_lines_of(host)) + "\n")
            steps.append(shlex.join(["tc", "-batch", str(tc_file)]))
        chain = " && ".join(steps)
        return f"( {chain} ) >/dev/null; echo mpft-status=$?"

    def _in_every_host(self, command_of: Callable[[str], str], hosts: list[str] | None = None) -> dict[str, str]:
        """One command per host (of `hosts`, default all), sent to all before waiting for any, so they run in
        parallel."""
        hosts = self.fabric.hosts() if hosts is None else hosts
        for host in hosts:
            self[host].sendCmd(command_of(host))
        return {host: self[host].waitOutput() for host in hosts}

    def _configure_hosts(self) -> None:
        outputs = self._in_every_host(self._host_command)
        failed = [f"{host}: {' / '.join(out.strip().splitlines())[-300:]}" for host, out in outputs.items()
                  if "mpft-status=0" not in out]
        if failed:  # the kernel's features were checked before: a refused line is one we wrote wrong
            raise InternalError(f"host configuration refused: {failed[0]}")
        if self.datapath == "user":  # NICs only: NVLink ports are on kernel bridges, where GSO saves the CPU most
            # of the emulation's packets cost
            offloads_off({f"/proc/{self[h].pid}/ns/net": [naming.intf_name(h, port) for _leaf, port in
                                                          self.fabric.nic_links(h)] for h in self.fabric.hosts()})

    # -- shaping -----------------------------------------------------------------------------------
    def _tc_lines_of(self, node: str) -> list[str]:
        f = self.fabric
        lines = []
        for peer, data in f.graph[node].items():
            shape = self._shape(f.rate(node, peer), self._queueing(node), self._queue_bytes(node))
            lines += shaping.tc_lines(naming.intf_name(node, data["ports"][node]), shape)
        return lines

    def _shape(self, rate_bps: float, queueing: str = "fifo", queue_bytes: int | None = None) -> shaping.Shape:
        f = self.fabric
        return shaping.Shape(rate_bps, f.mtu, queue_bytes or f.queue_bytes, f.delay_ms, f.loss_pct,
                             self.ecn_marker == "red", queueing, f.ecn_thresholds, f.lossless)

    def _queue_bytes(self, node: str) -> int:
        """A port's queue: the model's, but a lossless host NIC's is deep enough that its agent's socket buffers
        fill first, so a paused NIC holds its agent back instead of dropping (pause.HOST_QUEUE_BYTES)."""
        if self.fabric.lossless and self.fabric.node(node)["kind"] == "host":
            return pause.HOST_QUEUE_BYTES
        return self.fabric.queue_bytes

    def _queueing(self, node: str) -> str:
        """Switch ports queue as the model says; host NICs and NVLink ports keep one FIFO, but a lossless host NIC
        has a queue per class when the switches do, so that it can pause one class (PFC's priorities)."""
        kind = self.fabric.node(node)["kind"]
        if kind == "switch" or (kind == "host" and self.fabric.lossless):
            return self.fabric.queueing
        return "fifo"

    def _root_nodes(self) -> list[str]:
        return self.fabric.switches() + self.fabric.nvlink_domains()

    def _nodes_by_netns(self, nodes: list[str]) -> dict[str | None, list[str]]:
        return self._by_netns([(node, node) for node in nodes])

    def apply_root_shaping(self, nodes: list[str] | None = None) -> None:
        """Shape the switch side of links (switch and NVLink ports), after OVS has added its ports."""
        for netns, group in self._nodes_by_netns(nodes or self._root_nodes()).items():
            lines = [line for n in group for line in self._tc_lines_of(n)]
            run_tool(in_netns("tc", netns) + ["-batch", "-"], "\n".join(lines) + "\n")

    def verify_shaping(self) -> list[str]:
        """Compare every interface's qdiscs and class rate with the model; returns the mismatches."""
        problems = self._verify(self._root_nodes())

        def show(host: str) -> str:
            batch = self.host_dir / f"{host}.tc-show"
            batch.write_text(self._class_batch([host]))
            return f"tc -j qdisc show; echo {SHOW_SPLIT}; {shlex.join(['tc', '-batch', str(batch)])}"
        for host, out in self._in_every_host(show).items():
            qdisc_json, _, class_out = out.partition(SHOW_SPLIT)
            problems += self._compare([host], qdisc_json, class_out)
        return problems

    def _verify(self, nodes: list[str]) -> list[str]:
        """Shaping of switch and NVLink ports against the model."""
        problems = []
        for netns, group in self._nodes_by_netns(nodes).items():
            problems += self._compare(group, run_tool(in_netns("tc", netns) + ["-j", "qdisc", "show"]),
                                      run_tool(in_netns("tc", netns) + ["-batch", "-"], self._class_batch(group)))
        return problems

    def _class_batch(self, nodes: list[str]) -> str:
        """A tc batch showing the shaping class of every port of `nodes`."""
        return "\n".join(shaping.class_show_lines(sorted(self.fabric.egress_rates(nodes)))) + "\n"

    def _compare(self, nodes: list[str], qdisc_json: str, class_out: str) -> list[str]:
        expected = self.fabric.egress_rates(nodes)
        intfs = sorted(expected)
        queueing = {intf: self._queueing(n) for n in nodes for intf in self.fabric.egress_rates([n])}
        kind = self._shape(0).leaf_kind
        shaped = {q: shaping.shaped_interfaces(qdisc_json, kind, q) for q in set(queueing.values())}
        missing = [i for i in intfs if i not in shaped[queueing[i]]]
        if missing:
            return [f"{i}: not shaped" for i in missing]
        return shaping.mismatches(expected, shaping.class_rates(intfs, class_out))

    # -- ECN marking without RED ----------------------------------------------------------------------
    def _switch_ports(self, nodes: list[str] | None = None) -> dict[str, tuple[str, str]]:
        """Every OVS port of `nodes` (default all): interface -> (its switch, the peer it sends to)."""
        f = self.fabric
        return {naming.intf_name(sw, data["ports"][sw]): (sw, peer)
                for sw in (nodes if nodes is not None else f.switches()) if f.node(sw)["kind"] == "switch"
                for peer, data in f.graph[sw].items()}

    def apply_marking(self) -> None:
        """Hook the eBPF marker to every OVS port's egress and give it the ports' rates and thresholds; after
        OVS has taken its ports (taking one, it may replace the port's qdiscs)."""
        obj = marking.build(self.state.directory)
        marking.mount_bpffs(BPFFS_NOTE)
        marking.remove_pins()  # a crashed run's: runs take the machine one at a time
        self.state.ecn_pins = True
        self.state.save()
        ports = self._switch_ports()
        by_netns = self._by_netns([(sw, intf) for intf, (sw, _) in ports.items()])
        intfs: dict[str, tuple[tuple[int, int], float]] = {}
        for netns, group in by_netns.items():
            run_tool(in_netns_with_our_mounts("tc", netns) + ["-batch", "-"],
                     "".join(f"{line}\n" for intf in group for line in marking.tc_lines(intf, obj)))
            with entered(netns_path(netns)):
                cookie, index = marking.netns_cookie(), {name: i for i, name in socket.if_nameindex()}
            intfs.update({intf: ((cookie, index[intf]), self.fabric.rate(*ports[intf])) for intf in group})
        seen: dict[tuple[int, int], str] = {}
        for intf, (key, _) in intfs.items():
            if key in seen:  # only where tc programs cannot read the namespace (cookie 0): before Linux 6.15
                raise EnvironmentProblem(f"the eBPF marker cannot tell {seen[key]} from {intf} (both interface "
                                         f"{key[1]}, and this kernel's tc programs cannot tell namespaces apart): "
                                         f"run the switches in one daemon (MPFT_SWITCH_DAEMONS=shared)")
            seen[key] = intf
        xoff = {intf: self.fabric.pause_thresholds(*ports[intf])[0] for intf in intfs} if self.fabric.lossless else {}
        # a lossless port's gate lets one frame go at once where HTB alone would let its burst go
        burst = (shaping.gate_burst if self.fabric.lossless else shaping.burst_bytes)(self.fabric.mtu)
        classes = frozenset(intfs) if self.fabric.queueing == "class" else frozenset()
        self.marker = marking.Marker(intfs, marking.thresholds(self.fabric, self.ecn_marker == "bpf"), burst, xoff,
                                     classes)
        problems = self.verify_marking()
        if problems:
            raise EnvironmentProblem(f"ECN marking not in place: {'; '.join(problems[:5])}")

    def verify_marking(self, nodes: list[str] | None = None) -> list[str]:
        """The marker on the egress of every OVS port of `nodes` (default all), as tc lists it."""
        problems = []
        for netns, group in self._by_netns([(sw, i) for i, (sw, _) in self._switch_ports(nodes).items()]).items():
            shown = run_tool(in_netns_with_our_mounts("tc", netns) + ["-batch", "-"],
                             "".join(f"filter show dev {intf} egress\n" for intf in group))
            if shown.count(f"[{marking.SECTION}]") != len(group):
                problems.append(f"{len(group) - shown.count(f'[{marking.SECTION}]')} of {len(group)} ports "
                                f"in {netns or 'the root namespace'} have no marker")
        return problems

    def _pause_plan(self) -> tuple[dict[str, pause.PausePoint], dict[str, pause.Gate]]:
        """Every switch port's thresholds and feeders, and every egress feeding a switch, as gates: per traffic
        class when the ports queue per class (each class's queue as deep as the one FIFO, so with the same
        thresholds)."""
        f = self.fabric
        tclasses: list[int | None] = list(range(shaping.TCLASSES)) if f.queueing == "class" else [None]
        points = {}
        for intf, (sw, peer) in self._switch_ports().items():
            xoff, xon, _headroom = f.pause_thresholds(sw, peer)
            for c in tclasses:
                points[pause.queue_name(intf, c)] = pause.PausePoint(
                    xoff, xon, [pause.queue_name(f.intf(a, b), c) for a, b in f.feeders(sw, peer)],
                    f.rate(sw, peer), f.mtu + wire.ETH, intf, c)
        namespaces = {node: netns_path(ns) for ns, nodes in self._nodes_by_netns(f.switches()).items()
                      for node in nodes}
        gates = {}
        for sw in f.switches():
            for n in f.graph[sw]:
                host = f.node(n)["kind"] == "host"
                for c in tclasses:
                    gates[pause.queue_name(f.intf(n, sw), c)] = pause.Gate(
                        f.intf(n, sw), f"/proc/{self[n].pid}/ns/net" if host else namespaces[n], f.rate(n, sw),
                        shaping.gate_burst(f.mtu), self._queue_bytes(n), marked=not host, tclass=c)
        return points, gates

    def ecn_marks(self) -> dict[str, dict[str, int]]:
        """Per switch port, the packets marked CE: from RED's own statistics where RED marks, else as the eBPF
        marker counted them (with packets queued and the deepest backlog); {} where nothing marks."""
        if self.ecn_marker != "red":
            return self.marker.counts() if self.marker else {}
        ports = self._switch_ports()
        reader = QdiscReader([netns_path(ns) for ns in self._by_netns([(sw, i) for i, (sw, _) in ports.items()])])
        try:
            return {intf: {"marked": n} for intf, n in reader.red_marks().items() if intf in ports}
        finally:
            reader.close()

    # -- faults -------------------------------------------------------------------------------------
    def set_links(self, links: list[tuple[str, str]], up: bool) -> None:
        """Cut or repair links by setting interfaces down or up (the userspace datapath does not notice a
        deleted veth). Switch ends go down; a host keeps its own end up and sees the carrier drop, as on a real
        cable cut, so its routes survive. Repaired links have their shaping re-applied and checked."""
        state = "up" if up else "down"
        switch_ends = [(n, self.fabric.intf(n, peer)) for a, b in links for n, peer in ((a, b), (b, a))
                       if self.fabric.node(n)["kind"] != "host"]
        for netns, intfs in self._by_netns(switch_ends).items():
            run_tool(in_netns("ip", netns) + ["-batch", "-"], "".join(f"link set {intf} {state}\n" for intf in intfs))
        if up and self.shape:
            nodes = sorted({n for a, b in links for n in (a, b) if self.fabric.node(n)["kind"] != "host"})
            if self._verify(nodes):  # HTB cannot be changed in place: start those ports afresh
                for netns, group in self._nodes_by_netns(nodes).items():
                    deletes = "".join(f"qdisc del dev {i} root\n" for i in self.fabric.egress_rates(group))
                    subprocess.run(in_netns("tc", netns) + ["-force", "-batch", "-"], input=deletes,
                                   capture_output=True, text=True, check=False)
                self.apply_root_shaping(nodes)
            problems = self._verify(nodes) + (self.verify_marking(nodes) if self.marker else [])
            if problems:
                raise EnvironmentProblem(f"link shaping not in place after repair: {'; '.join(problems[:5])}")

    def set_rates(self, ends: list[tuple[str, str]]) -> None:
        """Re-rate the egress of `a` towards `b` for every (a, b) to what the model says now, in place (HTB
        classes change without touching their queues, so nothing queued is lost), and check it."""
        lines: dict[str, list[str]] = {}
        for a, b in ends:
            shape = self._shape(self.fabric.rate(a, b), self._queueing(a), self._queue_bytes(a))
            lines.setdefault(a, []).extend(line for line in shaping.tc_lines(self.fabric.intf(a, b), shape)
                                           if line.startswith("class "))
        switches = [n for n in lines if self.fabric.node(n)["kind"] != "host"]
        rerate = self.pauses or self.marker  # the marker's queues drain at the new rates too, gates resume at them
        if rerate:
            for a, b in ends:
                intf = self.fabric.intf(a, b)
                if self.pauses or intf in rerate.slots:
                    rerate.set_rate(intf, self.fabric.rate(a, b))
        for netns, group in self._nodes_by_netns(switches).items():
            run_tool(in_netns("tc", netns) + ["-batch", "-"], "".join(f"{line}\n" for n in group for line in lines[n]))

        def rerate(host: str) -> str:
            batch = self.host_dir / f"{host}.rate"
            batch.write_text("".join(f"{line}\n" for line in lines[host]))
            return f"{shlex.join(['tc', '-batch', str(batch)])} >/dev/null; echo mpft-status=$?"
        outputs = self._in_every_host(rerate, [n for n in lines if n not in switches])
        failed = [host for host, out in outputs.items() if "mpft-status=0" not in out]
        problems = (self._verify(switches) if switches else []) + [f"{h}: tc refused the new rate" for h in failed]
        if problems:
            raise EnvironmentProblem(f"link rate not in place: {'; '.join(problems[:5])}")

    # -- stop ---------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove our bridges while ending every node's shell (their namespaces go with them) and removing
        our interfaces in one batch.

        Removing a userspace port costs ovs-vswitchd a kernel RCU grace period (about 12 ms, serially, to
        close its AF_PACKET socket), so the ovsdb transaction runs in a thread beside the rest.
        """
        if self.pauses:
            self.pauses.stop()
        if self.marker:
            self.marker.close()  # its maps are unpinned with the rest of the run (runstate.remove_run)
        with ThreadPoolExecutor(1) as pool:
            deleted = pool.submit(ovs.vsctl, ovs.del_bridges_args(self.state.bridges))  # none if private
            for node in self.hosts + self.switches:
                node.terminate()
            delete_links(self.state.root_intfs + self.state.kernel_bridges, self.state.link_group)
            deleted.result()
