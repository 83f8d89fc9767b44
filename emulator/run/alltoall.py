"""`mpft alltoall`: bring up a fabric, run a TCP all-to-all among its GPU hosts, compare per-pair and
aggregate goodput with the best the fabric allows, report fidelity, tear down.
"""

from __future__ import annotations

import csv
import json
import shlex
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from emulator.analysis import bounds
from emulator.analysis.fidelity import cpu_bound, cpu_verdict
from emulator.model.fabric import Fabric
from emulator.net.emulation import Emulation
from emulator.net.monitor import Background, CpuMonitor, CpuReport, LinkUse, busiest_links
from emulator.run.iperf import FlowResult

MESH_PORT = 5201
CONNECT_S = 5.0  # time every host has to connect to every peer before the common start


def pair_class(fabric: Fabric, src: str, dst: str) -> str:
    """intra-node (NVLink), same-plane (one fabric plane) or cross-plane (PXN through the source node)."""
    a, b = fabric.node(src), fabric.node(dst)
    if a.get("node") is not None and a.get("node") == b.get("node"):
        return "intra-node"
    return "same-plane" if a["plane"] == b["plane"] else "cross-plane"


class TimeBar(Background):
    """A progress bar that advances with wall time while a blocking call runs."""

    def __init__(self, seconds: float, desc: str, disable: bool) -> None:
        super().__init__()
        self.bar = tqdm(total=round(seconds), desc=desc, unit="s", disable=disable, leave=False)

    def _loop(self) -> None:
        while not self._stop.wait(1.0) and self.bar.n < self.bar.total:
            self.bar.update(1)

    def stop(self) -> bool:
        started = super().stop()
        self.bar.close()
        return started


@dataclass
class Report:
    fabric: Fabric
    app: str
    seconds: float
    flows: list[FlowResult]
    best_bps: dict[tuple[str, str], float]
    cpu: CpuReport
    links: list[LinkUse]
    up_s: float
    down_s: float


def mesh_flows(emu: Emulation, hosts: list[str], pairs: list[tuple[str, str]], seconds: float,
             congestion: str | None = None) -> list[FlowResult]:
    """Every (src, dst) of `pairs` at once, over TCP (traffic.tcpmesh, one process per host)."""
    fabric = emu.fabric
    peers: dict[str, list[str]] = {h: [] for h in hosts}
    for src, dst in pairs:  # the pairs are symmetric, so a host's peers are also its senders
        peers[src].append(dst)

    start_at = time.time() + CONNECT_S
    outdir = emu.directory / f"mesh-{start_at:.0f}"
    outdir.mkdir()
    for h in hosts:
        argv = [sys.executable, "-m", "traffic.tcpmesh", "--port", str(MESH_PORT),
                "--peers", ",".join(fabric.ip(p) for p in peers[h]), "--start-at", f"{start_at:.3f}",
                "--seconds", f"{seconds:g}", "--out", str(outdir / f"{h}.json"),
                *(["--cc", congestion] if congestion else [])]
        emu.host(h).sendCmd(shlex.join(argv))
    for h in hosts:
        emu.host(h).waitOutput()
    results = {h: json.loads((outdir / f"{h}.json").read_text()) for h in hosts if (outdir / f"{h}.json").exists()}
    flows = []
    for dst in hosts:
        for src in peers[dst]:
            got = results[dst]["received"].get(fabric.ip(src), 0) if dst in results else 0
            if dst not in results:
                error = f"{dst} wrote no result"
            elif src in results and fabric.ip(dst) in results[src]["unreachable"]:
                error = "could not connect"
            else:
                error = ""
            flows.append(FlowResult(src, dst, seconds, 0, got, got * 8 / seconds, congestion=congestion or "",
                                    error=error))
    return flows


