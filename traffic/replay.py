"""Traces in, schedules (or raw frames) out: which importer reads a file, and the pcap replay on a live fabric.

Formats (`--format auto` picks by name): `jsonl` (our trace format, traffic.schedule), `hpcc` (HPCC's ns-3
flow.txt, traffic.hpcc), `chakra` (ASTRA-sim's per-rank .et files, traffic.chakra; give one rank's file or the
prefix), `pcap` (raw frames, traffic.pcapreplay). Message traces written for 100-400 Gbit/s fabrics are far too
large for 10 Mbit/s links: `scale` multiplies every message's bytes (at least 1 byte each).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from emulator.errors import UserError
from emulator.model import Fabric
from emulator.monitor import counter_delta, packet_counters
from traffic import chakra, hpcc, pcapreplay, schedule
from traffic.schedule import Message

if TYPE_CHECKING:  # not imported at run time: building mpft's parser should not load Mininet
    from emulator.emulation import Emulation

FORMATS = ("auto", "jsonl", "hpcc", "chakra", "pcap")


def detect(path: Path) -> str:
    name = path.name
    if name.endswith((".pcap", ".cap", ".pcapng")):
        return "pcap"
    if name.endswith(".et") or not path.exists() and Path(f"{path}.0.et").exists():
        return "chakra"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".txt"):
        return "hpcc"
    raise UserError("cannot tell the trace format from the name: give --format", file=str(path))


def load_messages(path: Path, fabric: Fabric, fmt: str = "auto", scale: float = 1.0,
                  hpcc_topology: Path | None = None) -> tuple[list[Message], str]:
    """A message trace as a schedule for `fabric`, and a one-line summary of what the importer did. For HPCC,
    `hpcc_topology` (its topology.txt) maps the topology's host ids, rather than the flows' ids, onto hosts."""
    fmt = detect(path) if fmt == "auto" else fmt
    if not scale > 0:
        raise UserError("must be > 0", field="scale")
    if fmt == "jsonl":
        messages = schedule.read(path, fabric.hosts())
        summary = f"{len(messages)} messages"
    elif fmt == "hpcc":
        topology = hpcc.read_topology(hpcc_topology) if hpcc_topology else None
        result = hpcc.read_flows(path, fabric.gpu_hosts(), topology)
        messages, summary = result.messages, result.summary()
    elif fmt == "chakra":
        result = chakra.load(path, fabric.gpu_hosts())
        messages, summary = result.messages, result.summary()
    else:
        raise UserError(f"{fmt} is not a message trace", field="format")
    if scale != 1.0:
        messages = [replace(m, bytes=max(1, round(m.bytes * scale))) for m in messages]
        summary += f"; bytes scaled by {scale:g}"
    return messages, summary


def replay_pcap(emu: Emulation, plan: pcapreplay.Plan, outdir: Path) -> dict:
    """Send every host's frames on schedule (one sender per source host) and count what the fabric delivered:
    packets out of the switch port of each destination, and packets each host sent beyond its own frames (a
    reply provoked by a replayed packet would show up there; there must be none)."""
    outdir.mkdir(parents=True, exist_ok=True)
    plan_file = outdir / "plan.json"
    plan.save(plan_file)
    hosts = sorted(set(plan.addresses.values()) | set(plan.frames))
    senders = sorted(plan.frames)
    port = {h: emu.fabric.intf(emu.fabric.nic_links(h)[0][0], h) for h in hosts}  # switch side of each NIC link
    ports = list(port.values())
    to_host_before, from_host_before = packet_counters(ports, "tx"), packet_counters(ports, "rx")
    start = time.monotonic() + 0.5
    procs = {h: emu.popen(h, [sys.executable, "-m", "traffic.pcapreplay", "send", "--plan", str(plan_file),
                              "--host", h, "--ifname", emu.fabric.intf(h, emu.fabric.nic_links(h)[0][0]),
                              "--start", f"{start:.6f}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for h in senders}
    results = {}
    for h, proc in procs.items():
        out, err = proc.communicate(timeout=plan.to_dict()["duration_s"] + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"pcap sender on {h} failed: {err.decode(errors='replace').strip()}")
        results[h] = json.loads(out.decode().strip().splitlines()[-1])
    time.sleep(0.5)  # the last frames cross the fabric
    to_host = counter_delta(to_host_before, packet_counters(ports, "tx"))
    from_host = counter_delta(from_host_before, packet_counters(ports, "rx"))
    metrics = {**plan.to_dict(), "sent": sum(r["sent"] for r in results.values()),
               "send_failed": sum(r["failed"] for r in results.values()),
               "lag_max_s": max((r["lag_max_s"] for r in results.values()), default=0.0),
               "delivered": sum(to_host.values()), "expected_delivered": plan.kept,
               "replies": sum(max(0, from_host[port[h]] - len(plan.frames.get(h, ()))) for h in hosts)}
    (outdir / "replay.json").write_text(json.dumps(metrics, indent=2))
    return metrics

