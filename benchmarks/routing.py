"""Routing apps on real packets, side by side in one run (issue 3's figures):

1. one UDP flow of 5,000 packets: per-spine share under ECMP (fixed source port) and spray (16 entropy values);
2. a shift permutation among plane 0's GPUs, UDP at 95 % of the NIC rate (spray with per-packet entropy):
   delivered goodput of ecmp, static, adaptive and spray as a ratio to the lower bound (every flow at its NIC rate on a
   non-blocking plane), over several seeds (the shift and hash bases change with the seed);
3. failover: packets lost and the repair time when a leaf uplink is cut (local repair by watched buckets)
   and when a spine loses its link to the far leaf (the controller must repair), median of repeats;
4. isolation: plane 1's delivered traffic while plane 0 has a failure, beside a run without one;
5. adaptive: how long after a competing flow makes an uplink hot its weight falls below the idle uplinks'.

    sudo .venv/bin/python benchmarks/routing.py [--seeds 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from results import recorded

from controllers.static_paths import permutation, save_pattern
from emulator.model import topologies
from emulator.net.emulation import Emulation
from emulator.net.monitor import counter_delta as delta
from emulator.net.monitor import packet_counters as counters
from traffic.udpprobe import argv as probe_argv
from traffic.udpprobe import command as probe_cmd
from traffic.udpprobe import last_json

PAYLOAD = 8000  # UDP payload bytes: one 9000-byte MTU frame


def _sink(emu, host, seconds):
    emu.host(host).sendCmd(probe_cmd("sink", "--seconds", f"{seconds:g}"))


def _sink_result(emu, host):
    return last_json(emu.host(host).waitOutput())


def spine_shares(app):
    fabric = topologies.build()
    with Emulation(fabric, app=app, quiet=True) as emu:
        leaf = fabric.nic_links("n0g0")[0][0]
        up = [fabric.intf(leaf, s) for s in fabric.switches(role="spine", plane=0)]
        before = counters(up)
        _sink(emu, "n15g0", 5)
        emu.host("n0g0").cmd("sleep 0.3")
        emu.host("n0g0").cmd(probe_cmd("send", "--dst", fabric.ip("n15g0"), "--packets", "5000", "--rate", "2000",
                                       *(["--entropy", "16"] if app == "spray" else [])))
        _sink_result(emu, "n15g0")
        moved = delta(before, counters(up))
    return [moved[i] / 5000 for i in up]


def permutation_goodput(app, seed, seconds=6.0):
    """Delivered / offered for a shift permutation on plane 0 at 95 % of the NIC rate."""
    fabric = topologies.build()
    shift = 4 * (1 + seed % 3)  # to another leaf: 4, 8 or 12 hosts ahead
    pairs = permutation(fabric, plane=0, shift=shift)
    rate_pps = 0.95 * 10e6 / 8 / (PAYLOAD + 28 + 14)
    env = {}
    if app == "static":
        env["MPFT_PATTERN"] = str(save_pattern(Path(tempfile.mkdtemp()) / "pattern.json", pairs))
    with Emulation(fabric, app=app, seed=seed, app_env=env, quiet=True) as emu:
        for _src, dst in pairs:
            _sink(emu, dst, seconds + 2)
        time.sleep(0.5)
        procs = [emu.popen(src, probe_argv("send", "--dst", fabric.ip(dst), "--size", str(PAYLOAD), "--packets",
                                           str(int(rate_pps * seconds)), "--rate", f"{rate_pps:.1f}",
                                           *(["--entropy", "16"] if app == "spray" else []))) for src, dst in pairs]
        for proc in procs:
            proc.wait()
        got = sum(_sink_result(emu, dst)["received"] for _src, dst in pairs)
    return got / (len(pairs) * int(rate_pps * seconds))


def failover(kind, rate=1000, seconds=4.0):
    """Packets lost, and for how long, when a link fails halfway through a sprayed stream."""
    fabric = topologies.build()
    link = ("p0l0", "p0s1") if kind == "local" else ("p0s1", "p0l3")
    with Emulation(fabric, app="spray", quiet=True) as emu:
        _sink(emu, "n15g0", seconds + 2)
        emu.host("n0g0").cmd("sleep 0.3")
        cut = threading.Timer(seconds / 2, emu.fail_link, link)
        cut.start()
        emu.host("n0g0").cmd(probe_cmd("send", "--dst", fabric.ip("n15g0"), "--packets", str(int(rate * seconds)),
                                       "--rate", str(rate), "--entropy", "16"))
        cut.join()
        result = _sink_result(emu, "n15g0")
    missing = result["missing"].get(fabric.ip("n0g0"), {"count": 0, "first": 0, "last": 0})
    span_ms = (missing["last"] - missing["first"]) / rate * 1000 if missing["count"] else 0.0
    return missing["count"], span_ms


def isolation(fail):
    """Plane 1's delivered share of a steady stream, with or without a plane-0 failure halfway."""
    fabric = topologies.build()
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        _sink(emu, "n15g1", 6)
        emu.host("n0g1").cmd("sleep 0.3")
        timer = threading.Timer(2.0, emu.fail_switch, ("p0s0",)) if fail else None
        if timer:
            timer.start()
        emu.host("n0g1").cmd(probe_cmd("send", "--dst", fabric.ip("n15g1"), "--flows", "8", "--packets", "500",
                                       "--rate", "1000", "--size", str(PAYLOAD // 8)))
        if timer:
            timer.join()
        return _sink_result(emu, "n15g1")["received"] / 4000


def group_weights(switch: str) -> dict[int, int]:
    groups = subprocess.run(["ovs-ofctl", "-O", "OpenFlow15", "dump-groups", switch], capture_output=True,
                            text=True).stdout
    return {int(p): int(w) for w, p in re.findall(r"weight:(\d+),[^,]*?,?actions=output:(\d+)", groups)}


def adaptive_reaction(timeout=5.0):
    """Seconds from the start of a competing flow until its uplink weighs less than every idle uplink."""
    fabric = topologies.build()
    with Emulation(fabric, app="adaptive", quiet=True) as emu:
        spines = fabric.switches(role="spine", plane=0)
        up = {fabric.intf("p0l0", s): fabric.port("p0l0", s) for s in spines}
        _sink(emu, "n13g0", timeout + 2)
        start = time.monotonic()
        emu.popen("n1g0", probe_argv("send", "--dst", fabric.ip("n13g0"), "--size", str(PAYLOAD), "--packets",
                                     str(int(120 * timeout)), "--rate", "120"))
        reaction = None
        while time.monotonic() - start < timeout and reaction is None:
            before = counters(list(up))
            time.sleep(0.05)
            moved = delta(before, counters(list(up)))
            hot = up[max(moved, key=moved.get)]
            weights = group_weights("p0l0")
            if max(moved.values()) and weights and weights[hot] < min(w for p, w in weights.items() if p != hot):
                reaction = time.monotonic() - start
        _sink_result(emu, "n13g0")
    return reaction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    print("1. one flow of 5,000 packets, share per spine of plane 0")
    for app in ("ecmp", "spray"):
        shares = spine_shares(app)
        print(f"   {app:<6} " + "  ".join(f"{x:6.1%}" for x in shares)
              + f"   (max deviation from even {max(abs(x - 0.25) for x in shares) / 0.25:.0%})")

    print(f"2. shift permutation on plane 0 at 95 % of the NIC rate: delivered / lower bound, {args.seeds} seeds")
    results = {app: [permutation_goodput(app, seed) for seed in range(args.seeds)]
               for app in ("ecmp", "static", "adaptive", "spray")}
    for app, values in results.items():
        print(f"   {app:<6} median {statistics.median(values):.2f}  range {min(values):.2f}-{max(values):.2f}")
    ratios = [s / e for s, e in zip(results["spray"], results["ecmp"], strict=True)]
    print(f"   spray/ECMP goodput: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")

    print(f"3. failover under spray, 1,000 packets/s with 16 entropy values, median of {args.repeats}")
    for kind, label in (("local", "leaf uplink cut (fast failover)"), ("global", "spine-to-far-leaf cut (controller)")):
        runs = [failover(kind) for _ in range(args.repeats)]
        print(f"   {label:<36} lost {statistics.median(r[0] for r in runs):5.0f} packets, "
              f"repair {statistics.median(r[1] for r in runs):6.1f} ms  (runs: "
              + ", ".join(f"{n}/{ms:.0f} ms" for n, ms in runs) + ")")

    print("4. isolation: plane 1's delivered share while plane 0 loses a spine")
    base, failed = isolation(False), isolation(True)
    print(f"   without failure {base:.1%}, with a plane-0 spine down {failed:.1%}")

    print(f"5. adaptive (100 ms polling): a competing flow's uplink weighs least after, median of {args.repeats}")
    times = [adaptive_reaction() for _ in range(args.repeats)]
    done = [t for t in times if t is not None]
    print(f"   {statistics.median(done) * 1000:.0f} ms" if done else "   never within 5 s",
          "(runs: " + ", ".join("never" if t is None else f"{t * 1000:.0f} ms" for t in times) + ")")


if __name__ == "__main__":
    with recorded("routing"):
        main()
