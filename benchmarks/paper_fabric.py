"""The paper's own fabric: 8 planes of a two-tier fat-tree, 8 nodes of 8 GPUs (64 GPUs; leaves = spines = 2 per
plane), cross-plane traffic over NVLink and a node-mate's NIC (PXN), with today's defaults but the link rate.

Per run: completion / lower bound (emulator.analysis.bounds), resent / data packets, timeouts split into lost and
spurious (the resend's ACK says duplicate), every packet accounted for (emulator.net.ledger: the place that lost
most, and what no counter explains) and the verdict: a CPU-BOUND or UNFAITHFUL run does not count toward a row.
Variants: spray, ECMP and REPS under the default transport (pull), and rtt beside it; medians (range) over seeds.

    sudo .venv/bin/python benchmarks/paper_fabric.py [--seeds 3] [--rates 10,2] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.net.ledger import PLACES
from emulator.run.job import run_job
from traffic import patterns
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-paper-fabric-"))
PAPER = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}
# app, cc, entropy, how the agents are scheduled (traffic.options: realtime by default)
VARIANTS = (("spray", "pull", "spray", "realtime"), ("ecmp", "pull", "fixed", "realtime"),
            ("spray", "pull", "reps", "realtime"), ("spray", "rtt", "spray", "realtime"),
            ("spray", "pull", "spray", "normal"))


def one_run(mbps: float, app: str, cc: str, entropy: str, scheduling: str, seed: int, size: int) -> dict:
    fabric = topologies.build("mpft", link_mbps=mbps, **PAPER)
    messages = patterns.all_to_all(fabric, size=size)
    m = run_job(fabric, messages, OUT / f"{mbps:g}-{app}-{cc}-{entropy}-{scheduling}-seed{seed}", app=app, seed=seed,
                quiet=True, options=TransportOptions(cc=cc, entropy=entropy, agent_scheduling=scheduling))
    f, p, acc = m.fidelity, m.packets, m.accounting
    lost = {place: n for place, n in acc["drops"].items() if n and place != "after_stop"}
    return {"ratio": m.completion_s / bounds.lower_bound_s(fabric, messages) if m.completion_s else float("inf"),
            "resent": p.retransmits / max(1, p.data), "timeout_lost": p.timeout_lost,
            "timeout_spurious": p.timeout_spurious, "sent": acc["sent"],
            "largest": max(lost, key=lost.__getitem__) if lost else "-", "dropped": sum(lost.values()),
            "unattributed": acc["unattributed"], "cpu_bound": f.cpu_bound, "unfaithful": f.unfaithful,
            "why": "; ".join(f.unfaithful_why), "idle": f.cpu_idle,
            "cores": (f.agents_cpu_s + f.switches_cpu_s) / m.completion_s if m.completion_s else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rates", default="10,2", help="link rates in Mbit/s, comma-separated")
    parser.add_argument("--quick", action="store_true", help="64 KiB per pair instead of the pattern's 256 KiB")
    args = parser.parse_args()
    size = 64 * 1024 if args.quick else 256 * 1024
    print(f"64-GPU 8-plane all-to-all ({size // 1024} KiB per pair): median (range) over seeds; resent / data "
          "packets; timeouts: resends whose original was lost / had arrived; dropped: packets of every kind the "
          "ledger counted lost, and where most; unattributed: what no counter explains")
    print("cores: the agents' and the switch daemons' CPU seconds per second of the run; agents: how they were "
          "scheduled")
    print(f"{'Mbit/s':>6} {'app':>5} {'cc':>4} {'entropy':>7} {'agents':>8} {'completion/bound':>17} {'resent':>7} "
          f"{'timeouts':>13} {'dropped':>8} {'most at':>22} {'unattr.':>7} {'idle':>5} {'cores':>5}  verdict")
    for mbps in (float(r) for r in args.rates.split(",")):
        for app, cc, entropy, scheduling in VARIANTS:
            runs = [one_run(mbps, app, cc, entropy, scheduling, seed, size) for seed in range(1, args.seeds + 1)]
            counted = [r for r in runs if not (r["cpu_bound"] or r["unfaithful"])]
            verdicts = (f"{sum(r['cpu_bound'] for r in runs)} CPU-BOUND, {sum(r['unfaithful'] for r in runs)} "
                        f"UNFAITHFUL of {len(runs)}")
            largest = statistics.mode(r["largest"] for r in runs)
            print(f"{mbps:>6g} {app:>5} {cc:>4} {entropy:>7} {scheduling:>8} "
                  f"{median_range([r['ratio'] for r in runs], '.2f'):>17} "
                  f"{statistics.median(r['resent'] for r in runs):7.1%} "
                  f"{statistics.median(r['timeout_lost'] for r in runs):>6.0f}/"
                  f"{statistics.median(r['timeout_spurious'] for r in runs):<6.0f} "
                  f"{statistics.median(r['dropped'] for r in runs):>8.0f} "
                  f"{PLACES.get(largest, largest)[:22]:>22} {max(r['unattributed'] for r in runs):>7} "
                  f"{min(r['idle'] for r in runs):5.0%} {statistics.median(r['cores'] for r in runs):5.2f}  "
                  f"{verdicts}; counted {len(counted)}")
            for r in runs:
                if r["why"]:
                    print(f"{'':>8}unfaithful: {r['why']}")
    print(f"(run directories under {OUT})")


if __name__ == "__main__":
    with recorded("paper-fabric"):
        main()
