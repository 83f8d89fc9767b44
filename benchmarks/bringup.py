"""Bring-up and teardown time of the reference fabric: mpft-emu's batched build vs plain Mininet, one run.

Reference (issue 2): 8 planes, 16 nodes x 8 GPUs (128 GPU hosts), per plane 4 leaves + 4 spines (64 OVS
switches), 16 NVLink bridges, 384 shaped links, userspace datapath. Plain Mininet builds the same model
through emulator/net/mininet_topo.py with OVSSwitch(datapath=user) and TCLink(bw=...), without a controller;
ours includes starting the os-ken controller and waiting until every switch holds its ECMP state, with a private
switch daemon per plane (the default) and with the machine's own OVS for every switch ("shared").

    sudo make bench            # or: sudo .venv/bin/python benchmarks/bringup.py [--repeats 3] [--no-plain]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

from results import recorded

from emulator.model import topologies
from emulator.net.emulation import Emulation

REFERENCE = {"planes": 8, "nodes": 16, "leaves": 4, "spines": 4}
SWITCH_DAEMONS = ("per-plane", "shared")


def ours(params: dict, switch_daemons: str) -> dict[str, float]:
    fabric = topologies.build("mpft", **params)
    emu = Emulation(fabric, app="ecmp", quiet=True, switch_daemons=switch_daemons)
    with emu:
        pass
    return {"up": emu.timings["up_s"], "down": emu.timings["down_s"]}


def plain_mininet(params: dict) -> dict[str, float]:
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    from emulator.net.mininet_topo import topos

    setLogLevel("error")
    Mininet.inited = True  # skip fixLimits: it raises machine-wide sysctls and never restores them
    t0 = time.monotonic()
    net = Mininet(topo=topos["mpft"](**params), switch=partial(OVSSwitch, datapath="user"), link=TCLink,
                  controller=None, build=False)
    net.build()
    t_build = time.monotonic() - t0
    t1 = time.monotonic()
    net.start()
    t_start = time.monotonic() - t1
    t2 = time.monotonic()
    net.stop()
    return {"up": t_build + t_start, "build": t_build, "start": t_start, "down": time.monotonic() - t2}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs of ours (median reported)")
    parser.add_argument("--no-plain", action="store_true", help="skip plain Mininet (about a minute)")
    args = parser.parse_args()
    counts = topologies.build("mpft", **REFERENCE).counts()
    print(f"reference fabric: {counts['hosts']} GPU hosts, {counts['switches']} OVS switches, "
          f"{counts['nvlink_domains']} NVLink bridges, "
          f"{counts['fabric_links'] + counts['host_links'] + counts['nvlink_links']} shaped links")
    for mode in SWITCH_DAEMONS:
        runs = [ours(REFERENCE, mode) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"mpft-emu {mode:>9}  up {med['up']:6.1f} s  down {med['down']:5.1f} s  median of {len(runs)}: "
              + ", ".join(f"{r['up']:.1f}/{r['down']:.1f}" for r in runs))
    if not args.no_plain:
        plain = plain_mininet(REFERENCE)
        print(f"Mininet            up {plain['up']:6.1f} s  down {plain['down']:5.1f} s  "
              f"(build {plain['build']:.1f} s, start {plain['start']:.1f} s)")
        print(f"ratio Mininet/mpft-emu ({SWITCH_DAEMONS[-1]}): up {plain['up'] / med['up']:.1f}x, "
              f"down {plain['down'] / med['down']:.1f}x")
    print("goal: up <= 15 s, down <= 5 s")


if __name__ == "__main__":
    with recorded("bringup"):
        main()
