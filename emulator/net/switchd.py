"""Where the switches run: a private ovsdb-server + ovs-vswitchd per switch, per plane or per core (for a group
of planes), or the machine's own; `auto` chooses per fabric (auto_mode).

A userspace ovs-vswitchd forwards with one thread that polls every port it has and runs every bridge it has on
each wake-up, so on one shared daemon each switch pays for the ports and bridges of all the others. A private
daemon polls only its own. Two userspace datapaths cannot share a network namespace (both want the tap
`ovs-netdev`), so each private daemon and its switch ports live in a namespace of their own (`mpft-<run>-p<k>`
for a plane or a group, `mpft-<run>-s-<switch>` for one switch), like a chassis; the machine's own OVS is not
touched. The controller runs in one more namespace (`mpft-<run>-c`) joined to every plane by a
private control network, so it listens nowhere the machine's other programs or neighbours can reach.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from emulator.model.errors import EnvironmentProblem
from emulator.model.fabric import Fabric
from emulator.net import ovs
from emulator.net.commands import netns_path, run_tool
from emulator.net.priority import NETWORK_NICE, group_nice, set_group_nice
from emulator.net.runstate import NETNS_PREFIX, RunState, delete_netns, process_start, terminate
from traffic.netns import entered

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
MODES = ("auto", "per-switch", "per-plane", "per-core", "shared")
CONTROL_BRIDGE = "ctl"  # in the controller's namespace; each plane's end of the control network has this name
CONTROLLER_IP = "169.254.0.254"  # only inside our namespaces: no route leads there from the machine
# glibc gives freed memory back at the top of the heap (trim) and maps big blocks afresh each time; a vswitchd's
# main loop frees and reallocates its receive batches on every wake-up, so each one paid page faults (with
# --mlockall, locking and unlocking too): measured on the default fabric at 100 packets/s per plane, shaped,
# 1.88 cores for two daemons, 0.19 with both thresholds raised.
MALLOC = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"}


def default_mode() -> str:
    mode = os.environ.get("MPFT_SWITCH_DAEMONS", "auto")
    if mode not in MODES:
        raise EnvironmentProblem(f"MPFT_SWITCH_DAEMONS={mode!r}: choose one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Instance:
    """One ovsdb-server + ovs-vswitchd: the machine's own (`directory` None) or a private one of this run."""

    key: str                 # "system", a switch's name, "p<plane>", or "p<first>-<last>" for a group of planes
    directory: Path | None   # its database, sockets, pid and log files
    netns: str | None        # the named namespace holding its ports (None: the root namespace)

    @property
    def db(self) -> str | None:
        return None if self.directory is None else str(self.directory / "db.sock")

    def vsctl(self, args: list[str], timeout: int = 120) -> str:
        return ovs.vsctl(args, timeout, db=self.db)

    def vswitchd_pid(self) -> int | None:
        return ovs.read_pid() if self.directory is None else ovs.read_pid(self.directory / "vswitchd.pid")

    def log_file(self) -> Path | None:
        return None if self.directory is None else self.directory / "vswitchd.log"

    def target(self, bridge: str) -> str:
        """What `ovs-ofctl` takes to reach one of this instance's bridges."""
        return bridge if self.directory is None else f"unix:{self.directory / bridge}.mgmt"

    def start(self, state: RunState) -> None:
        """Create the database, then start both daemons detached; each is recorded with its pid and start time
        as soon as its pid file exists, so `mpft clean` finds it after a crash."""
        d = self.directory
        assert d is not None and self.netns is not None
        d.mkdir()
        run_tool(["ovsdb-tool", "create", str(d / "conf.db"), str(SCHEMA)])
        common = ["--detach", "--no-chdir", "--verbose=console:off"]
        run_tool(["ovsdb-server", str(d / "conf.db"), f"--remote=punix:{d / 'db.sock'}",
                  f"--pidfile={d / 'ovsdb.pid'}", f"--unixctl={d / 'ovsdb.ctl'}", f"--log-file={d / 'ovsdb.log'}",
                  *common])
        state.add_process(f"{self.key}:ovsdb-server", _pid_of(d / "ovsdb.pid"))
        self.vsctl(["--no-wait", "init"])
        # OVS_RUNDIR puts the bridges' OpenFlow management sockets in the directory as well.
        run_tool(["ip", "netns", "exec", self.netns, "nice", "-n", str(NETWORK_NICE), "ovs-vswitchd",
                  f"unix:{self.db}", f"--pidfile={d / 'vswitchd.pid'}", f"--unixctl={d / 'vswitchd.ctl'}",
                  f"--log-file={d / 'vswitchd.log'}", "--mlockall", *common],
                 env={**os.environ, "OVS_RUNDIR": str(d), **MALLOC})
        pid = _pid_of(d / "vswitchd.pid")
        state.add_process(f"{self.key}:ovs-vswitchd", pid)
        set_group_nice(pid, NETWORK_NICE)  # --detach left it a session of its own


