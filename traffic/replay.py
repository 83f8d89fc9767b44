"""Traces in, schedules (or raw frames) out: which importer reads a file, and the pcap replay on a live fabric.

Formats (`--format auto` picks by name): `jsonl` (our trace format, traffic.schedule), `hpcc` (HPCC's ns-3
flow.txt, traffic.hpcc), `chakra` (ASTRA-sim's per-rank .et files, traffic.chakra; give one rank's file or the
prefix), `pcap` (raw frames, traffic.pcapreplay). Message traces written for 100-400 Gbit/s fabrics are far too
large for 10 Mbit/s links: `scale` multiplies every message's bytes (at least 1 byte each).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from emulator.emulation import Emulation
from emulator.errors import UserError
from emulator.model import Fabric
from traffic import chakra, hpcc, pcapreplay, schedule
from traffic.schedule import Message

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


def trace_hosts(fabric: Fabric) -> list[str]:
    """Hosts that importers map node ids and ranks onto, in order: the GPU hosts (n0g0, n0g1, n1g0, ... so
    consecutive ranks share a node, as on real machines), or every host of fabrics without GPUs."""
    return fabric.hosts(role="gpu") or fabric.hosts()


def load_messages(path: Path, fabric: Fabric, fmt: str = "auto", scale: float = 1.0) -> tuple[list[Message], str]:
    """A message trace as a schedule for `fabric`, and a one-line summary of what the importer did."""
    fmt = detect(path) if fmt == "auto" else fmt
    if not scale > 0:
        raise UserError("must be > 0", field="scale")
    if fmt == "jsonl":
        messages = schedule.read(path, fabric.hosts())
        summary = f"{len(messages)} messages"
    elif fmt == "hpcc":
        result = hpcc.read_flows(path, trace_hosts(fabric))
        messages, summary = result.messages, result.summary()
    elif fmt == "chakra":
        source = re.sub(r"\.\d+\.et$", "", str(path))
        result = chakra.load(source, trace_hosts(fabric))
        messages, summary = result.messages, result.summary()
    else:
        raise UserError(f"{fmt} is not a message trace", field="format")
    if scale != 1.0:
        messages = [replace(m, bytes=max(1, round(m.bytes * scale))) for m in messages]
        summary += f"; bytes scaled by {scale:g}"
    return messages, summary


def _switch_counters(emu: Emulation, hosts: list[str], stat: str) -> dict[str, int]:
    """A counter of the switch-side end of each host's NIC link (root namespace)."""
    out = {}
    for h in hosts:
        peer = emu.fabric.nic_links(h)[0][0]
        out[h] = int(Path(f"/sys/class/net/{emu.fabric.intf(peer, h)}/statistics/{stat}").read_text())
    return out


def replay_pcap(emu: Emulation, plan: pcapreplay.Plan, outdir: Path, quiet: bool = False) -> dict:
    """Send every host's frames on schedule (one sender per source host) and count what the fabric delivered:
    packets out of the switch port of each destination, and packets each host sent beyond its own frames (a
    reply provoked by a replayed packet would show up there; there must be none)."""
    outdir.mkdir(parents=True, exist_ok=True)
    plan_file = outdir / "plan.json"
    plan.save(plan_file)
    hosts = sorted(set(plan.addresses.values()) | set(plan.frames))
    senders = sorted(plan.frames)
    to_host_before = _switch_counters(emu, hosts, "tx_packets")
    from_host_before = _switch_counters(emu, hosts, "rx_packets")
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
    to_host = _switch_counters(emu, hosts, "tx_packets")
    from_host = _switch_counters(emu, hosts, "rx_packets")
    expected_in = {h: 0 for h in hosts}
    for frames in plan.frames.values():
        for _t, frame in frames:
            expected_in[emu.fabric.host_by_ip(_dst_ip(frame))] += 1
    metrics = {**plan.to_dict(), "sent": sum(r["sent"] for r in results.values()),
               "send_failed": sum(r["failed"] for r in results.values()),
               "lag_max_s": max((r["lag_max_s"] for r in results.values()), default=0.0),
               "delivered": sum(to_host[h] - to_host_before[h] for h in hosts),
               "expected_delivered": sum(expected_in.values()),
               "replies": sum(max(0, from_host[h] - from_host_before[h] - len(plan.frames.get(h, ()))) for h in hosts)}
    (outdir / "replay.json").write_text(json.dumps(metrics, indent=2))
    return metrics


def _dst_ip(frame: bytes) -> str:
    return ".".join(str(b) for b in frame[30:34])
