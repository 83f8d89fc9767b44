"""Run a message schedule on a live emulation with transport agents for its hosts (RDMA: one process per CPU core
serving several hosts, by default; TCP: one per host), and turn what the agents measured into per-message
completion times and run-wide metrics.

The run directory gets `schedule.jsonl` (the schedule, in the trace format: every run records what it sent),
`agent.json` (the agents' configuration), one `<host>.json` per agent, `messages.csv` and `traffic.json`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from emulator.model import schedule, wire
from emulator.model.fabric import TIERS, Fabric
from emulator.model.schedule import Message
from emulator.model.stats import percentiles
from emulator.net import features
from emulator.net.emulation import Emulation
from emulator.run.metrics import Ordering, Packets, Reordering, TagSummary, TransferMetrics
from traffic import hotpath
from traffic.options import TransportOptions

READY_TIMEOUT_S = 60.0
START_DELAY_S = 0.2
BASE_RTT_S = 0.002  # a round trip through idle queues here (agents and userspace switches): 1.6-2.1 ms measured


def check_options(options: TransportOptions, fabric: Fabric) -> None:
    """The options checked against the fabric and, for TCP, against this kernel's algorithms."""
    options.check(fabric, features.tcp_congestion_controls() if options.transport == "tcp" else ())


def _slowest_nic_bps(fabric: Fabric) -> float:
    return min(sum(fabric.link(h, leaf)["bps"] for leaf, _ in fabric.nic_links(h)) for h in fabric.hosts())


def _base_rtt_s(fabric: Fabric) -> float:
    """BASE_RTT_S plus each link's delay both ways on the longest path."""
    path_links = 2 * max((TIERS.get(fabric.node(s)["role"], 1) for s in fabric.switches()), default=1)
    return BASE_RTT_S + 2 * path_links * fabric.delay_ms / 1e3


def model_min_rto_ms(fabric: Fabric) -> float:
    """The least RTO when the user left it to the fabric: a base round trip plus two full switch queues drained at
    the slowest NIC. In an all-to-all every receiver's downlink queue fills at once, and a packet can wait behind
    one full queue and then part of another (measured: RTTs to 181 ms at 10 Mbit/s and 128 KB queues, where one
    queue drains in 105 ms); a floor under that fires for packets that are only queued."""
    return 1e3 * (_base_rtt_s(fabric) + 2 * fabric.queue_bytes * 8 / _slowest_nic_bps(fabric))


