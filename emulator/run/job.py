"""One traffic job end to end: bring a fabric up, run a schedule with the transport agents, measure fidelity,
tear down, and print what a researcher reads first."""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path

from emulator.analysis import feedback
from emulator.analysis.fidelity import cpu_bound, unfaithful, verdict
from emulator.analysis.timeseries import write_timeseries
from emulator.model import wire
from emulator.model.capture import CaptureOptions
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.model.servers import Server
from emulator.net import ledger
from emulator.net.cluster_run import emulation
from emulator.net.emulation import Emulation
from emulator.net.monitor import (
    Background,
    CpuMonitor,
    LinkSampler,
    busiest_links,
    grown,
    packet_time_s,
    timeseries_rows,
)
from emulator.run.launch import check_options, transfer
from emulator.run.metrics import Fidelity, JobMetrics, ServerSummary
from emulator.run.server_monitors import merge_pauses, merge_samples, server_summary
from traffic.cc import PLUGINS
from traffic.options import TransportOptions


def run_job(fabric: Fabric, messages: list[Message], outdir: Path, *, app: str = "ecmp",
            options: TransportOptions | None = None, seed: int = 0, timeout_s: float | None = None,
            quiet: bool = False, app_env: dict[str, str] | None = None,
            timeline: list[tuple[float, Callable[[Emulation], None]]] = (),
            switch_daemons: str | None = None, capture: CaptureOptions | None = None,
            controller: str | None = None, servers: list[Server] | None = None,
            ssh_config: Path | None = None, predicted: dict | None = None) -> JobMetrics:
    """Run `messages` on a fresh emulation of `fabric`; metrics go to outdir/traffic.json and are returned, time
    series to outdir/timeseries.csv (the deepest queues and each plane's forwarded rate per sample go into the
    metrics too). `timeline` actions (e.g. faults) run at their time after traffic starts; `switch_daemons` as
    Emulation takes it, and `controller` (an external one, tcp:HOST:PORT, instead of `app`); `capture`: pcaps of
    those interfaces in outdir/pcap/ (emulator.net.capture); `servers` and `ssh_config` spread the planes over
    several servers (emulator.net.cluster): every server's links, queues and captures join the run's, and
    the verdict says each server's CPU and what the tunnels between them carried; `predicted`: the CPU
    --link-mbps auto predicted (emulator.run.autorate.as_record), set beside what the run used."""
    options = options or TransportOptions()
    check_options(options, fabric)
    outdir.mkdir(parents=True, exist_ok=True)
    with emulation(fabric, app=app, seed=seed, quiet=quiet, app_env=app_env or {},
                   switch_daemons=switch_daemons, controller=controller, servers=servers,
                   ssh_config=ssh_config) as emu:
        exporter = emu.exporter  # polls tc already: one poll serves both
        monitor = CpuMonitor(watch=emu.run_processes, switches=emu.switchd.vswitchd_pids)
        sockets = emu.switch_sockets()
        sampler = LinkSampler(emu.local_fabric, backlogs=(lambda: exporter.latest) if exporter else None,
                              namespaces=emu.switch_namespaces(), paused=emu.pauses.paused_seconds,
                              waiting=lambda: emu.switch_input_waiting(sockets), resync=emu.marker_resync)

        def on_go() -> None:  # sample the traffic, not the agents' start-up
            monitor.start()
            sampler.start()
        tapped = emu.start_capture(capture, outdir / "pcap") if capture else None
        actions = Timeline(emu, outdir / "go", timeline, on_go).start()
        before, t, drops_before = emu.link_counters(), time.monotonic(), emu.queue_drops()
        tunnels_before = emu.tunnel_counters()
        counted = options.transport == "rdma" and not emu.cluster  # every packet accounted for (ledger)
        counters_before = emu.drop_counters() if counted else {}
        try:
            measured = transfer(emu, messages, outdir, options, seed=seed, timeout_s=timeout_s, quiet=quiet)
        finally:
            actions.stop()
            cpu = monitor.stop()
            sampler.stop()
            captured = tapped.stop() if tapped else {}
            if emu.controller:  # what the app said (its placements, its errors), beside the run's results
                shutil.copyfile(emu.controller.log_file, outdir / "controller.log")
        accounting = None
        if counted:
            emu.wait_drained()
            counters_after = {**emu.drop_counters(), "refused": {"agents": measured.packets.send_refused}}
            accounting = ledger.account(counters_before, counters_after, measured.packets.datagrams_sent,
                                        measured.packets.datagrams_received)
        window = measured.completion_s or (time.monotonic() - t)
        after = emu.link_counters()
        drops = grown(drops_before, emu.queue_drops())
        marks = emu.ecn_marks()
        pauses, pause_log = emu.pauses.summary(), emu.pauses.log()
        servers_cpu = {}
        if emu.cluster:  # the other servers' monitors, beside this machine's own
            records = [emu.pauses.record()]
            for name, report in measured.server_reports.items():
                servers_cpu[name] = merge_samples(sampler, report.samples)
                after.update(report.link_bytes)  # their ports' bytes sent: counted from zero here
                drops.update(report.drops)
                marks.update(report.ecn_marks)
                records.append(report.pauses)
            pauses, pause_log = merge_pauses(records)
            here = str(emu.cluster.servers[emu.cluster.here])
            measured.servers = {here: server_summary(cpu, tunnels_before, emu.tunnel_counters()),
                                **{name: r.summary for name, r in measured.server_reports.items()}}
            for name, moved in emu.cluster.clock_drifts().items():
                if name in measured.servers:  # a server whose hosts had no traffic timed nothing
                    measured.servers[name].clock_drift = asdict(moved) | {"ppm": moved.ppm}
        links = busiest_links(emu.fabric, before, after, window)
        if pauses:
            write_pause_log(outdir / "pauses.csv", pause_log, outdir / "go")
    if marks:  # the marker's own count (the eBPF marker's or RED's), beside what the receivers saw
        measured.ecn.update(marked=sum(p["marked"] for p in marks.values()))
        peaks = [p["peak_bytes"] for p in marks.values() if "peak_bytes" in p]  # the eBPF marker's alone
        if peaks:
            measured.ecn.update(marker_peak_bytes=max(peaks))
    if sampler.marker_off:  # how far the eBPF marker's queues were off the real ones before each resync
        off = sorted(abs(b) for b in sampler.marker_off)
        measured.ecn.update(marker_off_bytes_median=statistics.median(off), marker_off_bytes_max=off[-1])
    write_timeseries(outdir / "timeseries.csv", timeseries_rows(sampler, cpu, servers_cpu))
    backlogged = sampler.rate_ratio()
    per_server = measured.servers
    sparse = feedback.sparsest(fabric, messages) if _sender_driven(options) else None
    bound_in = ([f"{outdir.name} on {name}" for name, s in per_server.items() if s.cpu_bound] if per_server else
                [outdir.name] if cpu_bound(cpu) else [])
    worst = sampler.worst_link()
    delay = sampler.hidden_delay()
    hidden = (delay, packet_time_s(fabric)) if delay is not None else None
    why = (unfaithful(worst, accounting.unattributed, accounting.sent, accounting.unmodelled, hidden) if accounting
           else unfaithful(worst, None, 0, hidden=hidden)) + late_pauses(fabric, drops, pauses)
    fidelity = Fidelity(
        cpu_bound=bool(bound_in),
        cpu_idle=min([cpu.min_idle] + [s.cpu_idle for s in per_server.values() if s.cpu_idle is not None]),
        cpu_free=min([cpu.min_free] + [s.cpu_free for s in per_server.values() if s.cpu_free is not None]),
        cpu_other=cpu.max_other,
        rate_ratio=backlogged,
        verdict=verdict(bound_in, cpu.min_idle if cpu.samples else None, detail=cpu.detail(), rate_ratio=backlogged,
                        timer_lateness_us_p99=measured.timer_lateness_us_p99,
                        unfaithful_in=[f"{outdir.name} ({'; '.join(why)})"] if why else [])
        + (f"; packets: {accounting.summary()}" if accounting else "") + servers_verdict(per_server)
        + pause_verdict(fabric, pauses) + (sparse.warning() if sparse else ""),
        feedback_per_drain=sparse.per_drain if sparse else None,
        rate_ratio_busiest=max((u.ratio for u in links), default=0.0),
        busiest_links=[{"intf": u.intf, "ratio": u.ratio, "kind": u.kind} for u in links],
        timer_lateness_us_p99=measured.timer_lateness_us_p99, agents_cpu_s=measured.agents_cpu_s,
        switches_cpu_s=cpu.switches_cpu_s, switch_daemons=emu.switchd.mode, unfaithful=bool(why),
        unfaithful_why=why, link_ratio_worst=worst[1] if worst else None,
        link_ratio_worst_intf=worst[0] if worst else "",
        unattributed_share=accounting.unattributed_share() if accounting else None,
        hidden_delay_s=delay)
    metrics = JobMetrics(**{f.name: getattr(measured, f.name) for f in fields(measured)},
                         topo=fabric.topo, params=fabric.params, app=f"external {controller}" if controller else app,
                         seed=seed, events=actions.done,
                         queues=sampler.queues(), plane_mbps=sampler.plane_mbps(), fidelity=fidelity,
                         queue_drops=sum(drops.values()), queue_drops_by_port=drops,
                         pauses={**pauses, "queue_sized": fabric.queue_sized} if fabric.queue_sized else pauses,
                         captures=captured, accounting=asdict(accounting) if accounting else {},
                         up_s=emu.timings["up_s"], down_s=emu.timings["down_s"],
                         cpu_prediction=predicted_beside_used(predicted, fidelity, measured.completion_s))
    (outdir / "traffic.json").write_text(json.dumps(metrics.to_dict(), indent=2))
    return metrics