def measure(fabric: Fabric, outdir: Path, app: str = "ecmp", seconds: float = 8.0, seed: int = 0,
        congestion: str | None = None, intra_node: bool = False, quiet: bool = False) -> Report:
    """The all-to-all among the GPU hosts: across nodes only by default (pairs inside a node use NVLink), so
    the scale-out network is what is measured."""
    hosts = fabric.gpu_hosts()
    pairs = [(a, b) for a in hosts for b in hosts
             if a != b and (intra_node or pair_class(fabric, a, b) != "intra-node")]
    factor = bounds.tcp_goodput_factor(fabric.mtu)
    best = {pair: rate * factor for pair, rate in bounds.max_min_rates(fabric, pairs).items()}
    with Emulation(fabric, app=app, seed=seed, quiet=quiet) as emu:
        monitor = CpuMonitor(switches=emu.switchd.vswitchd_pids).start()
        before = emu.link_counters()
        with TimeBar(CONNECT_S + seconds + 1, f"all-to-all, {len(pairs)} flows", quiet):
            flows = mesh_flows(emu, hosts, pairs, seconds, congestion)
        links = busiest_links(emu.fabric, before, emu.link_counters(), seconds)  # senders send only in the window
        cpu = monitor.stop()
    report = Report(fabric, app, seconds, flows, best, cpu, links, emu.timings["up_s"], emu.timings["down_s"])
    save(report, outdir)
    return report


def save(report: Report, outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    with open(outdir / "pairs.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["src", "dst", "class", "goodput_bps", "best_bps", "retransmits", "error"])
        for r in report.flows:
            writer.writerow([r.src, r.dst, pair_class(report.fabric, r.src, r.dst), f"{r.goodput_bps:.0f}",
                             f"{report.best_bps[r.src, r.dst]:.0f}", r.retransmits, r.error])
    summary = {"topo": report.fabric.topo, "params": report.fabric.params, "app": report.app,
               "seconds": report.seconds, "aggregate_goodput_bps": sum(r.goodput_bps for r in report.flows),
               "aggregate_best_bps": sum(report.best_bps.values()),
               "failed_flows": sum(1 for r in report.flows if r.error),
               "cpu": {k: v for k, v in asdict(report.cpu).items() if k != "series"},
               "cpu_bound": cpu_bound(report.cpu),
               "busiest_links": [{"intf": u.intf, "rate_bps": u.rate_bps, "ratio": u.ratio} for u in report.links],
               "up_s": report.up_s, "down_s": report.down_s}
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2))


def _mbps(bps: float) -> str:
    return f"{bps / 1e6:8.2f}"


def format_report(report: Report) -> str:
    f = report.fabric
    lines = [f"All-to-all on {f.topo} {f.params}: {len(report.flows)} TCP flows for {report.seconds:g} s, "
             f"routing app {report.app}", "",
             f"{'host':<8} {'sent':>8} {'received':>8} {'best rx':>8}  (Mbit/s goodput)"]
    hosts = sorted({r.src for r in report.flows}, key=lambda h: (f.node(h).get("node") or 0, h))
    for h in hosts:
        sent = sum(r.goodput_bps for r in report.flows if r.src == h)
        recv = sum(r.goodput_bps for r in report.flows if r.dst == h)
        best = sum(b for (s, d), b in report.best_bps.items() if d == h)
        lines.append(f"{h:<8} {_mbps(sent)} {_mbps(recv)} {_mbps(best)}")
    lines += ["", f"{'pair class':<12} {'pairs':>5} {'min':>8} {'median':>8} {'max':>8} {'best':>8}  (Mbit/s)"]
    for cls in ("intra-node", "same-plane", "cross-plane"):
        rows = [r for r in report.flows if pair_class(f, r.src, r.dst) == cls]
        if rows:
            rates = [r.goodput_bps for r in rows]
            best = statistics.median(report.best_bps[r.src, r.dst] for r in rows)
            lines.append(f"{cls:<12} {len(rows):>5} {_mbps(min(rates))} {_mbps(statistics.median(rates))} "
                         f"{_mbps(max(rates))} {_mbps(best)}")
    total = sum(r.goodput_bps for r in report.flows)
    best_total = sum(report.best_bps.values())
    failed = [r for r in report.flows if r.error]
    lines += ["", f"aggregate goodput {total / 1e6:.1f} Mbit/s of {best_total / 1e6:.1f} Mbit/s best "
                  f"({total / best_total:.0%}); {len(failed)} flows failed",
              "busiest links: " + ", ".join(f"{u.intf} {u.ratio:.0%}" for u in report.links)
              + " of configured rate",
              f"fidelity: {cpu_verdict('this run', report.cpu, links_sampled=False)}",
              f"bring-up {report.up_s:.1f} s, teardown {report.down_s:.1f} s"]
    if failed:
        lines.append(f"first failure: {failed[0].src}->{failed[0].dst}: {failed[0].error}")
    return "\n".join(lines)
