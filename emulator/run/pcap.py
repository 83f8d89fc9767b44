"""Replay a pcap's frames on a live fabric and count what it delivered."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from emulator.net.emulation import Emulation
from emulator.net.monitor import counter_delta
from traffic import pcapreplay


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
    to_host_before, from_host_before = emu.packet_counters(ports, "tx"), emu.packet_counters(ports, "rx")
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
    to_host = counter_delta(to_host_before, emu.packet_counters(ports, "tx"))
    from_host = counter_delta(from_host_before, emu.packet_counters(ports, "rx"))
    metrics = {**plan.to_dict(), "sent": sum(r["sent"] for r in results.values()),
               "send_failed": sum(r["failed"] for r in results.values()),
               "lag_max_s": max((r["lag_max_s"] for r in results.values()), default=0.0),
               "delivered": sum(to_host.values()), "expected_delivered": plan.kept,
               "replies": sum(max(0, from_host[port[h]] - len(plan.frames.get(h, ()))) for h in hosts)}
    (outdir / "replay.json").write_text(json.dumps(metrics, indent=2))
    return metrics