def predicted_beside_used(predicted: dict | None, f: Fidelity, seconds: float | None) -> dict:
    """The cores --link-mbps auto predicted beside those the agents and switch daemons used over the run."""
    if not predicted or not seconds:
        return {}
    used = {"agents": f.agents_cpu_s / seconds, "switches": f.switches_cpu_s / seconds}
    cores = predicted["agents"] + predicted["switches"]
    return {**predicted, "used": used, "used_cores": sum(used.values()),
            "error": cores / sum(used.values()) - 1 if sum(used.values()) else None}


def _sender_driven(options: TransportOptions) -> bool:
    """Whether the run's congestion control reacts to what each sender sees of the queue (the verdict then
    says when that is too little: emulator.analysis.feedback)."""
    cc = options.concrete_cc().cc
    return options.transport == "rdma" and cc != "none" and not PLUGINS[cc].receiver_driven


def servers_verdict(servers: dict[str, ServerSummary]) -> str:
    """A cluster run's servers in its verdict: each one's idle minimum, and what the tunnels between them carried
    (counted at each end's transmit side, so each packet once)."""
    if not servers:
        return ""
    idle = ", ".join(f"{name} {'CPU-BOUND, ' if s.cpu_bound else ''}idle min "
                     + ("-" if s.cpu_idle is None else f"{s.cpu_idle:.0%}") for name, s in servers.items())
    tunnels = [t for s in servers.values() for t in s.tunnels.values()]
    drifts = "".join(f"; {name}'s clock moved {d['moved_ns'] / 1e3:+.0f} us (+/- {d['uncertain_ns'] / 1e3:.0f}) "
                     f"against ours over {d['over_s']:.0f} s ({d['ppm']:+.0f} ppm): its times are off by up to that"
                     for name, s in servers.items() if (d := s.clock_drift))
    return (f"; per server: {idle}; tunnels between servers carried {sum(t['tx_packets'] for t in tunnels)} "
            f"packets ({sum(t['tx_bytes'] for t in tunnels) / 1e6:.1f} MB)" + drifts)


