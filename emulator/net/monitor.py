"""What a run's fidelity is judged on, measured: the CPU share of the machine, of every switch daemon's forwarding
thread and of the traffic processes; the link counters and queue backlogs of the switch side, read in every
namespace that holds switch ports. emulator.analysis.fidelity judges what this measures.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.model import naming
from emulator.model.fabric import Fabric
from emulator.model.stats import percentiles
from emulator.net import ovs
from emulator.net.pause import interface_of
from emulator.net.priority import YIELD_NICE, rank
from emulator.net.qdiscs import QdiscReader
from traffic.netns import entered

CLK_TCK = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000
REALTIME_POLICIES = {os.SCHED_FIFO, os.SCHED_RR}
MIN_BACKLOGGED = 3  # intervals a link must have been backlogged in for its median to be judged
OTHER_WORK = 0.05  # a share of the machine other work took, from which the verdict says so
SAMPLE_PACKETS = 20  # a link sample spans at least this many packet times (one packet is +-5 % of it)
DEPTH_READ_SHARE = 0.02  # the queue depths are read between link samples as often as this share of a core allows


def _machine_times() -> tuple[int, int]:
    """(idle, total) jiffies from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])


@dataclass(frozen=True)
class _Process:
    ticks: int  # utime+stime of all its threads
    nice: int
    realtime: bool


def _processes() -> dict[int, _Process]:
    """Every user-space process (kernel threads left out: their work is the packets', everybody's)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()  # from field 3; policy is field 41
        if not int(rest[6]) & PF_KTHREAD:
            out[int(entry.name)] = _Process(int(rest[11]) + int(rest[12]), int(rest[16]),
                                            int(rest[38]) in REALTIME_POLICIES)
    return out


def yielded_ticks(before: dict[int, _Process], after: dict[int, _Process], run: set[int]) -> int:
    """CPU ticks taken between two readings by other work that yields to the `run`'s processes (not this one's, the
    run's samplers): normal scheduling, YIELD_NICE or more below every one of them that is not realtime
    (emulator.net.priority). The run's processes could have had most of that CPU."""
    floor = max((rank(pid, after[pid].nice) for pid in run if pid in after and not after[pid].realtime),
                default=None)
    me = os.getpid()  # the run's own samplers
    took = 0
    for pid, p in after.items():
        ticks = p.ticks - before[pid].ticks if pid in before else 0
        if ticks > 0 and not p.realtime and pid not in run and pid != me and (floor is None or
                                                                rank(pid, p.nice) >= floor + YIELD_NICE):
            took += ticks
    return took


def idle_share(seconds: float) -> float:
    """The machine's idle share over the next `seconds` (all cores; /proc/stat)."""
    idle0, total0 = _machine_times()
    time.sleep(seconds)
    idle1, total1 = _machine_times()
    return (idle1 - idle0) / max(1, total1 - total0)


def _thread_ticks(pid: int) -> dict[str, int]:
    """utime+stime per thread of a process, keyed by 'tid:name' (empty once the process is gone)."""
    ticks = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return ticks
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        rest = stat.rsplit(")", 1)[1].split()
        ticks[f"{task.name}:{name}"] = int(rest[11]) + int(rest[12])
    return ticks


@dataclass(frozen=True)
class Ticks:
    """Thread ticks (utime+stime) keyed by thread, and when they were read (time.monotonic())."""

    at: float
    ticks: dict

    def since(self, before: Ticks) -> dict:
        """Each thread's ticks since `before` (a thread not there yet: none)."""
        return {key: t - before.ticks.get(key, t) for key, t in self.ticks.items()}


