"""Run a message schedule on a live emulation with transport agents for its hosts (RDMA: one process per CPU core
serving several hosts, by default; TCP: one per host), and turn what the agents measured into per-message
completion times and run-wide metrics. Over several servers, each server's part (emulator.run.part) runs the
agents of its hosts, and their results come back here in this machine's clock.

The run directory gets `schedule.jsonl` (the schedule, in the trace format: every run records what it sent),
`agent.json` (the agents' configuration), one `<host>.json` per agent, `messages.csv` and `traffic.json`.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from emulator.model import schedule, wire
from emulator.model.fabric import Fabric
from emulator.model.records import from_dict
from emulator.model.schedule import Message
from emulator.model.servers import ClockOffset
from emulator.model.stats import percentiles
from emulator.net import features
from emulator.net.cluster import RemotePart
from emulator.net.emulation import Emulation
from emulator.run.metrics import Ordering, Packets, Reordering, ServerReport, TagSummary, TransferMetrics
from traffic import hotpath
from traffic.contract import AgentConfig, Egress, HostInfo, HostResult, Port
from traffic.options import TransportOptions

READY_STALL_S = 60.0  # agents starting that long without one more becoming ready have failed
READY_LIMIT_S = 900.0  # the longest agents may take to start in all (the VM's emulated guest took over 60 s on
# the paper's fabric), and so the longest a ready agent waits for `go`
START_DELAY_S = 0.2


def check_options(options: TransportOptions, fabric: Fabric) -> None:
    """The options checked against the fabric and, for TCP, against this kernel's algorithms."""
    options.check(fabric, features.tcp_congestion_controls() if options.transport == "tcp" else ())


def host_table(fabric: Fabric, hosts: list[str]) -> dict[str, HostInfo]:
    """What an agent needs to know about each host: address, node, plane, egress link rates (`nic` is the sum
    over its fabric ports), and its address and rate on every plane it has a port on."""
    table = {}
    for h in hosts:
        node = fabric.node(h)
        ports = {str(node["ports"][port]["plane"]): Port(node["ports"][port]["ip"], fabric.link(h, leaf)["bps"])
                 for leaf, port in fabric.nic_links(h)}
        nv = fabric.nvlink_peer(h)
        egress = Egress(sum(p.bps for p in ports.values()), None if nv is None else fabric.link(h, nv)["bps"])
        table[h] = HostInfo(fabric.ip(h), egress, node.get("node"), node.get("plane"), ports)
    return table


def estimate_seconds(fabric: Fabric, messages: list[Message]) -> float:
    """A rough duration (the busiest NIC direction at line rate, plus the last start), for the default timeout."""
    table = host_table(fabric, schedule.hosts_of(messages))
    overhead = fabric.mtu / wire.payload_per_packet(fabric.mtu)
    load: Counter[tuple[str, str]] = Counter()
    for m in messages:
        load[m.src, "tx"] += m.bytes
        load[m.dst, "rx"] += m.bytes
    busiest = max((b * 8 * overhead / table[h].egress_bps.nic for (h, _), b in load.items()), default=0.0)
    return busiest + max((m.start_s for m in messages), default=0.0)


