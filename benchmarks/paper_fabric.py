"""The paper's own fabric: 8 planes of a two-tier fat-tree, 8 nodes of 8 GPUs (64 GPUs; leaves = spines = 2 per
plane), cross-plane traffic over NVLink and a node-mate's NIC (PXN), with today's defaults but the link rate, which
is the one --link-mbps auto chooses for each workload (emulator.run.autorate) unless --rates gives them.

Workloads: the all-to-all (spray, ECMP and REPS under the default transport, pull, and rtt beside it; REPS twice:
judging paths by their round trips, and by ECN marks, as REPS asks, with the switches marking); a random
permutation of large flows over all GPUs and one inside every plane (spray and ECMP); MoE dispatch and combine
(spray); the 128-GPU all-to-all (8 planes of 16 nodes, spray). Per run: completion / lower bound
(emulator.analysis.bounds), resent / data packets, timeouts split into lost and spurious (the resend's ACK says
duplicate), every packet accounted for (emulator.net.ledger: the place that lost most, and what no counter
explains), the cores auto predicted beside those the run used, and the verdict: a CPU-BOUND or UNFAITHFUL run does
not count toward a row. Medians (range) over seeds.

    sudo .venv/bin/python benchmarks/paper_fabric.py [--seeds 3] [--rates auto|2,4] [--quick] [--only NAME,...]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from results import median_range, recorded

from emulator.analysis import bounds
from emulator.model import topologies
from emulator.model.fabric import Fabric
from emulator.model.schedule import Message
from emulator.net.ledger import PLACES
from emulator.run import autorate
from emulator.run.job import run_job
from traffic import patterns
from traffic.options import TransportOptions

OUT = Path(tempfile.mkdtemp(prefix="mpft-bench-paper-fabric-"))
PAPER = {"planes": 8, "nodes": 8, "leaves": 2, "spines": 2}
# (app, cc, entropy, switches mark ECN): agents are scheduled realtime (the default). `normal` agents were
# measured beside realtime ones at 10 and 2 Mbit/s (10: 189 packets lost at the switch daemons' input against
# 111 k, but CPU-bound; 2: 1.08x both, CPU-bound both) and are left out.
SPRAY, ECMP, RTT = ("spray", "pull", "spray", False), ("ecmp", "pull", "fixed", False), ("spray", "rtt", "spray", False)
REPS, REPS_MARKS = ("spray", "pull", "reps", False), ("spray", "pull", "reps", True)


def in_plane_permutation(fabric: Fabric) -> list[Message]:
    """A random permutation inside every plane (GPU g of one node to GPU g of another): no PXN, so the fabric,
    not a forwarding node-mate's NIC, is what routing has to share out."""
    return patterns.mix(*(patterns.permutation(fabric, plane=p, seed=1 + p) for p in fabric.planes))


def workloads(quick: bool) -> list[tuple[str, dict, Callable[[Fabric], list[Message]], tuple]]:
    """(name, fabric parameters, schedule on the fabric, variants)."""
    a2a_size = 64 * 1024 if quick else 256 * 1024
    return [("all-to-all 64", PAPER, lambda f: patterns.all_to_all(f, size=a2a_size),
             (SPRAY, ECMP, REPS, REPS_MARKS, RTT)),
            ("permutation 64", PAPER, lambda f: patterns.permutation(f, seed=1), (SPRAY, ECMP)),
            ("in-plane perm.", PAPER, in_plane_permutation, (SPRAY, ECMP)),
            ("moe 64", PAPER, lambda f: patterns.moe(f, seed=1), (SPRAY,)),
            ("all-to-all 128", {**PAPER, "nodes": 16}, lambda f: patterns.all_to_all(f, size=a2a_size), (SPRAY,))]


