"""Ownership of what a run creates: a lock against concurrent runs, and a state file listing every bridge,
interface, namespace and process made, written before each is made, so `mpft clean` removes exactly our
leftovers after a crash and nothing else.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emulator.model.errors import EnvironmentProblem
from emulator.net import marking, ovs, priority

log = logging.getLogger(__name__)

RUN_ROOT = Path(os.environ.get("MPFT_RUN_ROOT", "/run/mpft-emu"))
BPFFS_NOTE = RUN_ROOT / "bpffs-mounted"  # a run mounted /sys/fs/bpf for the ECN marker (emulator.net.marking)


def process_start(pid: int) -> int | None:
    """Start time of a process in clock ticks (field 22 of /proc/pid/stat): tells a pid from its reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def restore_group_nice(saved: list[int]) -> None:
    """Put back a daemon's session group nice (pid, start time, nice), unless the daemon is gone since."""
    pid, start, nice = saved
    if process_start(pid) == start:
        priority.set_group_nice(pid, nice)


def netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


@dataclass
class RunState:
    """Everything one run made; saved as JSON in its run directory."""

    run_id: str
    pid: int
    started: float
    pid_start: int = 0
    bridges: list[str] = field(default_factory=list)          # OVS bridges
    kernel_bridges: list[str] = field(default_factory=list)   # Linux bridges (NVLink domains)
    root_intfs: list[str] = field(default_factory=list)       # veth ends in the root namespace
    processes: dict[str, list[int]] = field(default_factory=dict)  # name -> [pid, start time]
    netns: list[int] = field(default_factory=list)             # inodes of our hosts' namespaces
    named_netns: list[str] = field(default_factory=list)       # the planes' and controller's namespaces
    link_group: int = 0  # every root-namespace interface we make is in this device group
    rcu_expedited_restore: str | None = None  # the kernel setting to put back if teardown was cut short
    ovs_sndbuf_restore: int | None = None  # ovs-vswitchd's transmit socket buffer before the run enlarged it
    # the machine's ovs-vswitchd (pid, start time) and its session group's nice before the run raised it
    ovs_group_nice_restore: list[int] | None = None
    ecn_pins: bool = False  # the eBPF ECN marker's maps are pinned (emulator.net.marking), BPFFS_NOTE if mounted

    @property
    def directory(self) -> Path:
        return RUN_ROOT / self.run_id

    def save(self) -> None:
        tmp = self.directory / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.directory / "state.json")

    def add_process(self, name: str, pid: int) -> None:
        self.processes[name] = [pid, process_start(pid) or 0]

    @classmethod
    def load(cls, path: Path) -> RunState:
        return cls(**json.loads(path.read_text()))


class RunLock:
    """One run at a time per machine: the switch and host names of two runs would collide."""

    def __init__(self) -> None:
        self._fd: int | None = None

    def acquire(self) -> None:
        RUN_ROOT.mkdir(parents=True, exist_ok=True)
        fd = os.open(RUN_ROOT / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise EnvironmentProblem(f"another mpft run is active (pid {holder}); wait for it to finish, "
                                     "or run 'mpft clean' if it was killed") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def new_run() -> RunState:
    state = RunState(run_id=time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3), pid=os.getpid(),
                     started=time.time(), pid_start=process_start(os.getpid()) or 0,
                     link_group=secrets.randbelow(1 << 30) + (1 << 20))
    state.directory.mkdir(parents=True)
    state.save()
    return state


def _alive(pid: int, start: int) -> bool:
    return process_start(pid) == start


def kill_recorded(state: RunState) -> int:
    """Kill recorded processes still alive (same pid and start time), then any process left inside one of
    our host namespaces (they keep the namespace, and its veths, alive). Returns how many were signalled."""
    victims = [pid for pid, start in state.processes.values() if _alive(pid, start)]
    if state.netns:
        ours = set(state.netns)
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid() and netns_inode(int(entry.name)) in ours:
                victims.append(int(entry.name))
    terminate(set(victims))
    return len(set(victims))


def _send(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def terminate(pids: set[int], timeout_s: float = 3.0) -> None:
    """TERM, with a CONT so that a stopped process (a plane frozen by fail_plane) handles it; KILL what is left
    after `timeout_s`."""
    _send(pids, signal.SIGTERM)
    _send(pids, signal.SIGCONT)
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.02)
        pids = {pid for pid in pids if Path(f"/proc/{pid}").exists()}
    _send(pids, signal.SIGKILL)


def delete_links(names: list[str], group: int = 0) -> None:
    """Delete our interfaces (and their veth peers).

    Deleting one by one costs an RCU grace period per device (about 18 ms each); deleting the run's device
    group is one batch. The group is used only when every device in it is one of ours.
    """
    if not names:
        return
    if group:
        listing = subprocess.run(["ip", "-j", "link", "show", "group", str(group)], capture_output=True,
                                 text=True, check=False)
        in_group = {d["ifname"] for d in json.loads(listing.stdout or "[]") if "ifname" in d}
        if in_group and in_group <= set(names):
            subprocess.run(["ip", "link", "delete", "group", str(group)], capture_output=True, check=False)
            names = [n for n in names if n not in in_group]
    existing = set(os.listdir("/sys/class/net"))
    names = [n for n in names if n in existing]
    if names:
        subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"link del {n}\n" for n in names),
                       capture_output=True, text=True, check=False)


NETNS_DIR = Path("/run/netns")