def model_window(fabric: Fabric, cc: str) -> int:
    """The window (packets in flight per queue pair) when the user left it to the fabric. With cc none: the
    bandwidth-delay product of the slowest NIC (a round trip of BASE_RTT_S plus each link's delay both ways on the
    longest path), at least one packet: what keeps a lone queue pair at line rate without filling queues for
    nothing (at 10 Mbit/s a round trip here is shorter than one 9000-byte packet). With a window-based control
    (rtt, pull) the window is only its ceiling: what one switch queue holds. DCQCN (ecn) sets a rate, as RoCE NICs
    have no window, and takes the bandwidth-delay product as none does: with a switch queue per queue pair, a
    15 -> 1 incast sends 15 queues' worth before the first CNP is back."""
    packet_bytes = fabric.mtu + wire.ETH
    queue_packets = max(1, min(63, fabric.queue_bytes // packet_bytes))
    if cc in ("rtt", "pull"):
        return queue_packets
    bdp_bits = _slowest_nic_bps(fabric) * _base_rtt_s(fabric)
    return max(1, min(queue_packets, math.ceil(bdp_bits / (packet_bytes * 8))))


def resolved(options: TransportOptions, fabric: Fabric) -> TransportOptions:
    """The options with what was left to the fabric filled in: the window and the least RTO (0); rtt's initial
    window (the bandwidth-delay product: its window is then only the ceiling) and base RTT; pull's grant limit (one
    switch queue) and unscheduled packets (the bandwidth-delay product); cc auto, what it stands for."""
    options = options.concrete_cc()
    if options.transport != "rdma":
        return options
    if options.window == 0:
        options = dataclasses.replace(options, window=model_window(fabric, options.cc))
    if options.min_rto_ms == 0:
        options = dataclasses.replace(options, min_rto_ms=round(model_min_rto_ms(fabric), 3))
    fabric_params: dict = {}
    if options.cc == "rtt":
        fabric_params = {"initial_window": model_window(fabric, "none"), "base_rtt_ms": 1e3 * _base_rtt_s(fabric)}
    elif options.cc == "pull":
        fabric_params = {"grant_limit": model_window(fabric, "pull"), "unscheduled": model_window(fabric, "none")}
    return dataclasses.replace(options, cc_params={**fabric_params, **options.cc_params})


def host_table(fabric: Fabric, hosts: list[str]) -> dict[str, dict]:
    """What an agent needs to know about each host: address, node, plane, egress link rates (`nic` is the sum
    over its fabric ports), and its address and rate on every plane it has a port on."""
    table = {}
    for h in hosts:
        node = fabric.node(h)
        ports = {str(node["ports"][port]["plane"]): {"ip": node["ports"][port]["ip"],
                                                       "bps": fabric.link(h, leaf)["bps"]}
                 for leaf, port in fabric.nic_links(h)}
        egress = {"nic": sum(p["bps"] for p in ports.values())}
        nv = fabric.nvlink_peer(h)
        if nv is not None:
            egress["nvlink"] = fabric.link(h, nv)["bps"]
        table[h] = {"ip": fabric.ip(h), "node": node.get("node"), "plane": node.get("plane"), "egress_bps": egress,
                    "ports": ports}
    return table


def estimate_seconds(fabric: Fabric, messages: list[Message]) -> float:
    """A rough duration (the busiest NIC direction at line rate, plus the last start), for the default timeout."""
    table = host_table(fabric, schedule.hosts_of(messages))
    overhead = fabric.mtu / wire.payload_per_packet(fabric.mtu)
    load: Counter[tuple[str, str]] = Counter()
    for m in messages:
        load[m.src, "tx"] += m.bytes
        load[m.dst, "rx"] += m.bytes
    busiest = max((b * 8 * overhead / table[h]["egress_bps"]["nic"] for (h, _), b in load.items()), default=0.0)
    return busiest + max((m.start_s for m in messages), default=0.0)


def agent_groups(hosts: list[str], processes: int) -> list[list[str]]:
    """The hosts split into `processes` contiguous groups (0: one per CPU core), one agent process each."""
    k = max(1, min(len(hosts), processes or os.cpu_count() or 1))
    return [hosts[i * len(hosts) // k:(i + 1) * len(hosts) // k] for i in range(k)]


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


def transfer(emu: Emulation, messages: list[Message], outdir: Path, options: TransportOptions | None = None,
                 seed: int = 0, timeout_s: float | None = None, quiet: bool = False) -> TransferMetrics:
    """Run `messages` to completion (or the timeout) and return the metrics (also written to traffic.json)."""
    fabric = emu.fabric
    options = resolved(options or TransportOptions(), fabric)
    check_options(options, fabric)
    schedule.check(messages, fabric.hosts())
    hosts = schedule.hosts_of(messages)
    if timeout_s is None:
        timeout_s = 10 * estimate_seconds(fabric, messages) + 20
    outdir.mkdir(parents=True, exist_ok=True)
    for stale in ("go", *(f"{h}.{s}" for h in hosts for s in ("ready", "done", "json"))):
        (outdir / stale).unlink(missing_ok=True)
    schedule.write(outdir / "schedule.jsonl", messages)
    config = {"dir": str(outdir), "schedule": str(outdir / "schedule.jsonl"), "hosts": host_table(fabric, hosts),
              "netns": {h: emu.netns(h) for h in hosts}, "mtu": fabric.mtu, "queue_bytes": fabric.queue_bytes,
              "seed": seed, "transport": options.to_dict(), "deadline_s": timeout_s, "ready_timeout_s": READY_TIMEOUT_S}
    (outdir / "agent.json").write_text(json.dumps(config, indent=1))
    tcp = options.transport == "tcp"  # kernel TCP sockets: one process per host
    agent = "traffic.tcpagent" if tcp else "traffic.agent"
    in_fabric_order = [h for h in fabric.hosts() if h in config["hosts"]]  # neighbours share a process
    groups = agent_groups(in_fabric_order, len(hosts) if tcp else options.agent_processes)
    env = {**os.environ, **(hotpath.environment(options.agent_code) if not tcp else {})}
    procs = {",".join(g): emu.popen(g[0], [sys.executable, "-m", agent, "--config", str(outdir / "agent.json"),
                                           "--hosts", ",".join(g)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env)
             for g in groups}
    late: list[str] = []
    try:
        slow = _wait_for(outdir, hosts, "ready", procs, READY_TIMEOUT_S, "agents starting", quiet)
        if slow and not any(p.poll() is not None for p in procs.values()):
            raise RuntimeError(f"agents of {_hosts(slow)} not ready after {READY_TIMEOUT_S:.0f} s")
        t0 = time.monotonic_ns() + int(START_DELAY_S * 1e9)
        (outdir / "go.tmp").write_text(str(t0))
        (outdir / "go.tmp").rename(outdir / "go")  # atomically: an agent must never read it half-written
        late = _wait_for(outdir, hosts, "done", procs, timeout_s + START_DELAY_S, "agents finished", quiet)
    finally:
        _stop(procs)
    failed = {h: p.stderr.read().decode(errors="replace").strip().splitlines()[-1:] for h, p in procs.items()
              if p.returncode not in (0, -signal.SIGTERM)}
    if failed:
        host, lines = next(iter(failed.items()))
        raise RuntimeError(f"agent for {host} failed: {lines[0] if lines else 'no output'}")
    for p in procs.values():
        p.stderr.close()
    results = {h: json.loads((outdir / f"{h}.json").read_text()) for h in hosts}
    metrics = summarise(messages, results, t0, options)
    metrics.agents_timed_out = {h: f"not done after the {timeout_s:.0f} s deadline: stopped, with what it had"
                                for h in late}
    write_messages_csv(outdir / "messages.csv", metrics.messages)
    (outdir / "traffic.json").write_text(json.dumps(metrics.to_dict(), indent=2))
    return metrics


def _wait_for(outdir: Path, hosts: list[str], what: str, procs: dict, timeout_s: float, desc: str,
              quiet: bool) -> list[str]:
    """Until every host's agent has written host.<what>, one died, or the deadline: the hosts still missing."""
    deadline = time.monotonic() + timeout_s
    with tqdm(total=len(hosts), desc=desc, unit="host", disable=quiet, leave=False) as bar:
        while True:
            missing = [h for h in hosts if not (outdir / f"{h}.{what}").exists()]
            bar.update(len(hosts) - len(missing) - bar.n)
            if not missing or time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                return missing
            time.sleep(0.05)


def _hosts(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def summarise(messages: list[Message], results: dict[str, dict], t0: int,
              options: TransportOptions) -> TransferMetrics:
    """Per-message times (posted at the sender, delivered at the receiver) and run-wide transport metrics.
    ordering: of the send (flag) messages, flag_wait_us is how long each waited at the receiver after its last
    packet arrived until it was delivered (psn, release), fence_wait_us how long from posting to its first
    transmission (queued behind earlier messages, and under fence behind their acknowledgements)."""
    rows, lost = [], 0
    flag_wait, fence_wait = [], []
    for m in messages:
        sent = results.get(m.src, {}).get("sent", {}).get(str(m.id))
        got = results.get(m.dst, {}).get("received", {}).get(str(m.id))
        if m.op == "send":
            if got and "arrived_ns" in got:
                flag_wait.append((got["delivered_ns"] - got["arrived_ns"]) / 1e3)
            if sent and sent.get("first_tx_ns"):
                fence_wait.append((sent["first_tx_ns"] - sent["posted_ns"]) / 1e3)
        row = {"id": m.id, "src": m.src, "dst": m.dst, "bytes": m.bytes, "tag": m.tag, "qp": m.qp,
               "posted_s": (sent["posted_ns"] - t0) / 1e9 if sent else None,
               "delivered_s": (got["delivered_ns"] - t0) / 1e9 if got else None,
               "acked_s": (sent["acked_ns"] - t0) / 1e9 if sent and sent["acked_ns"] else None,
               "retransmits": sent["retransmits"] if sent else 0}
        row["completion_s"] = row["delivered_s"] - row["posted_s"] if got and sent else None
        lost += got is None
        rows.append(row)
    done = [r for r in rows if r["delivered_s"] is not None]
    completion = max((r["delivered_s"] for r in done), default=None)
    delivered_bytes = sum(r["bytes"] for r in done)
    agents = list(results.values())

    def total(section: str, key: str) -> int:
        return sum(a[section][key] for a in agents)
    reorder: dict[int, int] = {}
    for a in agents:
        for dist, count in a["rx"]["reorder_distance"].items():
            reorder[int(dist)] = reorder.get(int(dist), 0) + count
    distances = [d for d, c in reorder.items() for _ in range(c)]
    tags = sorted({m.tag for m in messages})
    received = total("rx", "packets")
    processes = {a.get("pid", h): a["traffic_cpu_s"]["total_s"] for h, a in results.items()}  # pid -> CPU s
    return TransferMetrics(
        transport=options.to_dict(), messages_total=len(messages), lost_messages=lost,
        duplicate_or_unexpected=sum(a["unexpected"] for a in agents),
        wrong_size=sum(a["wrong_size"] for a in agents),
        completion_s=completion, goodput_bps=delivered_bytes * 8 / completion if completion else 0.0,
        by_tag={tag: tag_summary([r for r in rows if r["tag"] == tag]) for tag in tags},
        message_completion_s=percentiles([r["completion_s"] for r in done]),
        packets=Packets(data=total("tx", "data_packets"), retransmits=total("tx", "retransmits"),
                        timeouts=total("tx", "timeouts"), spurious=total("tx", "spurious"),
                        send_errors=total("tx", "send_errors"), received=received,
                        duplicates=total("rx", "duplicates"), retransmitted=total("rx", "retransmitted")),
        reordering=Reordering(out_of_order=total("rx", "out_of_order"),
                              fraction=total("rx", "out_of_order") / max(1, received),
                              distance=percentiles(distances), histogram=dict(sorted(reorder.items())),
                              resequence_max=max((a["rx"]["resequence_max"] for a in agents), default=0)),
        rtt_us=percentiles([x for a in agents for x in a["rtt_us"]]),
        ordering=Ordering(mode=options.ordering,
                          violations=sum(a.get("ordering", {}).get("violations", 0) for a in agents),
                          sends=sum(a.get("ordering", {}).get("sends", 0) for a in agents),
                          flag_wait_us=percentiles(flag_wait), fence_wait_us=percentiles(fence_wait)),
        agents_cpu_s=sum(processes.values()),  # once per process, from the common start
        timer_lateness_us_p99=max((a["timer_lateness_us"].get("p99", 0.0) for a in agents), default=0.0),
        agent_processes=len(processes),
        agent_scheduling=" and ".join(sorted({a.get("scheduling", "normal") for a in agents})),
        agent_code=" and ".join(sorted({a.get("code", "python") for a in agents})),
        ecn={key: sum(a.get("ecn", {}).get(key, 0) for a in agents)
             for key in ("ce_received", "cnps_sent", "cnps_received")},
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
