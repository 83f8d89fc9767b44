"""Routing around a slow link, side by side with htsim (../shared/HTSIM.md): the built-in `asymmetry` study (the
16-host leaf-spine with the leaf 0 - spine 0 link at 25 %; shift-4 permutation, 2 MB per host, and all-to-all,
250 kB per pair; ECMP, oblivious spray, REPS senders over ECMP's hashing, and the adaptive app with REPS senders):
symmetric, then with the link slowed both ways, then with only the spine -> leaf direction slowed (the hop a
leaf's own switch cannot see). The symmetric fabric also runs a seeded random permutation (a derangement, 2 MB per
host) under spray and adaptive, the issue's second symmetric permutation.
Completion is over the degraded fabric's min-max LP bound, as htsim's is; a CPU-bound run does not count.

    sudo .venv/bin/python benchmarks/asymmetry.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

from results import recorded

from emulator.study import report, scenario
from emulator.study.runner import run_study

# htsim (UEC transport, 5 seeds): completion / the (degraded) fabric's min-max bound; symmetric: 1 / frac
HTSIM = {("perm", "none"): {"ecmp": 1 / 0.360, "spray": 1 / 0.767, "switch AR": 1 / 0.901, "REPS": 1 / 0.778},
         ("a2a", "none"): {"ecmp": 1 / 0.731, "spray": 1 / 0.946, "switch AR": 1 / 0.946, "REPS": 1 / 0.946},
         ("perm", "both"): {"ecmp": 3.5, "spray": 2.9, "switch AR": 2.7, "REPS": 2.2},
         ("perm", "b_to_a"): {"ecmp": 3.0, "spray": 2.7, "switch AR": 2.7, "REPS": 2.0},
         ("a2a", "both"): {"ecmp": 3.6, "spray": 1.9, "switch AR": 1.5, "REPS": 1.4},
         ("a2a", "b_to_a"): {"ecmp": 3.0, "spray": 1.6, "switch AR": 1.5, "REPS": 1.3}}
GOAL = ("symmetric: adaptive <= 1.11x the bound and within 5 % of spray; slowed: adaptive <= 1.15x the LP bound, "
        "at least below htsim's REPS and >= 1.3x faster than ECMP")
TITLES = {"none": "symmetric (no link slowed)", "both": "p0l0-p0s0 at 25 %, slowed both ways",
          "b_to_a": "p0l0-p0s0 at 25 %, slowed spine -> leaf only"}


def _ratio(metrics, a: str, b: str) -> str:
    """a / b completion per seed: median (range)."""
    label = f"{a.split('-')[1]}/{b.split('-')[1]}"
    measured = metrics.ratio(a, b)
    return f"{label} {measured[0]:.2f} ({measured[1]:.2f}-{measured[2]:.2f})" if measured else f"{label} -"


def _to_bound(metrics, traffic: str, apps: tuple[str, ...]) -> str:
    """Each app's completion / the bound on `traffic`: median (range) over seeds."""
    cells = []
    for app in apps:
        v = metrics.variants[f"{traffic}-{app}"]
        if v.ratio_to_bound:
            low, high = v.range["ratio_to_bound"]
            cells.append(f"{app} {v.ratio_to_bound:.2f} ({low:.2f}-{high:.2f})")
        else:
            cells.append(f"{app} -")
    return ", ".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="mpft-bench-asymmetry-"))
    base = scenario.load("asymmetry")
    print(f"goal: {GOAL}")
    for direction in ("none", "both", "b_to_a"):
        faults = () if direction == "none" else tuple(dataclasses.replace(f, direction=direction)
                                                      for f in base.faults)
        study = dataclasses.replace(base, faults=faults, name=f"asymmetry-{direction}")
        metrics = run_study(study, out / direction, seeds=list(range(1, args.seeds + 1)))
        print(f"\n== {TITLES[direction]}")
        print(report.format_table(metrics))
        for traffic in ("perm", "a2a"):
            row = _to_bound(metrics, traffic, ("ecmp", "spray", "reps", "adaptive"))
            theirs = ", ".join(f"{k} {x:.1f}" for k, x in HTSIM[(traffic, direction)].items())
            speedup = "; ".join(_ratio(metrics, f"{traffic}-{a}", f"{traffic}-{b}")
                                for a, b in (("ecmp", "adaptive"), ("adaptive", "spray")))
            print(f"  {traffic}: ours / LP bound: {row}; {speedup}; htsim: {theirs}")
        print(f"  report: {out / direction / 'report.html'}")
        if direction == "none":
            random_permutation(base, out, args.seeds)


def random_permutation(base, out: Path, seeds: int) -> None:
    """The shift-4 permutation's spray and adaptive variants on a seeded random derangement instead."""
    perm = base.traffic[0]
    study = dataclasses.replace(
        base, faults=(), name="asymmetry-random",
        traffic=(dataclasses.replace(perm, params={**perm.params, "kind": "random"}),),
        variants=tuple(v for v in base.variants if v.name in ("perm-spray", "perm-adaptive")))
    metrics = run_study(study, out / "random", seeds=list(range(1, seeds + 1)))
    row = _to_bound(metrics, "perm", ("spray", "adaptive"))
    verdict = metrics.fidelity.verdict if metrics.fidelity else "no fidelity verdict"
    print(f"  random perm: ours / LP bound: {row}; {_ratio(metrics, 'perm-adaptive', 'perm-spray')}; {verdict}")


if __name__ == "__main__":
    with recorded("asymmetry"):
        main()