def agent_groups(hosts: list[str], processes: int) -> list[list[str]]:
    """The hosts split into `processes` contiguous groups (0: one per CPU core), one agent process each."""
    k = max(1, min(len(hosts), processes or os.cpu_count() or 1))
    return [hosts[i * len(hosts) // k:(i + 1) * len(hosts) // k] for i in range(k)]


@dataclass
class RunSettings:
    """What every machine's agents of one run share: the seed, the resolved transport options, the deadline."""

    seed: int
    transport: TransportOptions
    deadline_s: float


@dataclass
class AgentsStart:
    """What a server's part is asked to start (emulator.run.part): the agents of `hosts` (`peers`: every host of
    the schedule), with the run's settings and its schedule (the text of schedule.jsonl)."""

    hosts: list[str]
    peers: list[str]
    run: RunSettings
    schedule: str


@dataclass
class Stopped:
    """What the agents of one machine said when stopped: each host's result, each process that failed with its
    last words, and (another server's, from its part) that server's report."""

    failed: dict[str, str]
    results: dict[str, HostResult]
    server: ServerReport | None = None


class LocalLauncher:
    """Starts and stops the processes serving the agents of the hosts on one machine: their configuration and
    files in `outdir`, and the processes (traffic.serve, or traffic.tcpagent per host)."""

    def __init__(self, emu: Emulation, hosts: list[str], peers: list[str], outdir: Path, run: RunSettings,
                 server: str = "localhost") -> None:
        """`hosts`: those served here; `peers`: every host of the schedule (outdir/schedule.jsonl); `run`: the
        resolved transport options, seed and deadline, as transfer() sets them for every server."""
        self.emu, self.hosts, self.outdir, self.server = emu, hosts, outdir, server
        self.options = run.transport
        self.config = AgentConfig(
            dir=str(outdir), schedule=str(outdir / "schedule.jsonl"), hosts=host_table(emu.fabric, peers),
            transport=self.options, seed=run.seed, deadline_s=run.deadline_s, ready_timeout_s=READY_LIMIT_S,
            mtu=emu.fabric.mtu, queue_bytes=emu.fabric.queue_bytes, ecn=emu.fabric.ecn,
            netns={h: emu.netns(h) for h in hosts})
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for stale in ("go", *(f"{h}.{s}" for h in self.hosts for s in ("ready", "done", "json"))):
            (self.outdir / stale).unlink(missing_ok=True)
        if not self.hosts:
            return
        self.config.write(self.outdir / "agent.json")
        tcp = self.options.transport == "tcp"  # kernel TCP sockets: one process per host
        agent = "traffic.tcpagent" if tcp else "traffic.serve"
        in_fabric_order = [h for h in self.emu.fabric.hosts() if h in self.hosts]  # neighbours share a process
        groups = agent_groups(in_fabric_order, len(self.hosts) if tcp else self.options.agent_processes)
        env = {**os.environ, **(hotpath.environment(self.options.agent_code) if not tcp else {})}
        for g in groups:
            self.procs[",".join(g)] = self.emu.popen(
                g[0], [sys.executable, "-m", agent, "--config", str(self.outdir / "agent.json"), "--hosts",
                       ",".join(g)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)

    def status(self, what: str) -> tuple[list[str], bool]:
        """The hosts without a `<host>.<what>` file yet, and whether an agent process has ended."""
        return ([h for h in self.hosts if not (self.outdir / f"{h}.{what}").exists()],
                any(p.poll() is not None for p in self.procs.values()))

    def go(self, t0_ns: int) -> None:
        """The common start, by this machine's CLOCK_MONOTONIC."""
        (self.outdir / "go.tmp").write_text(str(t0_ns))
        (self.outdir / "go.tmp").rename(self.outdir / "go")  # atomically: an agent must never read it half-written

    def stop(self) -> Stopped:
        """Stop the agents: each host's result, and each process that failed, with its last words."""
        _stop(self.procs)
        failed = {}
        for group, proc in self.procs.items():
            said = proc.stderr.read().decode(errors="replace").strip().splitlines()[-1:]
            proc.stderr.close()
            if proc.returncode not in (0, -signal.SIGTERM):
                failed[group] = said[0] if said else "no output"
        return Stopped(failed, {  # an agent stopped early writes what it had, if it could
            h: HostResult.read(self.outdir / f"{h}.json") for h in self.hosts if (self.outdir / f"{h}.json").exists()})


class RemoteLauncher:
    """The agents of the hosts on another server, launched by its part (emulator.run.part) with a LocalLauncher in
    its own run directory; what they report comes back here, with their time stamps moved to this machine's clock."""

    def __init__(self, part: RemotePart, offset: ClockOffset, hosts: list[str], peers: list[str],
                 sender_offset: dict[str, int], outdir: Path, run: RunSettings) -> None:
        """As LocalLauncher; `sender_offset`: message id -> the clock offset of its sender's server (one-way delays
        are the receiver's clock less the sender's)."""
        self.part, self.offset, self.sender_offset, self.outdir = part, offset, sender_offset, outdir
        self.server = str(part.server)
        self.hosts, self.peers, self.run = hosts, peers, run

    def _ask(self, request: dict) -> dict:
        return json.loads(self.part.request({"agents": request}))

    def start(self) -> None:
        start = AgentsStart(self.hosts, self.peers, self.run, (self.outdir / "schedule.jsonl").read_text())
        self._ask({"start": asdict(start)})

    def status(self, what: str) -> tuple[list[str], bool]:
        reply = self._ask({"status": what})
        return reply["missing"], reply["ended"]

    def go(self, t0_ns: int) -> None:
        self._ask({"go": self.offset.to_remote(t0_ns)})

    def stop(self) -> Stopped:
        """What LocalLauncher.stop says there, and the server's report (emulator.run.server_monitors), all in this
        machine's clock."""
        out = from_dict(Stopped, self._ask({"stop": True}))
        out.results = {h: to_local_clock(r, self.offset.offset_ns, self.sender_offset) for h, r in out.results.items()}
        if out.server is not None:
            out.server.samples.started_ns = self.offset.to_local(out.server.samples.started_ns)
            if out.server.pauses:
                pauses = out.server.pauses
                pauses["log"] = [(self.offset.to_local(t), *rest) for t, *rest in pauses["log"]]
        for result in out.results.values():  # every host's result in the one run directory
            result.write(self.outdir)
        return out


def to_local_clock(result: HostResult, offset_ns: int, sender_offset: dict[str, int]) -> HostResult:
    """An agent's result from a server whose clock is ours plus `offset_ns`, in our clock: every time stamp less
    the offset; a one-way delay (the receiver's clock less the sender's) less the difference of the two offsets
    (`sender_offset`: message id -> its sender's server's offset)."""
    def moved(t: int | None) -> int | None:
        return t - offset_ns if t else t
    sent = {i: replace(s, posted_ns=moved(s.posted_ns), first_tx_ns=moved(s.first_tx_ns), acked_ns=moved(s.acked_ns))
            for i, s in result.sent.items()}
    received = {i: replace(d, delivered_ns=moved(d.delivered_ns), first_rx_ns=moved(d.first_rx_ns),
                           arrived_ns=moved(d.arrived_ns),
                           one_way_ns=d.one_way_ns + sender_offset.get(i, 0) - offset_ns)
                for i, d in result.received.items()}
    return replace(result, t0_ns=result.t0_ns - offset_ns, sent=sent, received=received)


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _launchers(emu: Emulation, hosts: list[str], messages: list[Message], outdir: Path,
               run: RunSettings) -> list[LocalLauncher | RemoteLauncher]:
    """This machine's agents, and one RemoteLauncher per other server that holds hosts of the schedule."""
    if emu.cluster is None:
        return [LocalLauncher(emu, hosts, hosts, outdir, run)]
    cluster = emu.cluster
    on = {h: cluster.server_of(h) for h in hosts}
    sender_offset = {str(m.id): cluster.clock(on[m.src]).offset_ns for m in messages}
    launchers: list[LocalLauncher | RemoteLauncher] = [
        LocalLauncher(emu, [h for h in hosts if on[h] == cluster.here], hosts, outdir, run,
                   server=str(cluster.servers[cluster.here]))]
    for i in sorted(set(on.values()) - {cluster.here}):
        launchers.append(RemoteLauncher(cluster.remote_parts[i], cluster.clock(i), [h for h in hosts if on[h] == i],
                                  hosts, sender_offset, outdir, run))
    return launchers


def transfer(emu: Emulation, messages: list[Message], outdir: Path, options: TransportOptions | None = None,
                 seed: int = 0, timeout_s: float | None = None, quiet: bool = False) -> TransferMetrics:
    """Run `messages` to completion (or the timeout) and return the metrics (also written to traffic.json). Over
    several servers, each runs the agents of its hosts, from one common start."""
    fabric = emu.fabric
    options = (options or TransportOptions()).for_fabric(fabric)
    check_options(options, fabric)
    schedule.check(messages, fabric.hosts())
    hosts = schedule.hosts_of(messages)
    if timeout_s is None:
        timeout_s = 10 * estimate_seconds(fabric, messages) + 20
    outdir.mkdir(parents=True, exist_ok=True)
    schedule.write(outdir / "schedule.jsonl", messages)
    launchers = _launchers(emu, hosts, messages, outdir, RunSettings(seed, options, timeout_s))
    late: list[str] = []
    stopped: list[Stopped] = []
    try:
        for launcher in launchers:
            launcher.start()
        slow, ended = _wait_for(launchers, len(hosts), "ready", READY_LIMIT_S, "agents starting", quiet,
                                stall_s=READY_STALL_S)
        if slow and not ended:
            raise RuntimeError(f"agents of {_hosts(slow)} not ready: {len(hosts) - len(slow)} of {len(hosts)} "
                               f"were, and none more in the last {READY_STALL_S:.0f} s")
        t0 = time.monotonic_ns() + int(START_DELAY_S * 1e9)
        for launcher in launchers:
            launcher.go(t0)
        late, _ = _wait_for(launchers, len(hosts), "done", timeout_s + START_DELAY_S, "agents finished", quiet)
    finally:
        for launcher in launchers:
            stopped.append(launcher.stop())
    failed = {group: said for out in stopped for group, said in out.failed.items()}
    if failed:
        host, said = next(iter(failed.items()))
        raise RuntimeError(f"agent for {host} failed: {said}")
    results = {h: r for out in stopped for h, r in out.results.items()}
    metrics = summarise(messages, results, t0, options)
    metrics.agents_timed_out = {h: f"not done after the {timeout_s:.0f} s deadline: stopped, with what it had"
                                for h in late}
    metrics.server_reports = {launcher.server: out.server for launcher, out in zip(launchers, stopped, strict=True)
                              if out.server is not None}
    write_messages_csv(outdir / "messages.csv", metrics.messages)
    (outdir / "traffic.json").write_text(json.dumps(metrics.to_dict(), indent=2))
    return metrics


def _wait_for(launchers: list, total: int, what: str, timeout_s: float, desc: str,
              quiet: bool, stall_s: float | None = None) -> tuple[list[str], bool]:
    """Until every host's agent has written host.<what>, one died, the deadline, or (`stall_s`) that long without
    one more: the hosts still missing, and whether an agent process ended."""
    patience = math.inf if stall_s is None else stall_s
    deadline = time.monotonic() + timeout_s
    stalled, done = time.monotonic() + patience, 0
    with tqdm(total=total, desc=desc, unit="host", disable=quiet, leave=False) as bar:
        while True:
            missing, ended = [], False
            for launcher in launchers:
                its_missing, its_ended = launcher.status(what)
                missing += its_missing
                ended |= its_ended
            now = time.monotonic()
            if total - len(missing) > done:
                bar.update(total - len(missing) - done)
                stalled, done = now + patience, total - len(missing)
            if not missing or now > min(deadline, stalled) or ended:
                return missing, ended
            time.sleep(0.05)


def _hosts(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def summarise(messages: list[Message], results: dict[str, HostResult], t0: int,
              options: TransportOptions) -> TransferMetrics:
    """Per-message times (posted at the sender, delivered at the receiver) and run-wide transport metrics.
    ordering: of the send (flag) messages, flag_wait_us is how long each waited at the receiver after its last
    packet arrived until it was delivered (psn, release), fence_wait_us how long from posting to its first
    transmission (queued behind earlier messages, and under fence behind their acknowledgements)."""
    rows, lost = [], 0
    flag_wait, fence_wait = [], []
    for m in messages:
        sender, receiver = results.get(m.src), results.get(m.dst)
        sent = sender.sent.get(str(m.id)) if sender else None
        got = receiver.received.get(str(m.id)) if receiver else None
        if m.op == "send":
            if got and got.arrived_ns is not None:
                flag_wait.append((got.delivered_ns - got.arrived_ns) / 1e3)
            if sent and sent.first_tx_ns:
                fence_wait.append((sent.first_tx_ns - sent.posted_ns) / 1e3)
        row = {"id": m.id, "src": m.src, "dst": m.dst, "bytes": m.bytes, "tag": m.tag, "qp": m.qp,
               "posted_s": (sent.posted_ns - t0) / 1e9 if sent else None,
               "delivered_s": (got.delivered_ns - t0) / 1e9 if got else None,
               "acked_s": (sent.acked_ns - t0) / 1e9 if sent and sent.acked_ns else None,
               "retransmits": sent.retransmits if sent else 0}
        row["completion_s"] = row["delivered_s"] - row["posted_s"] if got and sent else None
        lost += got is None
        rows.append(row)
    done = [r for r in rows if r["delivered_s"] is not None]
    completion = max((r["delivered_s"] for r in done), default=None)
    delivered_bytes = sum(r["bytes"] for r in done)
    agents = list(results.values())
    rx, tx = [a.rx for a in agents], [a.tx for a in agents]
    reorder: Counter[int] = Counter()
    for r in rx:
        reorder.update({int(dist): count for dist, count in r.reorder_distance.items()})
    distances = [d for d, c in reorder.items() for _ in range(c)]
    tags = sorted({m.tag for m in messages})
    received = sum(r.packets for r in rx)
    processes = {a.pid or h: a.traffic_cpu_s.total_s for h, a in results.items()}  # pid -> CPU s
    out_of_order = sum(r.out_of_order for r in rx)
    return TransferMetrics(
        transport=options, messages_total=len(messages), lost_messages=lost,
        duplicate_or_unexpected=sum(a.unexpected for a in agents), wrong_size=sum(a.wrong_size for a in agents),
        completion_s=completion, goodput_bps=delivered_bytes * 8 / completion if completion else 0.0,
        by_tag={tag: tag_summary([r for r in rows if r["tag"] == tag]) for tag in tags},
        message_completion_s=percentiles([r["completion_s"] for r in done]),
        packets=Packets(data=sum(t.data_packets for t in tx), retransmits=sum(t.retransmits for t in tx),
                        timeouts=sum(t.timeouts for t in tx), spurious=sum(t.spurious for t in tx),
                        send_errors=sum(t.send_errors for t in tx), received=received,
                        duplicates=sum(r.duplicates for r in rx), retransmitted=sum(r.retransmitted for r in rx),
                        timeout_lost=sum(t.timeout_lost for t in tx),
                        timeout_spurious=sum(t.timeout_spurious for t in tx),
                        # the RDMA agents count every datagram (the TCP agent does not: zero)
                        datagrams_sent=sum(a.datagrams.sent for a in agents),
                        datagrams_received=sum(a.datagrams.received for a in agents),
                        send_refused=sum(a.datagrams.refused for a in agents)),
        reordering=Reordering(out_of_order=out_of_order, fraction=out_of_order / max(1, received),
                              distance=percentiles(distances), histogram=dict(sorted(reorder.items())),
                              resequence_max=max((r.resequence_max for r in rx), default=0)),
        rtt_us=percentiles([x for a in agents for x in a.rtt_us]),
        ordering=Ordering(mode=options.ordering, violations=sum(a.ordering.violations for a in agents),
                          sends=sum(a.ordering.sends for a in agents),
                          flag_wait_us=percentiles(flag_wait), fence_wait_us=percentiles(fence_wait)),
        agents_cpu_s=sum(processes.values()),  # once per process, from the common start
        timer_lateness_us_p99=max((a.timer_lateness_us.get("p99", 0.0) for a in agents), default=0.0),
        agent_processes=len(processes),
        agent_scheduling=" and ".join(sorted({a.scheduling for a in agents})),
        agent_code=" and ".join(sorted({a.code for a in agents})),
        ecn={"ce_received": sum(a.ecn.ce_received for a in agents), "cnps_sent": sum(a.ecn.cnps_sent for a in agents),
             "cnps_received": sum(a.ecn.cnps_received for a in agents)},
        messages=rows)


def tag_summary(rows: list[dict]) -> TagSummary:
    done = [r for r in rows if r["delivered_s"] is not None]
    return TagSummary(messages=len(rows), lost=len(rows) - len(done),
                      completion_s=max((r["delivered_s"] for r in done), default=None),
                      message_p99_s=percentiles([r["completion_s"] for r in done
                                                 if r["completion_s"] is not None]).get("p99"))


def write_messages_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["id"])
        writer.writeheader()
        writer.writerows(rows)