def _busiest(before: Ticks, after: Ticks) -> tuple[Any, float]:
    """The thread (key of the readings) that used most of a core between two readings, and its share of the time
    between them (each reading's own instant), one core at most: more is what no thread can use, yet the sample that
    covered the agents' start on the 64-GPU fabric read one thread at 1.44 and 1.48 cores (here, a Firecracker guest
    with tick-based accounting; why, not known)."""
    busiest, share = None, 0.0
    seconds = max(after.at - before.at, 1 / CLK_TCK)
    for key, ticks in after.since(before).items():
        s = min(1.0, ticks / CLK_TCK / seconds)
        if s > share:
            busiest, share = key, s
    return busiest, share


ROOT_NAMESPACE: tuple[str | None, ...] = (None,)
_NETDEV_FIELD = {("rx", "bytes"): 0, ("rx", "packets"): 1, ("rx", "drops"): 3, ("tx", "bytes"): 8,
                 ("tx", "packets"): 9, ("tx", "drops"): 11}


def netdev_column(proc_net_dev: str, direction: str, what: str) -> dict[str, int]:
    """One counter of every interface in the text of /proc/net/dev."""
    column = _NETDEV_FIELD[direction, what]
    out = {}
    for line in proc_net_dev.splitlines()[2:]:
        name, _, numbers = line.partition(":")
        out[name.strip()] = int(numbers.split()[column])
    return out


def netdev_counters(direction: str = "tx", what: str = "bytes",
                    namespaces: Sequence[str | None] = ROOT_NAMESPACE) -> dict[str, int]:
    """One counter of every interface in the namespaces (paths such as /run/netns/NAME; None is the root), from
    /proc/thread-self/net/dev, which shows the namespace of the thread reading it."""
    out = {}
    for ns in namespaces:
        with entered(ns):
            text = Path("/proc/thread-self/net/dev").read_text()
        out.update(netdev_column(text, direction, what))
    return out