def pause_verdict(fabric: Fabric, pauses: dict) -> str:
    """A lossless run's pauses in its verdict: how late they came in packet times at the slowest link's rate (by
    the pause thread's clock, from the program's report to the gates changed; benchmarks/pause.py times them
    from the frames on the wire) and the thread's CPU, which the machine's idle share above already includes."""
    if not pauses:
        return ""
    packet_us = (fabric.mtu + wire.ETH) * 8 / min(fabric.egress_rates(fabric.switches()).values()) * 1e6
    reaction = pauses["reaction_us"]
    return (f"; pauses took effect in p99 {reaction['p99'] / packet_us:.2f} packet times (slowest "
            f"{reaction['max']:.0f} us, where the headroom allows {fabric.pfc_reaction_ns / 1e3:.0f}) by the "
            f"pause thread's clock, which used {pauses['cpu_s']:.1f} CPU s")


def late_pauses(fabric: Fabric, drops: dict[str, int], pauses: dict) -> list[str]:
    """Why a lossless run is UNFAITHFUL when a queue dropped: a lossless fabric's queues do not, so its pauses
    came later than the headroom allows (the emulator's lateness: an emulated guest's CPU stalls for tens of ms),
    and the drops are not the fabric's."""
    lost = sum(drops.values())
    if not fabric.lossless or not lost:
        return []
    port, most = max(drops.items(), key=lambda kv: kv[1])
    slowest = pauses.get("reaction_us", {}).get("max", 0.0)
    allowed = fabric.pfc_reaction_ns / 1e3
    return [f"{lost} packets dropped in the queues of a lossless fabric (most at {port}: {most}): its pauses took "
            f"up to {slowest:.0f} us to hold their feeders, where the headroom allows {allowed:.0f} us"]


