"""The transport agents and the routing apps with real messages, measured side by side in one run:

1. one agent's packet rate: a 40 MB RDMA write between the two GPUs of one node over an NVLink bridge set to
   4 Gbit/s (no OVS on that path, so the agents are the limit): packets/s and CPU microseconds per packet;
2. how many agents the machine carries: a shift permutation among k GPU hosts (k = 4 ... 32) through the fabric
   at the 10 Mbit/s NIC rate, pinned collision-free by the static app; each message's goodput as a ratio to what
   its NIC can carry (the wire overhead of our headers taken out), median and worst, with the CPU verdict;
3. completion time of a permutation among plane 0's 16 GPUs (1 MiB each) under ecmp, static, adaptive (per-QP
   entropy) and spray (per-packet entropy), as a ratio to the lower bound (every NIC busy the whole time on a
   non-blocking plane), over several seeds, with the ECMP/spray ratio and its range.

    sudo .venv/bin/python benchmarks/transport.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

from results import recorded

from controllers.static_paths import save_pattern
from emulator.analysis.fidelity import cpu_bound
from emulator.model import topologies, wire
from emulator.model.schedule import Message
from emulator.net.emulation import Emulation
from emulator.net.monitor import CpuMonitor
from emulator.run.launch import transfer
from traffic import patterns
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-transport-"))
MIB = 1 << 20


def efficiency(mtu: int) -> float:
    """Payload share of the bytes the shaper counts for a full data packet."""
    return wire.payload_per_packet(mtu) / (mtu + wire.ETH)


def agent_rate() -> dict:
    fabric = topologies.build("mpft", planes=2, nodes=2, leaves=1, spines=1, nvlink_mbps=4000)
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        m = transfer(emu, [Message(0, 0.0, "n0g0", "n0g1", 40 * 1000 * 1000)], OUT / "rate",
                     TransportOptions(window=63), quiet=True)
    agents = {h: json.loads((OUT / "rate" / f"{h}.json").read_text()) for h in ("n0g0", "n0g1")}
    packets = m.packets.data
    return {"pps": packets / m.completion_s, "mbps": m.goodput_bps / 1e6,
            "sender_us_per_packet": agents["n0g0"]["cpu_s"] / packets * 1e6,
            "receiver_us_per_packet": agents["n0g1"]["cpu_s"] / packets * 1e6,
            "retransmits": m.packets.retransmits}


def agents_scale(k: int) -> dict:
    """k hosts (a half-shift permutation within each plane used), pinned collision-free by the static app, so
    that what falls short of the NIC rate is the machine, not hash collisions."""
    fabric = topologies.build()
    per_plane = min(k, 16)
    messages = patterns.mix(*(patterns.permutation(fabric, kind="shift", shift=per_plane // 2, size=int(10e6 / 8 * 3),
                                                   hosts=patterns.compute_hosts(fabric, plane=p)[:per_plane])
                              for p in range(k // per_plane)))
    with Emulation(fabric, app="static", app_env=_pattern(messages, f"scale-{k}"), quiet=True) as emu:
        monitor = CpuMonitor(switches=emu.switchd.vswitchd_pids).start()
        m = transfer(emu, messages, OUT / f"scale-{k}", quiet=True)
        cpu = monitor.stop()
    line = 10e6 * efficiency(fabric.mtu)
    rows = [r for r in _rows(OUT / f"scale-{k}") if r["completion_s"]]
    ratios = [r["bytes"] * 8 / r["completion_s"] / line for r in rows]
    return {"k": k, "median": statistics.median(ratios), "worst": min(ratios), "lost": m.lost_messages,
            "cpu_bound": cpu_bound(cpu), "idle": cpu.min_idle, "ovs_thread": cpu.max_thread,
            "agents_cpu_s": m.agents_cpu_s}


def _pattern(messages: list[Message], name: str) -> dict[str, str]:
    """The static app's input: the pairs to pin."""
    return {"MPFT_PATTERN": str(save_pattern(OUT / f"{name}.json", [(m.src, m.dst) for m in messages]))}


def _rows(directory: Path) -> list[dict]:
    with open(directory / "messages.csv") as f:
        return [{k: (float(v) if k in ("bytes", "completion_s") and v else v) for k, v in r.items()}
                for r in csv.DictReader(f)]


def app_completion(app: str, seed: int) -> float:
    fabric = topologies.build()
    hosts = patterns.compute_hosts(fabric, plane=0)
    messages = patterns.permutation(fabric, kind="random", size=MIB, hosts=hosts, seed=seed)
    env = _pattern(messages, f"pattern-{seed}") if app == "static" else {}
    entropy = "spray" if app == "spray" else "fixed"
    with Emulation(fabric, app=app, seed=seed, app_env=env, quiet=True) as emu:
        m = transfer(emu, messages, OUT / f"{app}-{seed}", TransportOptions(entropy=entropy, cc="rtt"),
                     seed=seed, quiet=True)
    assert m.lost_messages == 0
    bound = MIB * 8 / (10e6 * efficiency(fabric.mtu))
    return m.completion_s / bound


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    r = agent_rate()
    print(f"1. one agent pair over a 4 Gbit/s NVLink bridge: {r['pps']:,.0f} packets/s ({r['mbps']:.0f} Mbit/s "
          f"goodput); CPU per packet: sender {r['sender_us_per_packet']:.0f} us, receiver "
          f"{r['receiver_us_per_packet']:.0f} us; {r['retransmits']} retransmits")
    print("2. shift permutation among k hosts at the 10 Mbit/s NIC rate: message goodput / NIC capacity")
    print(f"   {'k':>3} {'median':>7} {'worst':>7} {'lost':>4} {'idle min':>8} {'OVS thread':>10} {'agents CPU s':>12}")
    for k in (4, 8, 16, 32):
        s = agents_scale(k)
        print(f"   {s['k']:>3} {s['median']:>7.0%} {s['worst']:>7.0%} {s['lost']:>4} {s['idle']:>8.0%} "
              f"{s['ovs_thread']:>10.0%} {s['agents_cpu_s']:>12.1f}" + ("  CPU-BOUND" if s["cpu_bound"] else ""))
    print(f"3. random permutation on plane 0 (16 GPUs, 1 MiB each, cc rtt): completion / lower bound, "
          f"{args.seeds} seeds")
    results = {app: [app_completion(app, seed) for seed in range(args.seeds)]
               for app in ("ecmp", "static", "adaptive", "spray")}
    for app, ratios in results.items():
        print(f"   {app:<9} median {statistics.median(ratios):.2f}  range {min(ratios):.2f}-{max(ratios):.2f}")
    ecmp_spray = [e / s for e, s in zip(results["ecmp"], results["spray"], strict=True)]
    print(f"   ECMP/spray completion ratio: median {statistics.median(ecmp_spray):.2f}, range "
          f"{min(ecmp_spray):.2f}-{max(ecmp_spray):.2f}")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("transport"):
        main()
