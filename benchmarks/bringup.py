"""Bring-up and teardown time of the reference fabric: mpft-emu's batched build vs plain Mininet, one run.

Reference (issue 2): 8 planes, 16 nodes x 8 GPUs (128 GPU hosts), per plane 4 leaves + 4 spines (64 OVS
switches), 16 NVLink bridges, 384 shaped links, userspace datapath. Plain Mininet builds the same model
through emulator/net/mininet_topo.py with OVSSwitch(datapath=user) and TCLink(bw=...), without a controller;
ours includes starting the os-ken controller and waiting until every switch holds its ECMP state, with a private
switch daemon per plane (the default) and with the machine's own OVS for every switch ("shared").

Large (issue 37): the paper's 8 planes at 64 nodes (512 GPUs, 8 leaves and 4 spines per plane): up until the
flows are installed, then 1,000 sampled GPU pairs pinged (most across planes: PXN), down until the kernel has
removed the namespaces (kernel_settled_s).

    sudo make bench            # or: sudo .venv/bin/python benchmarks/bringup.py [--repeats 3] [--no-plain] [--no-large]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import time
from functools import partial
from pathlib import Path

from results import recorded

from emulator.model import topologies
from emulator.net.emulation import Emulation

REFERENCE = {"planes": 8, "nodes": 16, "leaves": 4, "spines": 4}
SWITCH_DAEMONS = ("per-plane", "shared")
LARGE = {"planes": 8, "nodes": 64, "leaves": 8, "spines": 4}  # 512 GPUs (issue 37)
PAIRS = 1000


def sampled_pairs(fabric, count: int, seed: int = 1) -> list[tuple[str, str]]:
    """`count` distinct ordered pairs of GPUs, at random: most cross planes, so through PXN."""
    hosts = fabric.gpu_hosts()
    rng = random.Random(seed)
    pairs: set[tuple[str, str]] = set()
    while len(pairs) < min(count, len(hosts) * (len(hosts) - 1)):
        src, dst = rng.sample(hosts, 2)
        pairs.add((src, dst))
    return sorted(pairs)


def unreachable(emu, pairs: list[tuple[str, str]]) -> list[str]:
    """One ping per pair, every source's pings in one shell loop and all sources at once; the pairs that fail."""
    by_src: dict[str, list[str]] = {}
    for src, dst in pairs:
        by_src.setdefault(src, []).append(dst)
    for src, dsts in by_src.items():
        targets = " ".join(emu.fabric.ip(d) for d in dsts)  # addresses from the model, not names
        emu.host(src).sendCmd(f"for ip in {targets}; do ping -c1 -W2 -q $ip >/dev/null || echo FAIL $ip; done")
    return [f"{src}->{line.split()[1]}" for src in by_src for line in emu.host(src).waitOutput().splitlines()
            if line.startswith("FAIL")]


def kernel_settled_s() -> float:
    """How long until the kernel has removed every network namespace released so far: a probe namespace released
    now, with a veth whose other end stays here, is cleaned up after them (one ordered work queue) and takes that
    end with it."""
    ns, here, there = f"mpft-probe-{os.getpid()}", f"mpft-pa{os.getpid()}", f"mpft-pb{os.getpid()}"
    t0 = time.monotonic()
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", ns], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=True)
    while Path("/sys/class/net", here).exists():
        time.sleep(0.01)
    return time.monotonic() - t0


def large(params: dict) -> dict[str, float]:
    """Up (flows installed), then PAIRS sampled pairs reachable, then down until the kernel has finished."""
    fabric = topologies.build("mpft", **params)
    emu = Emulation(fabric, app="ecmp", quiet=True)
    with emu:
        t0 = time.monotonic()
        failed = unreachable(emu, sampled_pairs(fabric, PAIRS))
        reach = time.monotonic() - t0
    if failed:
        raise SystemExit(f"{len(failed)} of {PAIRS} pairs unreachable, e.g. {', '.join(failed[:3])}")
    settled = kernel_settled_s()
    return {"up": emu.timings["up_s"], "reach": reach, "down": emu.timings["down_s"], "settled": settled,
            "mode": emu.switchd.mode}


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
    parser.add_argument("--no-large", action="store_true", help="skip the 512-GPU fabric (about 20 s a run)")
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
    if not args.no_large:
        counts = topologies.build("mpft", **LARGE).counts()
        runs = [large(LARGE) for _ in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("up", "reach", "down", "settled")}
        print(f"512 GPUs ({counts['switches']} OVS switches, {runs[0]['mode']} daemons): up {med['up']:.1f} s, "
              f"{PAIRS} sampled pairs (PXN included) reachable {med['reach']:.1f} s later: "
              f"{med['up'] + med['reach']:.1f} s; down {med['down']:.1f} s, the kernel done "
              f"{med['settled']:.2f} s later; median of {len(runs)}: "
              + ", ".join(f"{r['up'] + r['reach']:.1f}/{r['down'] + r['settled']:.1f}" for r in runs))
        print("goal (issue 37): up and reachable <= 20 s, down <= 10 s")


if __name__ == "__main__":
    with recorded("bringup"):
        main()