def write_pause_log(path: Path, log: list[tuple[int, str, str, int]], go: Path) -> None:
    """A lossless run's XOFF, XON, pause and resume events, one row each, timed from the traffic's start."""
    t0 = int(go.read_text()) if go.exists() else (log[0][0] if log else 0)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["t_s", "event", "port", "backlog_bytes"])
        writer.writerows([f"{(t - t0) / 1e9:.6f}", event, port, backlog] for t, event, port, backlog in log)


class Timeline(Background):
    """Calls `on_go` when the agents' common start is set (the runner's `go` file), then runs actions at given
    seconds after that start. Actions at 0 s run in start(), before any traffic: a link degraded from the start
    is degraded for all of it, as the lower bound assumes (emulator.study.runner.bound_fabric)."""

    def __init__(self, emu: Emulation, go: Path, actions: list[tuple[float, Callable[[Emulation], None]]],
                 on_go: Callable[[], None]) -> None:
        super().__init__()
        self.emu, self.go, self.on_go = emu, go, on_go
        self.actions = sorted(actions, key=lambda a: a[0])
        self.done: list[dict] = []

    def start(self):
        while self.actions and self.actions[0][0] <= 0:
            self._run(self.actions.pop(0), None)
        return super().start()

    def _run(self, item: tuple[float, Callable[[Emulation], None]], t0: float | None) -> None:
        at_s, action = item
        action(self.emu)
        self.done.append({"at_s": at_s, "ran_at_s": 0.0 if t0 is None else time.monotonic() - t0,
                          "action": getattr(action, "__name__", str(action))})

    def _loop(self) -> None:
        while not self.go.exists():
            if self._stop.wait(0.01):
                return
        t0 = int(self.go.read_text()) / 1e9
        self.on_go()
        for item in self.actions:
            if self._stop.wait(max(0.0, t0 + item[0] - time.monotonic())):
                return
            self._run(item, t0)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def format_report(m: JobMetrics) -> str:
    t, p, r, o, f = m.transport, m.packets, m.reordering, m.ordering, m.fidelity
    lines = [f"{m.messages_total} messages on {m.topo} {m.params}, app {m.app}, cc {t.cc}, "
             f"window {t.window}, entropy {t.entropy}, seed {m.seed}",
             f"completion {_ms(m.completion_s)}, goodput {m.goodput_bps / 1e6:.2f} Mbit/s, "
             f"lost messages {m.lost_messages}",
             "message completion: " + ", ".join(f"{k} {_ms(m.message_completion_s.get(k))}"
                                                for k in ("p50", "p90", "p99", "max")),
             f"packets: {p.data} data, {p.retransmits} retransmitted ({p.timeouts} timeouts, after which "
             f"{p.timeout_lost} resent were lost and {p.timeout_spurious} had arrived; {p.spurious} spurious in all), "
             f"{p.send_errors} send errors, {m.queue_drops} dropped in the queues",
             f"reordering: {r.out_of_order} packets out of order ({r.fraction:.1%}), distance p99 "
             f"{r.distance.get('p99', 0)}, resequence buffer max {r.resequence_max} packets",
             f"RTT: p50 {m.rtt_us.get('p50', 0) / 1e3:.1f} ms, p99 {m.rtt_us.get('p99', 0) / 1e3:.1f} ms"]
    if m.pauses:
        pz = m.pauses
        lines.append(f"lossless: {pz['events']} pauses of {len(pz['ports'])} egresses, {pz['paused_s']:.3f} s "
                     f"paused in all; reaction p50 {pz['reaction_us']['p50']:.0f} us, p99 "
                     f"{pz['reaction_us']['p99']:.0f} us")
        if "queue_sized" in pz:
            q = pz["queue_sized"]
            lines.append(f"lossless: queues of {q['queue_kb']} KiB, sized for {q['port']}'s {q['feeders']} feeders: "
                         f"{q['headroom_kb']:.0f} KiB of headroom and {q['frames']} frames below XOFF (--queue-kb "
                         "sets them)")
    for host, why in m.agents_timed_out.items():
        lines.append(f"agent of {host}: {why}")
    if m.captures:
        packets = sum(c["packets"] for c in m.captures.values())
        dropped = sum(c["dropped"] for c in m.captures.values())
        lines.append(f"capture: {packets} frames on {len(m.captures)} interfaces in pcap/ ({dropped} the kernel "
                     "dropped before tcpdump read them)")
    if o.sends:
        lines.append(f"ordering {o.mode}: {o.violations} of {o.sends} flags visible before earlier data; "
                     f"flag held p99 {o.flag_wait_us.get('p99', 0) / 1e3:.1f} ms, posted-to-sent p99 "
                     f"{o.fence_wait_us.get('p99', 0) / 1e3:.1f} ms")
    for tag, v in m.by_tag.items():
        if tag:
            lines.append(f"  {tag}: {v.messages} messages, done at {_ms(v.completion_s)}")
    lines += [f"fidelity: {f.verdict}; busiest link at {f.rate_ratio_busiest:.0%} of its rate over the run; "
              f"agents ({m.agent_code}) used {f.agents_cpu_s:.1f} CPU s in {m.agent_processes} processes "
              f"({m.agent_scheduling}), "
              f"switch daemons ({f.switch_daemons}) {f.switches_cpu_s:.1f} CPU s",
              f"bring-up {m.up_s:.1f} s, teardown {m.down_s:.1f} s"]
    c = m.cpu_prediction
    if c and c["error"] is not None:
        lines.append(f"--link-mbps auto ({c['mbps']:g} Mbit/s) predicted {c['agents'] + c['switches']:.2f} cores "
                     f"(agents {c['agents']:.2f}, switch daemons {c['switches']:.2f}); the run used "
                     f"{c['used_cores']:.2f} (agents {c['used']['agents']:.2f}, switch daemons "
                     f"{c['used']['switches']:.2f}): {c['error']:+.0%}")
    return "\n".join(lines)
