"""A cluster run over two servers beside the same fabric on one, in one run: bring-up and teardown time, the
packet rate between the two GPUs of a node, over a local NVLink bridge or through the VXLAN tunnel joining its
halves on two servers, and an all-to-all job's completion against its lower bound.

The second server is the tests' (tests/integration/second_server.py): its own namespaces, OVS and sshd on this
machine, so both servers share its two cores; the figures say what the spreading machinery costs, not what two
real servers would carry. Fabric: 2 planes, 4 nodes x 2 GPUs, per plane 2 leaves and 2 spines; plane 1 on the
second server; the machine's own OVS serves each server's switches, on one server too. Packet rate: UDP,
200-byte payloads sent as fast as one sender can, links unshaped (the forwarding path alone). Job: every GPU
sends --size bytes to every other at t = 0 (the RDMA-like transport, its defaults), links shaped.

    sudo .venv/bin/python benchmarks/servers.py [--repeats 3] [--packets 20000] [--size 262144]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from results import ROOT, recorded

sys.path.insert(0, str(ROOT))  # the tests' second server

from emulator.analysis import bounds  # noqa: E402
from emulator.model import topologies  # noqa: E402
from emulator.model.servers import parse_server  # noqa: E402
from emulator.net.cluster_run import emulation  # noqa: E402
from emulator.run.job import run_job  # noqa: E402
from tests.integration.second_server import SecondServer  # noqa: E402
from traffic import patterns  # noqa: E402
from traffic.udpprobe import command, last_json  # noqa: E402

FABRIC = {"planes": 2, "nodes": 4, "leaves": 2, "spines": 2}
SRC, DST = "n0g0", "n0g1"  # one node's two GPUs: NVLink between them


def bringup(spread: dict) -> dict[str, float]:
    emu = emulation(topologies.build("mpft", **FABRIC), app="ecmp", quiet=True, **spread)
    with emu:
        pass
    theirs = [s for k, s in emu.timings.items() if k.startswith("up_s ")]  # a remote part's own bring-up
    return {"up": emu.timings["up_s"], "down": emu.timings["down_s"], "remote": max(theirs, default=0.0)}


def packet_rate(spread: dict, packets: int) -> dict[str, float]:
    fabric = topologies.build("mpft", **FABRIC)
    with emulation(fabric, app="ecmp", quiet=True, shape=False, **spread) as emu:
        sink = emu.host(DST)
        sink.sendCmd(command("sink", "--seconds", str(packets / 5000 + 5)))
        time.sleep(1.0)
        t0 = time.monotonic()
        emu.host(SRC).cmd(command("send", "--dst", fabric.ip(DST), "--packets", str(packets), "--size", "200",
                                  "--rate", "0"))
        took = time.monotonic() - t0
        received = last_json(sink.waitOutput())["received"]
    return {"pps": received / took, "lost": 1 - received / packets}


def all_to_all(spread: dict, size: int, seed: int) -> dict[str, float]:
    fabric = topologies.build("mpft", **FABRIC)
    messages = patterns.all_to_all(fabric, size=size)
    with tempfile.TemporaryDirectory(prefix="mpft-bench-") as out:
        m = run_job(fabric, messages, Path(out), seed=seed, quiet=True, **spread)
    carried = sum(t["tx_packets"] for s in m.servers.values() for t in s.tunnels.values())
    return {"ratio": m.completion_s / bounds.lower_bound_s(fabric, messages) if m.lost_messages == 0 else
            float("nan"), "cpu_bound": m.fidelity.cpu_bound, "tunnel_packets": carried}


def _each(runs: list[dict], key: str, fmt: str) -> str:
    return ", ".join(fmt.format(r[key]) for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--packets", type=int, default=20000)
    parser.add_argument("--size", type=int, default=256 * 1024, help="all-to-all bytes per GPU pair")
    args = parser.parse_args()
    with SecondServer() as second:
        layouts = {"one server": {"switch_daemons": "shared"},  # as each server of a cluster run has
                   "two servers": {"servers": [parse_server("localhost"), second.server],
                                   "ssh_config": second.ssh_config}}
        figures = {}
        for name, spread in layouts.items():
            ups = [bringup(spread) for _ in range(args.repeats)]
            rates = [packet_rate(spread, args.packets) for _ in range(args.repeats)]
            jobs = [all_to_all(spread, args.size, seed) for seed in range(args.repeats)]
            figures[name] = med = {"up": statistics.median(r["up"] for r in ups),
                                   "down": statistics.median(r["down"] for r in ups),
                                   "pps": statistics.median(r["pps"] for r in rates),
                                   "ratio": statistics.median(r["ratio"] for r in jobs)}
            theirs = _each(ups, "remote", "{:.1f}")
            remote = f" of which the second server's own {theirs} s" if "servers" in spread else ""
            print(f"{name:>11}: up {med['up']:.1f} s ({_each(ups, 'up', '{:.1f}')}{remote}), "
                  f"down {med['down']:.1f} s ({_each(ups, 'down', '{:.1f}')}); {SRC}->{DST} "
                  f"{med['pps'] / 1000:.1f} k packets/s ({_each(rates, 'pps', '{:.0f}')}), "
                  f"lost {_each(rates, 'lost', '{:.1%}')}; all-to-all {med['ratio']:.2f}x its bound "
                  f"({_each(jobs, 'ratio', '{:.2f}')}; CPU-bound in {sum(r['cpu_bound'] for r in jobs)} of "
                  f"{len(jobs)})" + (f", tunnels {_each(jobs, 'tunnel_packets', '{}')} packets" if remote else ""))
    one, two = figures["one server"], figures["two servers"]
    print(f"two servers / one: up {two['up'] / one['up']:.2f}x, down {two['down'] / one['down']:.2f}x, "
          f"NVLink packet rate through the tunnel {two['pps'] / one['pps']:.2f}x the local bridge's, "
          f"all-to-all completion {two['ratio'] / one['ratio']:.2f}x")
    print("both servers share this machine's cores: no performance target comes from these figures")


if __name__ == "__main__":
    with recorded("servers"):
        main()