def packet_counters(intfs: list[str], direction: str = "tx",
                    namespaces: Sequence[str | None] = ROOT_NAMESPACE) -> dict[str, int]:
    """Packet counters of switch-side interfaces."""
    found = netdev_counters(direction, "packets", namespaces)
    return {i: found[i] for i in intfs}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def grown(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that went up between two readings, by how much (one first seen in `after` from 0)."""
    return {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)}


def link_counters(direction: str = "tx", namespaces: Sequence[str | None] = ROOT_NAMESPACE) -> dict[str, int]:
    """tx (or rx) bytes of every interface in the namespaces (the switch side of every link)."""
    return netdev_counters(direction, "bytes", namespaces)


@dataclass
class LinkUse:
    intf: str
    rate_bps: float
    configured_bps: float
    kind: str = ""  # the link's kind in the model: host (a NIC's), fabric (switch to switch) or nvlink

    @property
    def ratio(self) -> float:
        return self.rate_bps / self.configured_bps


def busiest_links(f: Fabric, before: dict[str, int], after: dict[str, int], seconds: float,
                  top: int = 5) -> list[LinkUse]:
    """The links that came closest to their configured rate (at the end: a degraded link's lowered one) over
    `seconds` (from two link_counters())."""
    egress = {naming.intf_name(n, d["ports"][n]): (f.rate(n, peer), d["kind"])
              for n in f.switches() + f.nvlink_domains() for peer, d in f.graph[n].items()}
    uses = [LinkUse(i, (after.get(i, 0) - before.get(i, 0)) * 8 / seconds, bps, kind)
            for i, (bps, kind) in egress.items()]
    return sorted(uses, key=lambda u: u.ratio, reverse=True)[:top]


SEND_ERROR = "error sending Ethernet packet"


class VswitchdLog:
    """Counts ovs-vswitchd's send-error warnings logged since start() by the daemons `pids` names: each
    transmits on its userspace ports through one AF_PACKET socket, and packets waiting in our egress queues are
    charged to that socket's send buffer, so backlogged queues can make it drop packets on any port (EAGAIN).
    OVS rate-limits the warning, so the count is a lower bound; any count at all means drops happened outside
    the modelled queues."""

    def __init__(self, pids: list[int]) -> None:
        self.offsets = {path: 0 for path in map(self._log_path, pids) if path is not None}

    @staticmethod
    def _log_path(pid: int) -> Path | None:
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return None
        for arg in args:
            if arg.startswith(b"--log-file="):
                return Path(arg.split(b"=", 1)[1].decode())
        return None

    def start(self) -> VswitchdLog:
        for path in self.offsets:
            self.offsets[path] = path.stat().st_size if path.exists() else 0
        return self

    def send_errors(self) -> int:
        errors = 0
        for path, offset in self.offsets.items():
            if path.exists():
                with open(path, "rb") as log:
                    log.seek(offset)
                    errors += log.read().decode(errors="replace").count(SEND_ERROR)
        return errors


def system_vswitchd() -> dict[str, int]:
    pid = ovs.read_pid()
    return {"ovs-vswitchd": pid} if pid else {}


@dataclass
class CpuReport:
    samples: int = 0
    min_idle: float = 1.0
    mean_idle: float = 1.0
    min_free: float = 1.0       # idle plus what other work took that yields to the run (what the run could have had)
    max_other: float = 0.0      # the most such work took of the machine in a sample
    max_thread: float = 0.0     # busiest thread of any ovs-vswitchd forwarding the run, share of one core
    busiest_thread: str = ""    # which daemon and thread
    max_process: float = 0.0    # busiest thread of the run's own processes (agents, controller), share of one core
    busiest_process: str = ""
    # t, idle, free, max thread, max process
    series: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    vswitchd_send_errors: int = 0
    switches_cpu_s: float = 0.0  # CPU seconds of every switch daemon, all threads, over the samples

    def detail(self) -> str:
        """The monitor's own numbers, for the verdict."""
        text = f"machine idle min {self.min_idle:.0%}, mean {self.mean_idle:.0%}"
        if self.max_other >= OTHER_WORK:
            text += (f", free for the run min {self.min_free:.0%} (other work at a lower priority took up to "
                     f"{self.max_other:.0%})")
        text += f"; busiest ovs-vswitchd thread {self.max_thread:.0%} of a core"
        if self.busiest_process:
            text += f"; busiest run process {self.busiest_process} {self.max_process:.0%} of a core"
        if self.vswitchd_send_errors:
            text += (f"; OVS DROPPED PACKETS OUTSIDE THE MODELLED QUEUES ({self.vswitchd_send_errors}+ send errors: "
                     "backlogged egress queues exhausted its shared send buffer)")
        return text


class Background:
    """`_loop` in a daemon thread between start() and stop(); it waits on `_stop`, and stop() is safe before
    start() (a bring-up that failed early never started it)."""

    def __init__(self) -> None:
        self.started_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)

    def start(self):
        self.started_ns = time.monotonic_ns()  # where its series' times start, within the thread's start-up
        self._thread.start()
        return self

    def stop(self) -> bool:
        """Stop the loop; whether it had been started."""
        self._stop.set()
        if self._thread.ident is None:
            return False
        self._thread.join()
        return True

    def __enter__(self):
        return self.start()

    def __exit__(self, *_exc) -> None:
        self.stop()

    def _loop(self) -> None:
        raise NotImplementedError


class CpuMonitor(Background):
    """Samples once a second in a background thread between start() and stop(): the machine's idle share, the
    busiest thread of the switch daemons `switches` names, and the busiest thread of the processes `watch`
    names (both label -> pid; `watch` is asked at every sample, so processes started later are seen)."""

    def __init__(self, interval: float = 1.0, watch: Callable[[], dict[str, int]] | None = None,
                 switches: Callable[[], dict[str, int]] = system_vswitchd) -> None:
        super().__init__()
        self.interval = interval
        self.watch = watch or dict
        self.switches = switches
        self.report = CpuReport()

    def start(self) -> CpuMonitor:
        self._daemons = self.switches()
        self._log = VswitchdLog(list(self._daemons.values())).start()
        return super().start()

    def stop(self) -> CpuReport:
        """The report (empty if never started)."""
        if super().stop():
            self.report.vswitchd_send_errors = self._log.send_errors()
        return self.report

    @staticmethod
    def _ticks(processes: dict[str, int]) -> Ticks:
        """Thread ticks of processes, keyed by (label, 'tid:name')."""
        ticks = {(label, key): t for label, pid in processes.items() for key, t in _thread_ticks(pid).items()}
        return Ticks(time.monotonic(), ticks)

    def _loop(self) -> None:
        t0 = time.monotonic()
        idle0, total0 = _machine_times()
        threads0 = self._ticks(self._daemons)
        watched = self.watch()
        procs0 = self._ticks(watched)
        every0 = _processes()
        idles, frees = [], []
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            idle1, total1 = _machine_times()
            threads1 = self._ticks(self._daemons)
            watched = self.watch()
            procs1 = self._ticks(watched)
            every1 = _processes()
            jiffies = max(1, total1 - total0)
            idle = (idle1 - idle0) / jiffies
            other = yielded_ticks(every0, every1, {*self._daemons.values(), *watched.values()}) / jiffies
            # shares of the time that really passed: a sample late behind busier threads is longer than asked
            busiest, share = _busiest(threads0, threads1)
            self.report.switches_cpu_s += sum(threads1.since(threads0).values()) / CLK_TCK
            process, process_share = _busiest(procs0, procs1)
            r = self.report
            r.samples += 1
            idles.append(idle)
            frees.append(min(1.0, idle + other))
            r.min_idle, r.mean_idle, r.min_free = min(idles), sum(idles) / len(idles), min(frees)
            r.max_other = max(r.max_other, other)
            if share > r.max_thread:
                r.max_thread, r.busiest_thread = share, " ".join(busiest)
            if process_share > r.max_process:
                r.max_process, r.busiest_process = process_share, process[0]
            r.series.append((now - t0, idle, frees[-1], share, process_share))
            idle0, total0, threads0, procs0, every0 = idle1, total1, threads1, procs1, every1


def queue_summary(backlogs: list[float]) -> dict[str, float]:
    """The deepest egress queue seen, the p50 and p99 over all backlogged samples (bytes) and how many there were:
    from LinkSampler.depths, read many times per link sample (a quick run has only a handful of link samples, whose
    p99 is their max)."""
    backlogged = [b for b in backlogs if b > 0]
    p = percentiles(backlogged)
    return {"max_bytes": max(backlogs, default=0.0), "p50_bytes": p.get("p50", 0.0), "p99_bytes": p.get("p99", 0.0),
            "samples": len(backlogged)}


def packet_time_s(fabric: Fabric) -> float:
    """A full frame's time at the slowest switch egress (0 without switches)."""
    rates = fabric.egress_rates(fabric.switches()).values()
    return (fabric.mtu + 14) * 8 / min(rates) if rates else 0.0


def sample_interval(fabric: Fabric) -> float:
    """0.2 s, or SAMPLE_PACKETS packet times at the slowest switch egress where that is longer: at 1 Mbit/s a
    0.2 s sample holds under 3 jumbo frames, and one frame more or less is a third of it."""
    return max(0.2, SAMPLE_PACKETS * packet_time_s(fabric))


class LinkSampler(Background):
    """Per-interval utilisation and egress backlog of every switch-side link (in `namespaces`), for time series
    and for the fidelity question "did links that had a queue send at their configured rate?". `backlogs` reads
    the queues: a running Emulation's exporter already polls them, so the sampler reads its latest snapshot;
    without it the sampler reads them itself. On a lossless fabric `paused` gives each egress's paused time so
    far (s): the share of each interval it was paused goes into the series, and a paused link (or one with a class
    paused) is not asked to send at its rate. `resync` (Marker.resync) brings the eBPF marker's queues to the real
    ones at each depth read: how far off they were goes into the series. Not on a lossless fabric, which has no
    depth reads: a resync at each link sample held the interpreter while the pause thread waited (a pause took
    4.2 ms where the headroom allows 2, and two packets were dropped)."""

    def __init__(self, fabric: Fabric, interval: float | None = None,
                 backlogs: Callable[[], dict[str, int]] | None = None,
                 namespaces: Sequence[str | None] = ROOT_NAMESPACE,
                 paused: Callable[[], dict[str, float]] | None = None,
                 waiting: Callable[[], dict[str, int]] | None = None,
                 resync: Callable[[dict[str, int], int], dict[str, int]] | None = None) -> None:
        super().__init__()
        self.paused = paused or dict
        self.resync = resync
        self._busy: set[str] = set()  # ports that held bytes at the last resync
        self.marker_off: list[int] = []  # per resync where the marker or a queue held bytes: the worst port's
        # bytes off (the marker's less the real queue)
        self.waiting = waiting  # bytes waiting in the switch daemons' port input (Emulation.switch_input_waiting)
        self.namespaces = namespaces
        # (interface, node, peer) of every switch-side port; rates are read per sample, as degrade_link and
        # restore change them mid-run
        self.fabric = fabric
        self.ports = [(naming.intf_name(n, d["ports"][n]), n, peer)
                      for n in fabric.switches() + fabric.nvlink_domains() for peer, d in fabric.graph[n].items()]
        self.plane_of = {intf: fabric.node(intf.partition("-eth")[0])["plane"]
                         for intf in fabric.egress_rates(fabric.switches())}
        # A link is backlogged over an interval whose start and end found its queue this deep: a quarter of the
        # queue, at least two full frames. Two frames alone counted receiver-paced queues (pull keeps a few
        # packets per downlink) that drain and refill between two samples: on the 64-GPU 8-plane all-to-all at 4 to
        # 8 Mbit/s, six runs of ten were called UNFAITHFUL for a link "at 86-88 %" whose queue held 2 to 4 frames;
        # with the quarter none was, and the worst link sent at 93-99 %.
        self.floor = max(2 * (fabric.mtu + 14), fabric.queue_bytes // 4)
        self.interval, self.backlogs = interval or sample_interval(fabric), backlogs
        self.rows: list[tuple[float, str, str, float]] = []  # (t, kind, interface, value)
        self.backlogged: dict[str, list[float]] = {}  # per link: utilisation in intervals it was backlogged
        self.planes: dict[int, list[tuple[float, float]]] = {}  # plane -> (t, Mbit/s over its switch ports)
        self.hidden: list[tuple[int, float, float]] = []  # per sample: bytes in the daemons' input, bytes the switch
        # ports sent over the interval, its seconds
        self.depths: list[int] = []  # every backlogged queue's bytes at each read between the link samples
        # a packet time at least; longer where a read costs more than its share. None on a lossless fabric: its
        # pause thread shares this process, and a read holds the interpreter while it parses (a pause waits)
        self.depth_interval = self.min_depth_interval = math.inf if fabric.lossless else packet_time_s(fabric)
        self.read_s: deque[float] = deque(maxlen=20)  # what the last reads took (one read preempted is not its cost)

    def _loop(self) -> None:
        reader = QdiscReader(self.namespaces)
        try:
            self._sample(self.backlogs or reader.backlogs, reader)
        finally:
            reader.close()

    def _read_depths(self, reader: QdiscReader) -> None:
        started = time.monotonic()
        queue = reader.backlogs()
        self._resync(queue)
        self.depths += [b for intf, _, _ in self.ports if (b := queue.get(intf, 0)) > 0]
        self.read_s.append(time.monotonic() - started)
        self.depth_interval = max(self.min_depth_interval, statistics.median(self.read_s) / DEPTH_READ_SHARE)

    def _resync(self, queue: dict[str, int]) -> None:
        """The ports holding bytes now or at the last read (the marker's queue may lag one that emptied): an idle
        port's marker drains by itself, and each port costs three system calls."""
        if self.resync is None:
            return
        busy = {intf for intf, b in queue.items() if b > 0}
        off = self.resync({intf: queue.get(intf, 0) for intf in busy | self._busy}, self.fabric.mtu + 14)
        self._busy = busy
        if off:
            self.marker_off.append(max(off.values(), key=abs))

    def _wait(self, until: float, reader: QdiscReader) -> bool:
        """Read the queue depths until `until` (the link sample reads them then); whether stop() was called."""
        while (left := until - time.monotonic()) > 0:
            if self._stop.wait(min(left, self.depth_interval)):
                return True
            if time.monotonic() < until:
                self._read_depths(reader)
        return self._stop.is_set()

    def _sample(self, backlogs: Callable[[], dict[str, int]], reader: QdiscReader) -> None:
        t0 = last_t = time.monotonic()
        last_bytes, last_queue = link_counters(namespaces=self.namespaces), backlogs()
        last_paused, resynced = self.paused(), 0
        while not self._wait(last_t + self.interval, reader):
            now, sent, queue = time.monotonic(), link_counters(namespaces=self.namespaces), backlogs()
            paused = self.paused()
            if len(self.marker_off) > resynced:  # the worst since the last sample
                self.rows.append((now - t0, "marker_off_bytes", "ecn marker", max(self.marker_off[resynced:], key=abs)))
                resynced = len(self.marker_off)
            held_intfs = set()  # paused in this interval, in all or in one class (intf/tcN)
            for name, seconds in paused.items():
                self.rows.append((now - t0, "paused", name, (seconds - last_paused.get(name, 0.0)) / (now - last_t)))
                if seconds > last_paused.get(name, 0.0):
                    held_intfs.add(interface_of(name))
            mbps: dict[int, float] = {}
            for intf, node, peer in self.ports:
                bps = self.fabric.rate(node, peer)
                util = (sent.get(intf, 0) - last_bytes.get(intf, 0)) * 8 / (now - last_t) / bps
                self.rows.append((now - t0, "link_util", intf, util))
                self.rows.append((now - t0, "queue_bytes", intf, queue.get(intf, 0)))
                if last_queue.get(intf, 0) >= self.floor and queue.get(intf, 0) >= self.floor and \
                        intf not in held_intfs:
                    self.backlogged.setdefault(intf, []).append(util)
                if intf in self.plane_of:
                    mbps[self.plane_of[intf]] = mbps.get(self.plane_of[intf], 0.0) + util * bps / 1e6
            for plane, value in mbps.items():
                self.planes.setdefault(plane, []).append((now - t0, value))
            if self.waiting is not None:
                held = sum(self.waiting().values())
                self.rows.append((now - t0, "input_bytes", "switch daemons", held))
                self.hidden.append((held, sum(mbps.values()) * 1e6 / 8 * (now - last_t), now - last_t))
            last_t, last_bytes, last_queue, last_paused = now, sent, queue, paused

    def rate_ratio(self) -> float | None:
        """Median utilisation of links over the intervals they stayed backlogged (None: no link was)."""
        every = [u for utils in self.backlogged.values() for u in utils]
        return statistics.median(every) if every else None

    def hidden_delay(self) -> float | None:
        """How long the switch daemons held what they forwarded, on average (s): the median of the bytes waiting in
        their input over the samples, over the bytes per second their ports sent (Little's law; the kernel charges
        a socket a packet's buffer, somewhat more than its length, so this errs long). None where sampled fewer than
        MIN_BACKLOGGED times (a short run's one sample is its start, where each flow's first packets wait for the
        daemon's slow path) or nothing was sent."""
        sent = sum(b for _, b, _ in self.hidden)
        if not sent or len(self.hidden) < MIN_BACKLOGGED:
            return None
        return statistics.median(h for h, _, _ in self.hidden) / (sent / sum(t for _, _, t in self.hidden))

    def worst_link(self) -> tuple[str, float] | None:
        """The link whose median utilisation over the intervals it stayed backlogged was lowest, among those
        backlogged in at least MIN_BACKLOGGED intervals (one median over every link hides a few bad ones)."""
        medians = {intf: statistics.median(u) for intf, u in self.backlogged.items() if len(u) >= MIN_BACKLOGGED}
        return min(medians.items(), key=lambda kv: kv[1]) if medians else None

    def queues(self) -> dict[str, float]:
        return queue_summary(self.depths + [v for _, kind, _, v in self.rows if kind == "queue_bytes"])

    def plane_mbps(self) -> dict[int, list[tuple[float, float]]]:
        """Every plane's forwarded rate per sample (Mbit/s summed over its switch ports)."""
        return dict(sorted(self.planes.items()))


def timeseries_rows(links: LinkSampler, cpu: CpuReport,
                    servers: dict[str, list[tuple[float, float, float, float, float]]] | None = None,
                    ) -> list[tuple[float, str, str, float]]:
    """What the monitors sampled, as timeseries.csv's rows (emulator.analysis.timeseries): the links' (link_util,
    queue_bytes, paused: the share of the interval an egress was paused, lossless fabrics only; input_bytes: the
    switch daemons' input; marker_off_bytes: the eBPF marker's worst port off the real queue before a resync),
    then each machine's CPU: cpu_idle, cpu_free (idle plus what lower-priority other work took: CpuReport.min_free),
    vswitchd_thread, process_thread; a cluster run's other `servers` (name -> CPU series) under their names."""
    rows = sorted(links.rows, key=lambda row: row[0])
    for machine, series in {"machine": cpu.series, **(servers or {})}.items():
        busiest = "busiest" if machine == "machine" else machine
        for t, idle, free, thread, process in series:
            rows += [(t, "cpu_idle", machine, idle), (t, "cpu_free", machine, free),
                     (t, "vswitchd_thread", busiest, thread), (t, "process_thread", busiest, process)]
    return rows


class QueueExporter(Background):
    """Writes every switch port's egress backlog (bytes in its leaf qdisc) to a JSON file every interval.

    Queue occupancy is tc state, which OpenFlow cannot see; congestion-aware controller apps read this file
    (its path is handed to them as MPFT_QUEUES): {"p0l0": {"5": 18084, ...}, ...}. `latest` holds the last
    poll of every interface, for other readers in this process. `elsewhere` adds switches this machine does not
    hold (another server's, emulator.net.cluster), in the same form.
    """

    def __init__(self, path: Path | None, switches: set[str], namespaces: Sequence[str | None] = ROOT_NAMESPACE,
                 interval: float = 0.1, elsewhere: Callable[[], dict[str, dict[str, int]]] = dict) -> None:
        super().__init__()
        self.path, self.switches, self.interval = path, switches, interval
        self.namespaces, self.elsewhere = namespaces, elsewhere
        self.reader: QdiscReader | None = None
        self.latest: dict[str, int] = {}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """This machine's switches' backlogs, by switch and port."""
        if self.reader is None:
            self.reader = QdiscReader(self.namespaces)
        self.latest = self.reader.backlogs()
        out: dict[str, dict[str, int]] = {}
        for intf, backlog in self.latest.items():
            node, _, port = intf.partition("-eth")
            if node in self.switches:
                out.setdefault(node, {})[port] = backlog
        return out

    def _loop(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        while not self._stop.wait(self.interval):
            tmp.write_text(json.dumps({**self.elsewhere(), **self.snapshot()}))
            tmp.replace(self.path)

    def stop(self) -> bool:
        stopped = super().stop()
        if self.reader is not None:
            self.reader.close()
        return stopped