def _control_ip(n: int) -> str:
    """The n-th private daemon's end of the control network (169.254.0.0/16, the controller at .0.254)."""
    return f"169.254.{1 + n // 250}.{1 + n % 250}"


def _pid_of(pidfile: Path) -> int:
    pid = ovs.read_pid(pidfile)
    if pid is None:
        raise EnvironmentProblem(f"{pidfile.name} was not written: see {pidfile.with_suffix('.log')}")
    return pid


class SwitchDaemons:
    """The switch daemons of one run and the namespaces their ports live in."""

    def __init__(self, fabric: Fabric, state: RunState, mode: str, datapath: str = "user") -> None:
        mode = resolve_mode(fabric, mode, datapath)
        self.fabric, self.state, self.mode = fabric, state, mode
        token = state.run_id.rsplit("-", 1)[-1]
        self.instances: dict[str, Instance] = {}  # switch -> the daemon forwarding it
        for group in daemon_groups(fabric, mode):
            if mode == "shared":
                instance = Instance("system", None, None)
            elif mode == "per-switch":
                switch = group[0]
                instance = Instance(switch, state.directory / f"ovs-{switch}", f"{NETNS_PREFIX}{token}-s-{switch}")
            else:
                planes = sorted({fabric.node(s)["plane"] for s in group})
                key = f"p{planes[0]}" + (f"-{planes[-1]}" if len(planes) > 1 else "")
                instance = Instance(key, state.directory / f"ovs-{key}", f"{NETNS_PREFIX}{token}-p{planes[0]}")
            self.instances.update(dict.fromkeys(group, instance))
        self.control_netns = f"{NETNS_PREFIX}{token}-c" if mode != "shared" else None

    @property
    def private(self) -> bool:
        return self.mode != "shared"

    def instance_of(self, switch: str) -> Instance:
        return self.instances[switch]

    def plane_daemons(self, plane: int) -> list[Instance]:
        """The private daemons forwarding a plane's switches, if they forward nothing else (else none)."""
        mine = {self.instances[s].key: self.instances[s] for s in self.fabric.switches(plane=plane)}
        theirs = {i.key for s, i in self.instances.items() if self.fabric.node(s)["plane"] != plane}
        return list(mine.values()) if self.private and mine and not theirs & mine.keys() else []

    def netns_of(self, node: str) -> str | None:
        """The namespace of a switch's or NVLink domain's ports (NVLink domains stay in the root namespace)."""
        return self.instance_of(node).netns if self.fabric.node(node)["kind"] == "switch" else None

    def namespaces(self) -> list[str | None]:
        """Every namespace holding switch-side ports: the root (NVLink domains, shared switches) and each plane's."""
        return [None] + ([i.netns for i in self.distinct()] if self.private else [])

    def distinct(self) -> list[Instance]:
        return list({i.key: i for i in self.instances.values()}.values())

    def controller_host(self) -> str:
        return CONTROLLER_IP if self.private else "127.0.0.1"

    def vswitchd_pids(self) -> dict[str, int]:
        """Label -> pid of every ovs-vswitchd forwarding this run's switches."""
        pids = {f"ovs-vswitchd {i.key}": i.vswitchd_pid() for i in self.distinct()}
        return {label: pid for label, pid in pids.items() if pid}

    # -- bring-up --------------------------------------------------------------------------------
    def create_namespaces(self) -> None:
        """The daemons' namespaces and the control network: a bridge in the controller's namespace with one
        veth to each daemon. Names are recorded before they are made."""
        if not self.private:
            return
        daemons = self.distinct()
        self.state.named_netns = [self.control_netns] + [i.netns for i in daemons]
        self.state.save()
        lines = [f"netns add {name}" for name in self.state.named_netns]
        lines += [f"link add name c{n} netns {self.control_netns} type veth peer name {CONTROL_BRIDGE} netns {i.netns}"
                  for n, i in enumerate(daemons)]
        run_tool(["ip", "-batch", "-"], "\n".join(lines) + "\n")
        for name in self.state.named_netns:  # no router solicitations or MLD reports from our ports
            with entered(netns_path(name)):
                for scope in ("all", "default"):
                    Path(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6").write_text("1")
        control = [f"link add name {CONTROL_BRIDGE} type bridge", f"addr add {CONTROLLER_IP}/16 dev {CONTROL_BRIDGE}",
                   f"link set {CONTROL_BRIDGE} up", "link set lo up"]
        control += [line for n in range(len(daemons)) for line in (f"link set c{n} master {CONTROL_BRIDGE}",
                                                                   f"link set c{n} up")]
        run_tool(["ip", "-n", self.control_netns, "-batch", "-"], "\n".join(control) + "\n")
        for n, i in enumerate(daemons):
            run_tool(["ip", "-n", i.netns, "-batch", "-"], f"addr add {_control_ip(n)}/16 dev {CONTROL_BRIDGE}\n"
                     f"link set {CONTROL_BRIDGE} up\nlink set lo up\n")

    def start(self) -> None:
        """Start every private instance, all at once; or raise the machine's own (below)."""
        if not self.private:
            self._raise_machine_daemon()
            return
        with ThreadPoolExecutor(len(self.instances)) as pool:
            for done in [pool.submit(i.start, self.state) for i in self.distinct()]:
                done.result()
        self.state.save()

    def _raise_machine_daemon(self) -> None:
        """The machine's own ovs-vswitchd forwarding the run: its session's group at the network's nice too, as
        our private daemons' are (the process's own is ovs-ctl's); runstate.remove_run puts it back, at teardown
        or after a crash."""
        pid = ovs.read_pid()
        previous = group_nice(pid) if pid else None
        if pid is None or previous is None or previous <= NETWORK_NICE:
            return
        self.state.ovs_group_nice_restore = [pid, process_start(pid) or 0, previous]
        self.state.save()
        set_group_nice(pid, NETWORK_NICE)

    def enlarge_send_buffers(self) -> None:
        """Each private vswitchd transmits through its own AF_PACKET socket (ovs.set_send_buffer); they end
        with the run, so nothing needs putting back."""
        for pid in self.vswitchd_pids().values():
            ovs.set_send_buffer(ovs.SEND_BUFFER, pid)

    # -- teardown --------------------------------------------------------------------------------
    def stop(self) -> None:
        """End the private daemons and delete the namespaces (their ports, and the taps of a daemon that died
        without cleaning up, go with them)."""
        if not self.private:
            return
        stop_daemons(self.state)
        delete_netns(self.state.named_netns)


NO_DAEMON_TO_FREEZE = ("fail_plane freezes a plane's switch daemon, and on the kernel datapath (this kernel's) the "
                       "kernel forwards, with no daemon per plane to freeze: fail the plane's switches with "
                       "fail_switch instead")


def resolve_mode(fabric: Fabric, mode: str, datapath: str = "user") -> str:
    """What `mode` means for this fabric: "auto" decided, and the machine's own OVS where a private one cannot
    serve (the kernel datapath is one per namespace already; a link between planes needs one daemon)."""
    if mode not in MODES:
        raise EnvironmentProblem(f"switch daemons {mode!r}: choose one of {', '.join(MODES)}")
    if mode == "auto":
        mode = auto_mode(fabric)
    return "shared" if datapath != "user" or _crosses_planes(fabric) else mode


def auto_mode(fabric: Fabric, cores: int | None = None) -> str:
    """A private daemon per plane while there is a core for each, the machine's own above that.

    A vswitchd's main loop costs about the same per wake-up whatever it forwards, and at sparse load each daemon
    wakes for a packet or two: on the 8-plane reference fabric (2 cores), a staggered all-to-all at 1 Mbit/s took
    49 % of the machine for eight private daemons, 53 % for two, 33 % for the shared one, which batches the
    planes' packets into fewer wake-ups (benchmarks/reference.py). Loaded, the private daemons forward far more
    (every plane at once: 2.5x); with a core per daemon they also run side by side."""
    return "per-plane" if len(fabric.planes) <= (cores or os.cpu_count() or 1) else "shared"


def plane_groups(planes: list[int], mode: str, cores: int | None = None) -> list[list[int]]:
    """The planes each private daemon serves: one each ("per-plane"), or contiguous groups, one per core
    ("per-core": a daemon's forwarding thread is one core's worth, and fewer daemons wake up less often)."""
    if mode == "per-plane":
        return [[p] for p in planes]
    n = min(len(planes), cores or os.cpu_count() or 1)
    size = -(-len(planes) // n)
    return [planes[i:i + size] for i in range(0, len(planes), size)]


def daemon_groups(fabric: Fabric, mode: str) -> list[list[str]]:
    """The switches each daemon forwards in a resolved mode (resolve_mode): all on the machine's own ("shared"),
    one each ("per-switch"), or those of each plane_groups group."""
    if mode == "shared":
        return [fabric.switches()]
    if mode == "per-switch":
        return [[s] for s in fabric.switches()]
    return [[s for p in group for s in fabric.switches(plane=p)] for group in plane_groups(fabric.planes, mode)]


def _crosses_planes(fabric: Fabric) -> bool:
    switches = set(fabric.switches())
    return any(fabric.node(a)["plane"] != fabric.node(b)["plane"]
               for a, b in fabric.graph.edges() if a in switches and b in switches)


def stop_daemons(state: RunState) -> None:
    """End the OVS daemons a run recorded and that are still the same processes."""
    terminate({pid for name, (pid, start) in state.processes.items()
               if name.endswith((":ovs-vswitchd", ":ovsdb-server")) and process_start(pid) == start})

