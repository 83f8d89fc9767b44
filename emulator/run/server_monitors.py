"""What a cluster run measures on each server besides its agents: the CPU, the tunnels to the
other servers, the switches' links and queues. A server's part (emulator.run.part) runs ServerMonitors from the
common start to the agents' end and sends the report back; the run's own machine has its job's monitors
(emulator.run.job), and merge_samples() puts the other servers' series into its time series."""

from __future__ import annotations

from emulator.analysis.fidelity import cpu_bound
from emulator.net import pause
from emulator.net.emulation import Emulation
from emulator.net.monitor import CpuMonitor, CpuReport, LinkSampler, counter_delta, grown
from emulator.run.metrics import ServerReport, ServerSamples, ServerSummary


def server_summary(cpu: CpuReport, tunnels_before: dict, tunnels_after: dict) -> ServerSummary:
    """One server's share of a cluster run's fidelity: its CPU monitor's word, and each tunnel's traffic."""
    sampled = cpu.samples > 0
    return ServerSummary(cpu_bound=cpu_bound(cpu), cpu_idle=cpu.min_idle if sampled else None,
                         cpu_free=cpu.min_free if sampled else None, detail=cpu.detail(),
                         tunnels={name: {k: v - tunnels_before.get(name, {}).get(k, 0) for k, v in counts.items()}
                                  for name, counts in tunnels_after.items()})


class ServerMonitors:
    """One server's CPU, tunnels, switch links (bytes sent, utilisation and backlog per sample), queue drops, ECN
    marks and pauses."""

    def __init__(self, emu: Emulation) -> None:
        self.emu = emu
        self.cpu = CpuMonitor(watch=emu.run_processes, switches=emu.switchd.vswitchd_pids)
        self.links = LinkSampler(emu.local_fabric, namespaces=emu.switch_namespaces(),
                                 paused=emu.pauses.paused_seconds, resync=emu.marker_resync)

    def start(self) -> None:
        self.before = (self.emu.tunnel_counters(), self.emu.link_counters(), self.emu.queue_drops())
        self.cpu.start()
        self.links.start()

    def stop(self) -> ServerReport:
        """This server's report (its pauses' log and its series' start in this server's clock)."""
        cpu = self.cpu.stop()
        self.links.stop()
        tunnels, sent, drops = self.before
        return ServerReport(
            summary=server_summary(cpu, tunnels, self.emu.tunnel_counters()),
            link_bytes=counter_delta(sent, self.emu.link_counters()), drops=grown(drops, self.emu.queue_drops()),
            ecn_marks=self.emu.ecn_marks(), pauses=self.emu.pauses.record(),
            samples=ServerSamples(started_ns=self.links.started_ns, rows=self.links.rows,
                                  backlogged=self.links.backlogged,
                                  planes={str(p): v for p, v in self.links.planes.items()}, cpu=cpu.series,
                                  depths=self.links.depths))


def merge_samples(sampler: LinkSampler, samples: ServerSamples) -> list[tuple[float, float, float, float, float]]:
    """Another server's series into this machine's, on this machine's time line (`samples.started_ns` already
    in our clock: emulator.run.launch.RemoteLauncher): link rows and plane rates as any of ours; its CPU series,
    shifted the same, returned (emulator.net.monitor.timeseries_rows takes it under the server's name)."""
    shift = (samples.started_ns - sampler.started_ns) / 1e9
    sampler.rows += [(t + shift, kind, name, value) for t, kind, name, value in samples.rows]
    sampler.depths += samples.depths
    for intf, utils in samples.backlogged.items():
        sampler.backlogged.setdefault(intf, []).extend(utils)
    for plane, series in samples.planes.items():
        sampler.planes.setdefault(int(plane), []).extend((t + shift, v) for t, v in series)
    return [(t + shift, idle, free, thread, process) for t, idle, free, thread, process in samples.cpu]


def merge_pauses(records: list[dict]) -> tuple[dict, list[tuple[int, str, str, int]]]:
    """Every server's pauses (Pauses.record, logs in our clock) as one run's: its summary ({} on a lossy
    fabric) and its log, in time order."""
    records = [r for r in records if r]
    if not records:
        return {}, []
    return (pause.summarise(records),
            sorted(tuple(entry) for r in records for entry in r["log"]))