def delete_netns(names: list[str]) -> None:
    """Delete named namespaces of ours; the interfaces inside go with them."""
    existing = set(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else set()
    gone = [n for n in names if n in existing]
    if gone:
        subprocess.run(["ip", "-force", "-batch", "-"], input="".join(f"netns del {n}\n" for n in gone),
                       capture_output=True, text=True, check=False)


RCU_EXPEDITED = Path("/sys/kernel/rcu_expedited")


@contextmanager
def expedited_rcu(state: RunState) -> Iterator[None]:
    """Expedite kernel RCU grace periods while we remove our ports, then put the setting back.

    Removing a port costs a grace period (about 12 ms) each time ovs-vswitchd closes its AF_PACKET socket, and
    vswitchd closes them one after another: 384 ports took 4.6 s; expedited, 100 closes took 2 ms. The old value
    is recorded in the run's state first, so `mpft clean` restores it if teardown is cut short.
    """
    try:
        old = RCU_EXPEDITED.read_text().strip()
    except OSError:
        old = None
    if old != "0":  # absent, unreadable, or already expedited by someone else: leave it alone
        yield
        return
    state.rcu_expedited_restore = old
    state.save()
    try:
        RCU_EXPEDITED.write_text("1")
        yield
    finally:
        RCU_EXPEDITED.write_text(old)
        state.rcu_expedited_restore = None
        if state.directory.exists():
            state.save()


def remove_run(state: RunState) -> dict[str, int]:
    """Remove everything a run recorded; safe to repeat. Interfaces go before bridges: OVS removes a bridge
    whose ports are already gone much faster."""
    killed = kill_recorded(state)
    existing = set(os.listdir("/sys/class/net"))
    links = [n for n in state.root_intfs + state.kernel_bridges if n in existing]
    delete_links(links, state.link_group)
    delete_netns(state.named_netns)
    ours = ovs.bridges_of_run(state.run_id) if state.bridges else {}  # none when its switches ran privately
    bridges = [b for b in state.bridges if b in ours]
    ovs.vsctl(ovs.del_bridges_args(bridges))
    if state.rcu_expedited_restore is not None:
        RCU_EXPEDITED.write_text(state.rcu_expedited_restore)
    if state.ovs_sndbuf_restore is not None:
        ovs.set_send_buffer(state.ovs_sndbuf_restore)
    if state.ovs_group_nice_restore is not None:
        restore_group_nice(state.ovs_group_nice_restore)
    if state.ecn_pins:
        marking.remove_pins()
        marking.unmount_bpffs(BPFFS_NOTE)
    shutil.rmtree(state.directory, ignore_errors=True)
    return {"processes": killed, "bridges": len(bridges), "interfaces": len(links),
            "namespaces": len(state.named_netns)}


def describe_removed(run_id: str, counts: dict[str, int]) -> str:
    return f"removed {run_id}: " + ", ".join(f"{v} {k}" for k, v in counts.items())


def clean_dead_runs() -> list[tuple[str, dict[str, int]]]:
    """`mpft clean`: remove the leftovers of runs whose process is gone; live runs are not touched."""
    cleaned = []
    live = set()
    if RUN_ROOT.exists():
        for state_file in sorted(RUN_ROOT.glob("*/state.json")):
            try:
                state = RunState.load(state_file)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("skipping unreadable %s: %s", state_file, exc)
                continue
            if _alive(state.pid, state.pid_start):
                live.add(state.run_id)
                continue
            cleaned.append((state.run_id, remove_run(state)))
    # What a run left without a state file (it crashed before saving, or the file was removed): bridges tagged
    # with its id, processes started with files of its run directory, namespaces named after it.
    try:
        orphans = {name: run for name, run in ovs.bridges_of_run().items() if run not in live}
    except EnvironmentProblem:  # the machine's own OVS is not running: it holds no bridges of ours
        orphans = {}
    if orphans:
        ovs.vsctl(ovs.del_bridges_args(sorted(orphans)))
        cleaned.append(("untracked bridges", {"bridges": len(orphans)}))
    processes = untracked_processes(live)
    netns = untracked_netns(live)
    if processes or netns:
        _send(set(processes), signal.SIGKILL)
        delete_netns(netns)
        cleaned.append(("untracked processes and namespaces", {"processes": len(processes),
                                                                "namespaces": len(netns)}))
    if not live and (marking.remove_pins() or BPFFS_NOTE.exists()):  # the ECN marker's, by a run without state
        marking.unmount_bpffs(BPFFS_NOTE)
        cleaned.append(("untracked ECN marker maps", {"maps": len(marking.MAPS)}))
    return cleaned


def untracked_processes(live: set[str]) -> list[int]:
    """Pids of processes started with a file in the directory of a run that is not live: its private OVS
    daemons (--pidfile=...) and its controller (--fabric ...). A private OVS elsewhere, or the machine's own, does
    not match."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        for arg in argv:
            path = Path(arg.rpartition("=")[2])
            if path.is_relative_to(RUN_ROOT) and len(path.parts) > len(RUN_ROOT.parts) + 1 \
                    and path.parts[len(RUN_ROOT.parts)] not in live:
                found.append(int(entry.name))
                break
    return found


def untracked_netns(live: set[str]) -> list[str]:
    """Namespaces named as a run names its own (mpft-<token>-c, mpft-<token>-p<plane>) for a run not live."""
    tokens = {run.rsplit("-", 1)[-1] for run in live}
    names = os.listdir(NETNS_DIR) if NETNS_DIR.is_dir() else []
    return [n for n in names if (m := OUR_NETNS.fullmatch(n)) and m.group(1) not in tokens]


NETNS_PREFIX = "mpft-"
OUR_NETNS = re.compile(NETNS_PREFIX + r"([0-9a-f]{6})-(?:c|p\d+|s-[a-z][a-z0-9]{0,9})")
