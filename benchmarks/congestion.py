"""Congestion control on the scenarios htsim measured (../shared/HTSIM.md), side by side with its figures.

On the 16-host leaf-spine (4 leaves x 4 hosts, 4 spines, 10 Mbit/s, 128 KB queues; host i on leaf i // 4), every
congestion-control plug-in under ecmp and under spray (per-packet entropy), with the same parameters under both,
over seeds, with the transport's defaults otherwise (the window left to the fabric):
- all-to-all: every host sends 256 kB to each of the other 15 at t = 0;
- incast 15 -> 1: 512 kB from each of hosts 1-15 to host 0; again at MTU 1500, where the receiver's queue holds
  87 packets instead of 14, so each sender sees it 6 times per drain instead of once (emulator.analysis.feedback:
  the sender-driven plug-ins' queue swings at the jumbo MTU are the scale-down's, not theirs);
- permutations: shift-4 (host i -> i + 4 mod 16) and a random derangement, 2 MB per host.
Per run: completion / lower bound (emulator.analysis.bounds), retransmissions / data packets, timeouts, the p99
egress queue over backlogged samples / the buffer, and the CPU verdict (a CPU-bound run does not count). htsim
reports frac = ideal / completion; its completion / ideal (1 / frac) is printed beside ours.

    sudo .venv/bin/python benchmarks/congestion.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds, feedback
from emulator.model import topologies
from emulator.model.schedule import Message
from emulator.net import features
from emulator.run.job import run_job
from traffic import patterns
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-congestion-"))
KB = 1000
# htsim's frac of ideal (UEC with NSCC; NDP), mean over 5 seeds: ECMP, oblivious spray
HTSIM = {"all-to-all": {"UEC": (0.731, 0.946), "NDP": (0.758, 0.901)},
         "incast 15->1": {"UEC": (0.944, 0.941)},
         "incast 15->1, MTU 1500": {"UEC": (0.944, 0.941)},
         "perm shift-4": {"UEC": (0.360, 0.767), "NDP": (0.372, 0.740)},
         "perm random": {"UEC": (0.347, 0.797), "NDP": (0.400, 0.759)}}
TARGETS = {"all-to-all": "spray <= 1.07, retx <= 2 %, no timeouts; ECMP/spray 1.30 +-15 % (htsim UEC)",
           "incast 15->1": "<= 1.07; p99 queue <= 50 % of the buffer with a congestion control",
           "incast 15->1, MTU 1500": "<= 1.07; p99 queue <= 50 % of the buffer with a congestion control",
           "perm shift-4": "spray <= 1.05; ECMP/spray 2.0-3.0", "perm random": "spray <= 1.05; ECMP/spray 2.0-3.0"}


MTU = {"incast 15->1, MTU 1500": 1500}  # the others at the fabric's default, 9000


def fabric(name: str = "", ecn: bool = False):
    return topologies.build("ft2", leaves=4, hosts_per_leaf=4, spines=4, ecn=ecn, mtu=MTU.get(name, 9000))


def scenario(name: str, seed: int) -> list[Message]:
    f = fabric()
    hosts = f.hosts()
    if name == "all-to-all":
        return [Message(i, 0.0, s, d, 256 * KB) for i, (s, d) in
                enumerate((s, d) for s in hosts for d in hosts if s != d)]
    if name.startswith("incast 15->1"):
        return [Message(i, 0.0, s, hosts[0], 512 * KB) for i, s in enumerate(hosts[1:])]
    if name == "perm shift-4":
        return patterns.permutation(f, kind="shift", shift=4, size=2000 * KB, hosts=hosts)
    return patterns.permutation(f, kind="random", size=2000 * KB, hosts=hosts, seed=seed)


def one_run(name: str, cc: str, app: str, seed: int) -> dict:
    f = fabric(name, ecn=cc == "ecn")
    messages = scenario(name, seed)
    rundir = OUT / f"{name.replace(' ', '_').replace('>', '').replace(',', '')}-{cc}-{app}-{seed}"
    options = TransportOptions(cc=cc, entropy="spray" if app == "spray" else "fixed")
    m = run_job(f, messages, rundir, app=app, options=options, seed=seed, quiet=True)
    return {"ratio": m.completion_s / bounds.lower_bound_s(f, messages) if m.completion_s else float("inf"),
            "retx": m.packets.retransmits / max(1, m.packets.data), "timeouts": m.packets.timeouts,
            "queue": m.queues.get("p99_bytes", 0.0) / f.queue_bytes, "cpu_bound": m.fidelity.cpu_bound,
            "lost": m.lost_messages, "window": m.transport.window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    seeds = range(1, args.seeds + 1)
    red = features.detect().ecn_marking
    plugins = ["none", "rtt", "pull", *(["ecn"] if red else [])]
    print("plug-ins: " + ", ".join(plugins) + ("" if red else "; ecn skipped: this kernel has no RED qdisc to mark "
                                                              "with (switches cannot mark ECN)"))
    print("completion / lower bound, median (range) over seeds; retx: retransmissions / data packets; q p99: the "
          "p99 egress queue / the 128 KB buffer; htsim: its completion / ideal (1 / frac)")
    for name in HTSIM:
        print(f"\n== {name} (target: {TARGETS[name]})")
        sparse = feedback.sparsest(fabric(name), scenario(name, 1))
        if sparse:
            print(f"   {sparse.senders} senders share a receiver's downlink, whose queue holds "
                  f"{sparse.queue_packets:.1f} packets: each sees it {sparse.per_drain:.1f} times per drain")
        print(f"{'cc':>5} {'app':>6} {'window':>6} {'completion/bound':>18} {'retx':>6} {'timeouts':>8} "
              f"{'q p99':>6} {'lost':>4}  CPU-bound runs")
        medians = {}
        for cc in plugins:
            for app in ("ecmp", "spray"):
                runs = [one_run(name, cc, app, seed) for seed in seeds]
                medians[cc, app] = statistics.median(r["ratio"] for r in runs)
                print(f"{cc:>5} {app:>6} {runs[0]['window']:>6} {median_range([r['ratio'] for r in runs], '.2f'):>18} "
                      f"{statistics.median(r['retx'] for r in runs):6.1%} "
                      f"{statistics.median(r['timeouts'] for r in runs):8.0f} "
                      f"{statistics.median(r['queue'] for r in runs):6.0%} {sum(r['lost'] for r in runs):>4}  "
                      f"{sum(r['cpu_bound'] for r in runs)} of {len(runs)}")
        for cc in plugins:
            print(f"  ECMP/spray with {cc}: {medians[cc, 'ecmp'] / medians[cc, 'spray']:.2f}")
        for transport, (ecmp, spray) in HTSIM[name].items():
            print(f"  htsim {transport}: ECMP {1 / ecmp:.2f}, spray {1 / spray:.2f}, ECMP/spray {spray / ecmp:.2f}")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("congestion"):
        main()