def one_run(params: dict, schedule, mbps: float, variant: tuple, seed: int, predicted: dict | None) -> dict:
    app, cc, entropy, ecn = variant
    fabric = topologies.build("mpft", link_mbps=mbps, ecn=ecn, **params)
    messages = schedule(fabric)
    m = run_job(fabric, messages, OUT / f"{params['nodes'] * 8}-{mbps:g}-{app}-{cc}-{_entropy(variant)}-seed{seed}",
                app=app, seed=seed, quiet=True, options=TransportOptions(cc=cc, entropy=entropy),
                predicted=predicted if cc == "pull" else None)
    f, p, acc = m.fidelity, m.packets, m.accounting
    lost = {place: n for place, n in acc["drops"].items() if n and place != "after_stop"}
    used = (f.agents_cpu_s + f.switches_cpu_s) / m.completion_s if m.completion_s else 0.0
    bound, serial = bounds.lower_bound_s(fabric, messages), bounds.in_sequence_s(fabric, messages)
    return {"serial": m.completion_s / serial if serial > bound * (1 + 1e-9) and m.completion_s else None,
            "ratio": m.completion_s / bound if m.completion_s else float("inf"),
            "resent": p.retransmits / max(1, p.data), "timeout_lost": p.timeout_lost,
            "timeout_spurious": p.timeout_spurious, "sent": acc["sent"],
            "largest": max(lost, key=lost.__getitem__) if lost else "-", "dropped": sum(lost.values()),
            "unattributed": acc["unattributed"], "datagrams": p.datagrams_sent / max(1, p.data),
            "cpu_bound": f.cpu_bound, "unfaithful": f.unfaithful, "why": "; ".join(f.unfaithful_why),
            "idle": f.cpu_idle, "cores": used,
            "error": m.cpu_prediction["error"] if m.cpu_prediction else None, "verdict": f.verdict}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rates", default="auto", help="auto (each workload's), or link rates in Mbit/s, "
                        "comma-separated")
    parser.add_argument("--quick", action="store_true", help="64 KiB per all-to-all pair instead of 256 KiB")
    parser.add_argument("--only", help="these workloads only (names as printed, comma-separated)")
    args = parser.parse_args()
    print("8 planes, leaves = spines = 2 per plane; median (range) over seeds; resent / data packets; timeouts: "
          "resends whose original was lost / had arrived; dropped: packets of every kind the ledger counted lost, "
          "and where most; unattributed: what no counter explains; cores: the agents' and switch daemons' CPU "
          "seconds per second of the run, and auto's prediction's error against them (pull runs); dgrams: datagrams "
          "the agents sent (data, ACKs, requests, grants) per data packet")
    print(f"{'workload':<15} {'Mbit/s':>6} {'app':>5} {'cc':>4} {'entropy':>8} {'completion/bound':>17} "
          f"{'resent':>6} {'timeouts':>11} {'dropped':>7} {'most at':>20} {'unattr.':>7} {'idle':>4} "
          f"{'cores':>5} {'pred.':>5} {'dgrams':>6}  verdict")
    costs = autorate.load_costs().with_free_cores()
    for name, params, schedule, variants in workloads(args.quick):
        if args.only and name not in args.only.split(","):
            continue
        predicted = None
        if args.rates == "auto":
            chosen = autorate.choose(lambda mbps, params=params: topologies.build("mpft", link_mbps=mbps, **params),
                                     schedule(topologies.build("mpft", link_mbps=1, **params)), "pull", costs)
            rates, predicted = [chosen.mbps], autorate.as_record(chosen)
            print(f"{name}: auto chose {chosen.mbps:g} Mbit/s, predicted {chosen.cores:.2f} of {chosen.of_cores()} "
                  f"({chosen.share:.0%}), switch daemons' pressure {chosen.pressure:.1f} ({chosen.source} costs)")
        else:
            rates = [float(r) for r in args.rates.split(",")]
        for mbps in rates:
            for variant in variants:
                runs = [one_run(params, schedule, mbps, variant, seed, predicted)
                        for seed in range(1, args.seeds + 1)]
                _row(name, mbps, variant, runs)
    print(f"(run directories under {OUT})")


def _entropy(variant: tuple) -> str:
    """The entropy column: reps+ecn where the switches mark (REPS recycles the paths that came back unmarked)."""
    return variant[2] + ("+ecn" if variant[3] else "")


def _row(name: str, mbps: float, variant: tuple, runs: list[dict]) -> None:
    counted = [r for r in runs if not (r["cpu_bound"] or r["unfaithful"])]
    verdicts = (f"{sum(r['cpu_bound'] for r in runs)} CPU-BOUND, {sum(r['unfaithful'] for r in runs)} "
                f"UNFAITHFUL of {len(runs)}")
    largest = statistics.mode(r["largest"] for r in runs)
    errors = [r["error"] for r in runs if r["error"] is not None]
    print(f"{name:<15} {mbps:>6g} {variant[0]:>5} {variant[1]:>4} {_entropy(variant):>8} "
          f"{median_range([r['ratio'] for r in runs], '.2f'):>17} "
          f"{statistics.median(r['resent'] for r in runs):6.1%} "
          f"{statistics.median(r['timeout_lost'] for r in runs):>5.0f}/"
          f"{statistics.median(r['timeout_spurious'] for r in runs):<5.0f} "
          f"{statistics.median(r['dropped'] for r in runs):>7.0f} "
          f"{PLACES.get(largest, largest)[:20]:>20} {max(r['unattributed'] for r in runs):>7} "
          f"{min(r['idle'] for r in runs):4.0%} {statistics.median(r['cores'] for r in runs):5.2f} "
          f"{(f'{statistics.median(errors):+.0%}' if errors else '-'):>5} "
          f"{statistics.median(r['datagrams'] for r in runs):6.2f}  {verdicts}; counted {len(counted)}")
    serial = [r["serial"] for r in runs if r["serial"] is not None]
    if serial:
        print(f"{'':>8}against its dependency depths one after another (not a lower bound: bounds.in_sequence_s): "
              f"{median_range(serial, '.2f')}")
    for r in runs:
        if r["why"]:
            print(f"{'':>8}unfaithful: {r['why']}")


if __name__ == "__main__":
    with recorded("paper-fabric"):
        main()
